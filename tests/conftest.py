"""Shared fixtures. Tests run against real PostgreSQL, started by pgscope's own embedded target."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgscope.proc import server_account
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import PgBinaries, find_binaries

DATA = Path(__file__).parent / "data"
# Headless Chromium as this machine allows it: no sandbox as root, no network (its background
# connections would only be refused), a fresh profile each time.
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
SMALL_SERVER = {"shared_buffers": "128MB", "max_wal_size": "1GB"}

# Every process this test session starts inherits this marker in its environment, and every
# cluster directory lands in this session's own TMPDIR: the leftover check below then sees
# exactly what the suite started, even when other suites run on the same host.
SESSION_MARK = f"pgscope-tests-{uuid.uuid4().hex}"
os.environ["PGSCOPE_TEST_SESSION"] = SESSION_MARK
SESSION_TMP = Path(tempfile.mkdtemp(prefix="pgscope-tests-"))
os.chmod(SESSION_TMP, 0o755)  # the server's unprivileged account must reach its cluster
os.environ["TMPDIR"] = str(SESSION_TMP)
tempfile.tempdir = None  # re-read TMPDIR


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


def start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """The real CLI in the background, its stderr to read line by line (see wait_for_line)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pgscope", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def wait_for_line(proc: subprocess.Popen[str], pattern: str, timeout: float = 180) -> list[str]:
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if re.search(pattern, line):
            return seen
    proc.kill()  # never left running behind a failed test
    raise AssertionError(f"no line matching {pattern!r} in: {seen}")


def stop_within(proc: subprocess.Popen[str], sig: signal.Signals, seconds: float = 10) -> str:
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=seconds + 5)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"no exit within {seconds} s of {sig.name}") from None
    assert time.monotonic() - sent < seconds, "slower than promised"
    return err


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
    """Cluster directories in this session's TMPDIR."""
    return {p.name for p in SESSION_TMP.glob("pgscope-*")}


def server_processes() -> set[int]:
    """PIDs of live processes started by this test session (they carry its marker)."""
    needle = f"PGSCOPE_TEST_SESSION={SESSION_MARK}".encode()
    pids = set()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        pid = int(environ.parent.name)
        if pid == os.getpid():
            continue
        try:
            if needle in environ.read_bytes():
                stat = (environ.parent / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":  # zombies are already dead
                    pids.add(pid)
        except OSError:
            continue
    return pids


def describe(pids: set[int]) -> list[str]:
    out = []
    for pid in sorted(pids):
        try:
            out.append(f"{pid}: {Path(f'/proc/{pid}/cmdline').read_bytes()!r}")
        except OSError:
            out.append(f"{pid}: gone")
    return out


@pytest.fixture(scope="session", autouse=True)
def no_leftovers() -> Iterator[None]:
    """After the whole suite: no process and no cluster directory that the suite made."""
    yield
    deadline = time.monotonic() + 15
    while True:
        left_procs = server_processes()
        left_dirs = pgscope_temp_dirs()
        if not (left_procs or left_dirs) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    shutil.rmtree(SESSION_TMP, ignore_errors=True)
    assert not left_procs, f"processes left behind by the suite: {describe(left_procs)}"
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


FACTS = DATA / "facts"


def run_doc(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON document of a run that must have succeeded, every step of it."""
    assert result.returncode == 0, result.stderr[-3000:]
    doc: dict[str, Any] = json.loads(result.stdout)
    assert all(s["status"] == "ok" for s in doc["steps"]), doc["steps"]
    return doc


def diagnosis(doc: dict[str, Any], case: str, expected: str) -> dict[str, Any]:
    """The run's diagnosis. With PGSCOPE_RECORD_FACTS=1, also records the run's facts as the
    fixture tests/test_diagnose.py replays (tests/data/facts/<case>.json)."""
    if os.environ.get("PGSCOPE_RECORD_FACTS"):
        FACTS.mkdir(parents=True, exist_ok=True)
        (FACTS / f"{case}.json").write_text(
            json.dumps(
                {
                    "case": case,
                    "expected_top": expected,
                    "recorded_from": doc["command_line"],
                    "sheets": doc["facts"],
                },
                indent=1,
            )
            + "\n"
        )
    return dict(doc["diagnosis"])


def top_finding(diag: dict[str, Any]) -> str:
    assert diag["findings"], diag
    return str(diag["findings"][0]["id"])
