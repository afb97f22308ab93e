"""It must show (issue 5, item 4): without root or without perf/bpftrace, runs complete and
the collectors table says profiling was unavailable and why; `pgscope profile`, which has
nothing else to do, fails with one line and the environment exit code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgscope.target.embedded import EmbeddedCluster
from pgscope.target.pgbin import PgBinaries
from tests.cli import one_line_error, pgscope
from tests.suite import SESSION_TMP

ROOT = Path(__file__).parent.parent
SITE = (
    Path(sys.executable).parent.parent
    / "lib"
    / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    / "site-packages"
)
SYSTEM_PYTHON = Path("/usr/bin/python3")
pytestmark = pytest.mark.server  # each test starts a server, as a user without the tools
SHORT_RUN = ("--clients", "1", "--duration", "1", "--warmup", "0", "--repeats", "1", "--scale", "1")


def _system_python_matches() -> bool:
    """The venv's interpreter lives under /root (0700 here); the unprivileged account runs
    the same code with Debian's python3 of the same minor version and the venv's packages."""
    if not SYSTEM_PYTHON.exists():
        return False
    out = subprocess.run(
        [str(SYSTEM_PYTHON), "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() == str(tuple(sys.version_info[:2]))


as_postgres = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("runuser") is None or not _system_python_matches(),
    reason="needs root (to switch to the postgres account), runuser and a system python3 "
    "of the venv's version",
)


def run_as_postgres(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "runuser", "-u", "postgres", "--",
            "env", f"PYTHONPATH={ROOT / 'src'}:{SITE}",
            str(SYSTEM_PYTHON), "-m", "pgscope", *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )  # fmt: skip


@pytest.fixture
def postgres_dir() -> Iterator[Path]:
    """A directory the postgres account owns and can reach (pytest's are root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="perf-unavailable-", dir=SESSION_TMP))
    shutil.chown(path, "postgres", "postgres")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def collectors_of(document: dict[str, object]) -> dict[str, tuple[bool, str, str]]:
    # A run's document keeps them with its environment; `profile`'s at its top.
    environment = document.get("environment")
    rows = environment["collectors"] if isinstance(environment, dict) else document["collectors"]
    assert isinstance(rows, list)
    return {r["name"]: (r["available"], r["reason"], r["status"]) for r in rows}


@as_postgres
def test_a_run_without_root_completes_and_says_why(postgres_dir: Path) -> None:
    work = postgres_dir
    result = run_as_postgres(
        "run", *SHORT_RUN, "--collectors", "perf,offcpu",
        "--results-dir", str(work / "results"), "--work-dir", str(work), "--json",
        cwd=work,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    document = json.loads(result.stdout)
    assert document["status"] == "complete"
    assert collectors_of(document) == {
        "perf": (False, "perf profiles of the server's processes need root (run as root)", "off"),
        "offcpu": (
            False,
            "bpftrace profiles of the server's processes need root (run as root)",
            "off",
        ),
    }
    assert "collector perf unavailable: perf profiles of the server's processes need root" in (
        result.stderr
    )


@as_postgres
def test_profile_without_root_fails_in_one_line(
    cluster: EmbeddedCluster, postgres_dir: Path
) -> None:
    work = postgres_dir
    result = run_as_postgres(
        "profile", "--data-dir", str(cluster.data_dir), "--duration", "1", "--off-cpu",
        "--results-dir", str(work / "results"),
        cwd=work,
    )  # fmt: skip
    assert result.returncode == 4, result.stderr
    line = one_line_error(result)
    assert "perf: perf profiles of the server's processes need root" in line, line
    assert "offcpu: bpftrace profiles of the server's processes need root" in line, line


@pytest.mark.skipif(os.geteuid() != 0, reason="the PATH case is about root without the tools")
def test_a_run_without_perf_or_bpftrace_in_path_completes_and_says_why(
    pg: PgBinaries, tmp_path: Path
) -> None:
    # Only PostgreSQL's own directory: no perf, no bpftrace.
    env = {"PATH": str(pg.bindir)}
    result = pgscope(
        "run", *SHORT_RUN, "--collectors", "perf,offcpu",
        "--results-dir", str(tmp_path), "--json",
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    document = json.loads(result.stdout)
    assert document["status"] == "complete"
    assert collectors_of(document) == {
        "perf": (False, "perf not found in PATH (apt-get install linux-perf)", "off"),
        "offcpu": (False, "bpftrace not found in PATH (apt-get install bpftrace)", "off"),
    }
    (run_dir,) = tmp_path.iterdir()
    assert not (run_dir / "collectors").exists() or not any((run_dir / "collectors").iterdir())
