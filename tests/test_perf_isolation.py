"""Profiles hold the target cluster's processes only, including backends forked after the
recording started, and never another cluster's, even one under the same load on the same host.

The PIDs the collectors stored (`profile_processes`) are checked against the two clusters'
process trees, polled while the load runs and completed by perf's own fork records.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgscope.proc import child_pids, server_account
from pgscope.session import SessionTarget, collect
from pgscope.store import RunStore
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.local import LocalServer
from pgscope.target.pgbin import PgBinaries
from tests.servers import SMALL_SERVER
from tests.test_flame_profile_cli import pgbench_argv

FORK = re.compile(r"PERF_RECORD_FORK\((?P<child>\d+):\d+\):\((?P<parent>\d+):\d+\)")

pytestmark = [
    pytest.mark.server,
    pytest.mark.tracing,
    pytest.mark.load,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("perf") is None or shutil.which("bpftrace") is None,
        reason="profiles need root, perf and bpftrace",
    ),
]


class TreeWatcher:
    """Every PID that is a cluster's postmaster or one of its children, polled at 10 Hz."""

    def __init__(self, postmaster: int) -> None:
        self.postmaster = postmaster
        self.pids: set[int] = {postmaster}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._done.wait(0.1):
            self.pids.update(child_pids(self.postmaster))

    def stop(self) -> set[int]:
        self._done.set()
        self._thread.join(5)
        return self.pids


@pytest.fixture
def other_cluster(pg: PgBinaries, tmp_path: Path) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(
        pg, server_account(None), tmp_path / "other.log", {**benchmark_defaults(8), **SMALL_SERVER}
    ) as running:
        yield running


def start_load(pg: PgBinaries, cluster: EmbeddedCluster, seconds: int) -> subprocess.Popen[bytes]:
    subprocess.run(
        pgbench_argv(pg, cluster, "-i", "-s", "1", "-q"), check=True, capture_output=True
    )
    return subprocess.Popen(
        pgbench_argv(pg, cluster, "-S", "-c", "2", "-j", "1", "-T", str(seconds)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("attach", ["system", "process"])
def test_profiles_hold_only_the_target_clusters_processes(
    attach: str,
    pg: PgBinaries,
    cluster: EmbeddedCluster,
    other_cluster: EmbeddedCluster,
    tmp_path: Path,
) -> None:
    assert cluster.postmaster_pid is not None and other_cluster.postmaster_pid is not None
    target = TreeWatcher(cluster.postmaster_pid)
    other = TreeWatcher(other_cluster.postmaster_pid)
    other_load = start_load(pg, other_cluster, 30)
    local = LocalServer.from_data_dir(cluster.data_dir)
    # The target's load starts after the recordings: its backends are forked while profiled.
    delayed: list[subprocess.Popen[bytes]] = []
    subprocess.run(
        pgbench_argv(pg, cluster, "-i", "-s", "1", "-q"), check=True, capture_output=True
    )

    def load_once_recording(elapsed: float) -> None:
        # Counted from the collectors' start, not the test's: however long perf and bpftrace
        # took to attach, the load begins 2 s into the 10 s recorded and ends inside it.
        if elapsed >= 2 and not delayed:
            delayed.append(
                subprocess.Popen(
                    pgbench_argv(pg, cluster, "-S", "-c", "2", "-j", "1", "-T", "4"),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    try:
        result = collect(
            name="profile",
            selection={
                "perf": {"keep_data": True, "attach": attach},
                "offcpu": {"keep_output": True},
            },
            target=SessionTarget(None, local),
            pg=pg,
            duration_s=10,
            results_dir=tmp_path,
            command_line="test",
            say=lambda _: None,
            every_second=load_once_recording,
        )
    finally:
        for proc in [other_load, *delayed]:
            proc.terminate()
            proc.wait(10)
    target_pids, other_pids = target.stop(), other.stop()
    assert result.status == "complete" and not result.collectors_failed, result

    artifacts = result.run_dir / "collectors"
    perf_data = artifacts / "perf-session.data"
    # attach=system samples every CPU and keeps the cluster's process tree (the raw recording
    # holds the whole host); attach=process samples only the cluster. Both have perf's fork
    # records.
    script = subprocess.run(
        ["perf", "script", "-i", str(perf_data), "-F", "pid", "--show-task-events"],
        capture_output=True,
        text=True,
        check=True,
    )
    for line in script.stdout.splitlines():
        fork = FORK.search(line)
        # A backend too short-lived for the 10 Hz watcher (pgbench's first connection):
        # perf's own fork record says who forked it.
        if fork is not None and int(fork["parent"]) in target_pids:
            target_pids.add(int(fork["child"]))
    store = RunStore.open(result.run_dir)
    try:
        profiled = store.query("SELECT kind, pid, role, value FROM profile_processes")
        by_role = store.query(
            "SELECT kind, role, sum(value) AS value FROM profile_stacks GROUP BY ALL"
        )
    finally:
        store.close()
    perf_pids = {r["pid"] for r in profiled if r["kind"] == "cpu"}
    offcpu_pids = {r["pid"] for r in profiled if r["kind"] == "offcpu"}
    raw_offcpu_pids: set[int] = set()
    for line in (artifacts / "offcpu-session.json").read_text().splitlines():
        if line.strip() and json.loads(line)["type"] == "map":
            keys = json.loads(line)["data"]["@offcpu_us"]
            raw_offcpu_pids.update(int(key.split(",", 1)[0]) for key in keys)
    assert offcpu_pids == raw_offcpu_pids  # offcpu.bt filters in the kernel already

    new_backends = target_pids - set(child_pids(cluster.postmaster_pid)) - {cluster.postmaster_pid}
    assert new_backends, "the delayed load should have forked backends"
    for name, pids in (("perf", perf_pids), ("offcpu", offcpu_pids)):
        assert pids, f"{name}: no samples at all"
        assert pids <= target_pids, f"{name}: PIDs outside the target cluster: {pids - target_pids}"
        assert not pids & other_pids, f"{name}: the other cluster's PIDs: {pids & other_pids}"
        assert pids & new_backends, f"{name}: backends forked during the recording are missing"

    for kind in ("cpu", "offcpu"):
        values = {r["role"]: r["value"] for r in by_role if r["kind"] == kind}
        assert "backend" in values, values
        # Roles come from process titles polled at 2 Hz; a connection shorter than that
        # with a stack that says nothing (libc without frame pointers) stays "unknown".
        assert values.get("unknown", 0) < 0.02 * sum(values.values()), (kind, values)
