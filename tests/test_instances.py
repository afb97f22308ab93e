"""Clusters side by side (pgscope.instances) and CPU pinning (pgscope.cpus) in real runs."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import duckdb
import pytest

from pgscope.runner.instances import split_clients
from tests.cli import one_line_error, pgscope, start, stop_within, wait_for_line
from tests.poll import wait_until
from tests.suite import (
    pgscope_temp_dirs,
    server_processes,
    wait_for_nothing_left,
    wait_for_programs,
)

SPEC = """
workload = "select-only"
scale = 1
clients = [2, 4]
duration = 2
warmup = 0
repeats = 1
order = "sequential"
[settings]
shared_buffers = "128MB"
[variants]
one = {}
two = {"pgscope.instances" = 2}
[collectors]
"""


def test_split_clients_is_even() -> None:
    assert split_clients(8, 3) == [3, 3, 2]
    assert split_clients(4, 2) == [2, 2]
    assert sum(split_clients(7, 4)) == 7


@pytest.mark.server
def test_two_instances_split_the_load_and_are_torn_down(tmp_path: Path) -> None:
    spec = tmp_path / "instances.toml"
    spec.write_text(SPEC)
    result = pgscope("run", str(spec), "--json", "--results-dir", str(tmp_path / "r"))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    run_dir = Path(doc["run_dir"])
    assert (run_dir / "server-2.log").is_file()
    db = duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)
    try:
        shares = db.execute(
            "SELECT s.clients, list(i.clients ORDER BY i.instance), "
            "sum(i.pgbench_tps), any_value(s.pgbench_tps) FROM step_instances i "
            "JOIN steps s USING (step_id) GROUP BY s.clients ORDER BY 1"
        ).fetchall()
        per_instance = db.execute(
            "SELECT s.variant, count(DISTINCT t.instance) FROM timeline t "
            "JOIN steps s USING (step_id) GROUP BY 1 ORDER BY 1"
        ).fetchall()
    finally:
        db.close()
    assert [(c, split) for c, split, _, _ in shares] == [(2, [1, 1]), (4, [2, 2])]
    for _, _, instance_sum, total in shares:
        assert instance_sum == pytest.approx(total), "a step's tps is its instances' sum"
    assert per_instance == [("one", 1), ("two", 2)]
    assert all(s["status"] == "ok" and s["tps"] > 0 for s in doc["steps"])


def test_too_few_clients_for_the_instances(tmp_path: Path) -> None:
    spec = tmp_path / "instances.toml"
    spec.write_text(SPEC.replace("clients = [2, 4]", "clients = [1, 2]"))
    result = pgscope("run", str(spec), "--results-dir", str(tmp_path / "r"))
    assert result.returncode == 3
    assert "splits the load over 2 instances but a step has only 1 client" in one_line_error(result)


@pytest.mark.server
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs 2 usable CPUs")
def test_pinned_variants_record_their_cpus(tmp_path: Path) -> None:
    spec = tmp_path / "cpus.toml"
    spec.write_text(SPEC.replace('two = {"pgscope.instances" = 2}', 'two = {"pgscope.cpus" = 1}'))
    result = pgscope("run", str(spec), "--json", "--results-dir", str(tmp_path / "r"))
    assert result.returncode == 0, result.stderr
    run_dir = Path(json.loads(result.stdout)["run_dir"])
    db = duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)
    try:
        pins = [
            d
            for (d,) in db.execute(
                "SELECT detail FROM events WHERE kind = 'pin' ORDER BY ts_us"
            ).fetchall()
        ]
    finally:
        db.close()
    first = min(os.sched_getaffinity(0))
    assert pins[0].startswith(f"server on CPUs [{first}], pgbench on [")


def test_pinning_more_cpus_than_the_host_has_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "cpus.toml"
    spec.write_text(SPEC.replace('two = {"pgscope.instances" = 2}', 'two = {"pgscope.cpus" = 999}'))
    result = pgscope("run", str(spec), "--results-dir", str(tmp_path / "r"))
    assert result.returncode == 4
    assert "pins the server to 999 CPUs but this host lets pgscope use" in one_line_error(result)


@pytest.mark.server
def test_ctrl_c_with_two_instances_running_leaves_nothing(tmp_path: Path) -> None:
    """Issue 6, item 3: the second cluster a variant starts is gone after Ctrl-C too."""
    spec = tmp_path / "instances.toml"
    spec.write_text(
        SPEC.replace("clients = [2, 4]", "clients = [2]")
        .replace("duration = 2", "duration = 30")
        .replace("one = {}\n", "")
    )
    before_procs, before_dirs = server_processes(), pgscope_temp_dirs()
    proc = start(["run", str(spec), "--results-dir", str(tmp_path / "r")])
    wait_for_line(proc, "starting instance 2")
    # Initialised, and the step's load running on both.
    running = wait_for_programs(before_procs, {"pgbench", "postgres"})

    def clusters() -> set[str]:  # pgbench's working folder is not a server's
        return {d for d in pgscope_temp_dirs() - before_dirs if not d.startswith("pgscope-load-")}

    assert len(wait_until(lambda: c if len(c := clusters()) >= 2 else None, "two clusters")) == 2
    err = stop_within(proc, signal.SIGINT)
    assert proc.returncode == 130, err
    assert running
    wait_for_nothing_left(before_procs, before_dirs)  # no instance or pgbench left
