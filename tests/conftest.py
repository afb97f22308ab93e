"""Shared fixtures. Tests run against real PostgreSQL, started by pgscope's own embedded target."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgscope.proc import server_account
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import PgBinaries, find_binaries

DATA = Path(__file__).parent / "data"
SMALL_SERVER = {"shared_buffers": "128MB", "max_wal_size": "1GB"}


def pgscope(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "pgscope", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The error a user sees: exactly one line on stderr, never a traceback."""
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    assert lines, f"no error message; stdout: {result.stdout[-500:]}"
    last = lines[-1]
    assert last.startswith("pgscope: error: "), result.stderr
    assert sum(1 for ln in lines if ln.startswith("pgscope: error")) == 1, result.stderr
    return last


@pytest.fixture(scope="session")
def pg() -> PgBinaries:
    return find_binaries()


def pgscope_temp_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("pgscope-*")}


def server_processes() -> set[int]:
    """PIDs of postgres, pgbench, bpftrace and perf processes on the host."""
    out = subprocess.run(["ps", "-eo", "pid=,comm="], capture_output=True, text=True).stdout
    pids = set()
    for line in out.splitlines():
        pid, _, comm = line.strip().partition(" ")
        if comm.strip() in {"postgres", "pgbench", "bpftrace", "perf"}:
            pids.add(int(pid))
    return pids


@pytest.fixture(scope="session", autouse=True)
def no_leftovers() -> Iterator[None]:
    """After the whole suite: no server process and no cluster directory that the suite made."""
    before_procs, before_dirs = server_processes(), pgscope_temp_dirs()
    yield
    import time

    deadline = time.monotonic() + 15
    while True:
        left_procs = server_processes() - before_procs
        left_dirs = pgscope_temp_dirs() - before_dirs
        if not (left_procs or left_dirs) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left_procs, f"processes left behind by the suite: {sorted(left_procs)}"
    assert not left_dirs, f"cluster directories left behind by the suite: {sorted(left_dirs)}"


@pytest.fixture
def cluster(pg: PgBinaries, tmp_path: Path) -> Iterator[EmbeddedCluster]:
    """A fresh small embedded cluster for one test."""
    with EmbeddedCluster(
        pg,
        server_account(None),
        tmp_path / "server.log",
        {**benchmark_defaults(16), **SMALL_SERVER},
    ) as running:
        yield running


@pytest.fixture(scope="module")
def shared_cluster(
    pg: PgBinaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmbeddedCluster]:
    """One cluster for a module whose tests do not change its settings."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    with EmbeddedCluster(
        pg, server_account(None), log, {**benchmark_defaults(16), **SMALL_SERVER}
    ) as running:
        yield running
