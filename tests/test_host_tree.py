"""The server's CPU is the target's own process tree (issue 30: "CPU used by the cluster"
counted every process of the `postgres` account, 65-85% there from other clusters): two
clusters of one account on this host, one loaded by pgbench, each observed at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from pgscope.collect.statistics.host import _processes, process_tree
from pgscope.proc import server_account
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import PgBinaries
from tests.cli import start
from tests.poll import wait_until
from tests.servers import SMALL_SERVER


def test_a_process_tree_is_its_root_and_every_descendant() -> None:
    """On this host's real processes: a child and its grandchild are in this process's tree,
    this process's parent is not."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import subprocess; subprocess.run(['sleep', '30'])"]
    )
    try:
        grandchild = wait_until(
            lambda: next((pid for pid, p in _processes().items() if p.parent == child.pid), None),
            "the child's child",
        )
        tree = process_tree(_processes(), {os.getpid()})
        assert {os.getpid(), child.pid, grandchild} <= tree
        assert os.getppid() not in tree
    finally:
        child.kill()
        child.wait()


def _host_shares(run_dir: Path) -> dict[str, float]:
    db = duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)
    try:
        row = db.execute(
            "SELECT avg(server_share), avg(other_share), count(*) FROM host_cpu"
        ).fetchone()
    finally:
        db.close()
    assert row is not None and row[2] >= 3, row
    return {"server": float(row[0]), "other": float(row[1])}


@pytest.mark.server
def test_the_servers_cpu_is_its_own_process_tree(
    pg: PgBinaries, cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    with EmbeddedCluster(
        pg,
        server_account(None),
        tmp_path / "loaded.log",
        {**benchmark_defaults(16), **SMALL_SERVER},
    ) as loaded:
        subprocess.run(
            [str(pg.path("pgbench")), "-i", "-s", "1", "-q", loaded.conn.conninfo()],
            check=True,
            capture_output=True,
        )
        load = subprocess.Popen(
            [
                *(str(pg.path("pgbench")), "-n", "-S", "-c", "2", "-j", "2", "-T", "16"),
                loaded.conn.conninfo(),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            with loaded.connect() as session:
                wait_until(
                    lambda: session.execute(
                        "SELECT count(*) = 2 FROM pg_stat_activity "
                        "WHERE application_name = 'pgbench' AND state IS NOT NULL"
                    ).fetchone()[0],  # type: ignore[index]
                    "pgbench's clients",
                )
            # Both at once (each its own `pgscope observe` process), while the load runs.
            watchers = {
                name: start(
                    [
                        *("observe", "--data-dir", str(target.data_dir), "--duration", "6"),
                        *("--window", "3", "--results-dir", str(tmp_path / name)),
                    ]
                )
                for name, target in (("idle", cluster), ("loaded", loaded))
            }
            for name, watcher in watchers.items():
                _, err = watcher.communicate(timeout=120)
                assert watcher.returncode == 0, (name, err[-2000:])
        finally:
            load.terminate()
            load.wait()
    [idle_run] = (tmp_path / "idle").iterdir()
    [loaded_run] = (tmp_path / "loaded").iterdir()
    idle, busy = _host_shares(idle_run), _host_shares(loaded_run)
    print(f"idle cluster: {idle}; loaded cluster: {busy}")
    # The idle cluster's server is its own few idle processes; the loaded one's CPU is
    # another process's to it.
    assert idle["server"] < 0.05, idle
    assert idle["other"] > 0.15, idle
    assert busy["server"] > 0.15, busy
    assert busy["server"] > 5 * idle["server"], (idle, busy)
