"""Shared fixtures. Tests run against real PostgreSQL, started by pgscope's own embedded target."""

from __future__ import annotations

import contextlib
import json
import locale
import os
import re
import select
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

from pgscope.drive.loaduser import LoadUser, load_account
from pgscope.proc import server_account
from pgscope.target.embedded import (
    NO_SERVER_ENV,
    TEMPLATES_ENV,
    EmbeddedCluster,
    ServerForbidden,
    benchmark_defaults,
)
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
# A developer's own server must not become every run's target (`run` reads it as --dsn).
os.environ.pop("PGSCOPE_DSN", None)
tempfile.tempdir = None  # re-read TMPDIR
# One initdb for the whole session: every embedded cluster, in this process or in a CLI
# child, starts from a copy of it (src/pgscope/target/embedded.py).
os.environ[TEMPLATES_ENV] = str(SESSION_TMP / "initdb-templates")


# -- tiers ----------------------------------------------------------------------------------
# Markers say what a test needs (pyproject.toml registers them): `server` starts PostgreSQL,
# `tracing` needs root with bpftrace or perf, `load` drives real load for more than a few
# seconds (and so starts a server too). A test without a marker needs none of them; `make
# test-fast` runs those. Tests that use a fixture that starts a server (this file's, or a
# module's own) are marked here, the others in their module.
SERVER_FIXTURES = {
    *("cluster", "shared_cluster", "reference_run"),
    *("sweep", "pgws_cluster", "other_cluster"),  # test_report, test_activity, test_usdt
    *("logging_run", "syncrep_run", "checkpoint_run", "cpus_run"),  # test_recipes
    *("pg_version", "pg_newer"),  # every version's tests start that version's server
}
SERVER_PROGRAMS = {"postgres", "initdb", "pg_ctl", "pgbench", "pg_basebackup"}
TRACING_PROGRAMS = {"bpftrace", "perf"}
QUERIES = {"--version", "-V", "--info"}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        uses = set(getattr(item, "fixturenames", ()))
        if (uses & SERVER_FIXTURES or item.get_closest_marker("load")) and not (
            item.get_closest_marker("server")
        ):
            item.add_marker(pytest.mark.server)


def pytest_collection_finish(session: pytest.Session) -> None:
    """A selection with no `server` test (`make test-fast`) may start none: every embedded
    cluster (here or in a CLI child) and every server program started from this process then
    fails loudly, so a test that needs a server and lacks its marker shows. Likewise the
    tracing programs when no `tracing` test is selected."""
    marked = {
        m for item in session.items for m in ("server", "tracing") if item.get_closest_marker(m)
    }
    forbidden = set()
    if "server" not in marked:
        os.environ[NO_SERVER_ENV] = "no test of this selection is marked `server` (mark it)"
        forbidden |= SERVER_PROGRAMS
    if "tracing" not in marked:
        forbidden |= TRACING_PROGRAMS
    if forbidden:
        _refuse_programs(forbidden)


def _refuse_programs(names: set[str]) -> None:
    """Make subprocess.Popen refuse `names` in this process (what-are-you queries excepted:
    doctor and the collectors' checks ask for versions)."""
    real_init = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        argv = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
        words = [os.fsdecode(a) for a in argv]
        if kwargs.get("shell") and words:
            words = words[0].split()
        if words and Path(words[0]).name in names and not set(words[1:]) <= QUERIES:
            raise ServerForbidden(
                f"{words[0]} started by a test that is not marked for it "
                f"(server: PostgreSQL programs; tracing: bpftrace, perf)"
            )
        real_init(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = guarded  # type: ignore[method-assign]


# -- the CLI, as a user runs it ---------------------------------------------------------------
# `python -m pgscope` spends a second importing before it does anything, and the suite runs it
# about a hundred times. A zygote imports pgscope once; each call is a fork of it that becomes
# `python -m pgscope ARGS`: its own process, environment, working directory, stdin /dev/null,
# stdout and stderr to files, its exit status as the interpreter's. PGSCOPE_TEST_ZYGOTE=0
# runs `python -m pgscope` instead.
ZYGOTE = r"""
import ctypes, json, os, pkgutil, importlib, runpy, signal, sys, tempfile
ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # gone with the test session
import pgscope
for found in pkgutil.walk_packages(pgscope.__path__, "pgscope.", onerror=lambda name: None):
    if not found.name.endswith("__main__"):
        try:
            importlib.import_module(found.name)
        except Exception:
            pass  # the fork imports it again, and fails as `python -m pgscope` would

def become(request, replies):
    replies.close()
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, request["out"]), (2, request["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    os.closerange(3, 256)
    sys.stdin = open(0, closefd=False)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None
    sys.argv = ["-m", *request["args"]]
    runpy.run_module("pgscope", run_name="__main__", alter_sys=True)  # raises SystemExit

replies = os.fdopen(os.dup(1), "w", buffering=1)
for line in sys.stdin:
    request = json.loads(line)
    child = os.fork()
    if child == 0:
        become(request, replies)
        sys.exit(0)
    replies.write(f"{child}\n")
    replies.write(f"{os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])}\n")
"""


class Zygote:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self.pending = b""

    def _line(self, deadline: float | None) -> str | None:
        assert self.proc.stdout is not None
        while b"\n" not in self.pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"the CLI zygote exited ({self.proc.wait()})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode()

    def run(
        self, args: list[str], env: dict[str, str], cwd: Path | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        assert self.proc.stdin is not None
        with tempfile.TemporaryDirectory(prefix="cli-") as tmp:
            out, err = Path(tmp, "out"), Path(tmp, "err")
            request = {"args": args, "env": env, "cwd": str(cwd or Path.cwd())}
            self.proc.stdin.write(
                json.dumps({**request, "out": str(out), "err": str(err)}).encode()
            )
            self.proc.stdin.write(b"\n")
            self.proc.stdin.flush()
            pid = int(self._line(None) or 0)
            code = self._line(time.monotonic() + timeout)
            argv = [sys.executable, "-m", "pgscope", *args]
            if code is None:
                os.kill(pid, signal.SIGKILL)
                self._line(None)
                raise subprocess.TimeoutExpired(argv, timeout, _read(out), _read(err))
            return subprocess.CompletedProcess(argv, int(code), _read(out), _read(err))

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _read(path: Path) -> str:
    with path.open(encoding=locale.getpreferredencoding(False)) as f:  # as text=True reads
        return f.read()


_zygote: Zygote | None = None


def pgscope(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a process of its own, as a user would."""
    full_env = {**os.environ, **(env or {})}
    if os.environ.get("PGSCOPE_TEST_ZYGOTE") == "0":
        return subprocess.run(
            [sys.executable, "-m", "pgscope", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
            cwd=cwd,
        )
    return _live_zygote().run(list(args), full_env, cwd, timeout)


def _live_zygote() -> Zygote:
    global _zygote
    if _zygote is None or _zygote.proc.poll() is not None:
        _zygote = Zygote()
    return _zygote


def cli_processes() -> list[int]:
    """The processes that start pgscope's CLI: this one and the zygote that forks `pgscope`'s
    runs (started now if it is not yet, so that it exists before anything joins a group)."""
    if os.environ.get("PGSCOPE_TEST_ZYGOTE") == "0":
        return [os.getpid()]
    return [os.getpid(), _live_zygote().proc.pid]


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


# -- PostgreSQL versions ----------------------------------------------------------------------
# Debian's 15 (with USDT probes) is every test's server; `make setup` also installs 16, 17 and
# 18 (scripts/setup.sh: .tools/pg/<major>/bin). Tests that read views whose columns differ
# between versions, and the planted causes named per version, take `pg_version`: they run on
# each installed version, and say which is missing where one is.
PG_MAJORS = (15, 16, 17, 18)
NEWER_MAJORS = (16, 17, 18)  # beside 15, which every other test uses
TOOLS_PG = Path(__file__).parent.parent / ".tools" / "pg"


def pg_of_major(major: int) -> PgBinaries:
    """The binaries of one PostgreSQL major version, or a skip saying why there are none."""
    bindir = (
        Path(f"/usr/lib/postgresql/{major}/bin") if major == 15 else TOOLS_PG / str(major) / "bin"
    )
    if not (bindir / "postgres").is_file():
        pytest.skip(f"PostgreSQL {major} is not installed at {bindir} (make setup installs it)")
    found = find_binaries(bindir)
    assert found.major_version() == major, f"{bindir} holds PostgreSQL {found.version()}"
    return found


@pytest.fixture(params=PG_MAJORS, ids=lambda major: f"pg{major}")
def pg_version(request: pytest.FixtureRequest) -> PgBinaries:
    """Each PostgreSQL version in turn (15, 16, 17, 18)."""
    return pg_of_major(int(request.param))


@pytest.fixture(params=NEWER_MAJORS, ids=lambda major: f"pg{major}")
def pg_newer(request: pytest.FixtureRequest) -> PgBinaries:
    """16, 17 and 18 in turn, for tests whose 15 case is another test's."""
    return pg_of_major(int(request.param))


def pgscope_temp_dirs() -> set[str]:
    """pgscope's scratch directories in this session's TMPDIR: clusters, pgbench's working
    directory (pgscope-load-*), initdb templates, perf's control FIFOs."""
    return {p.name for p in SESSION_TMP.glob("pgscope-*")}


def server_processes() -> set[int]:
    """PIDs of live processes started by this test session (they carry its marker)."""
    needle = f"PGSCOPE_TEST_SESSION={SESSION_MARK}".encode()
    pids = set()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        pid = int(environ.parent.name)
        if pid == os.getpid() or (_zygote is not None and pid == _zygote.proc.pid):
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
    if _zygote is not None:
        _zygote.stop()
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


@contextlib.contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A small file system of `size` (tmpfs's syntax: "100m") at `mount`, unmounted (and the
    folder removed, if this made it) on the way out. Skips the test where not root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    made = not mount.exists()
    mount.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        if made:
            mount.rmdir()


@pytest.fixture(scope="session")
def load_user() -> Iterator[LoadUser]:
    """The account pgbench and psql run as (never root), with its working directory (in the
    session's TMPDIR, which that account can enter, like the clusters')."""
    with LoadUser.private(load_account(None), Path(tempfile.gettempdir())) as user:
        yield user


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


# The session's reference run, for the tests that only read a run (the JSON document, the
# store, `runs`, `report` in its formats, the report of a run whose tracers could not run):
# select-only at scale 2, 3 client counts x 2 repeats of 1 + 2 s, asking for the usdt and perf
# collectors with neither bpftrace nor perf on PATH. No tracer runs: their start-up would
# delay the first transaction, which the step-window checks time.
REFERENCE_RUN = [
    *("run", "scaling", "--clients", "1,2,3", "--repeats", "2"),
    *("--duration", "2", "--warmup", "1", "--set", "shared_buffers=128MB", "--scale", "2"),
    *("--collectors", "activity,usdt,perf", "--json"),
]


@pytest.fixture(scope="session")
def reference_run(
    pg: PgBinaries, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    """The reference run's folder (alone in its results folder) and its JSON document. Its
    readers may add files to the folder (a re-rendered report), never change what was
    measured."""
    results = tmp_path_factory.mktemp("reference")
    # Only the venv's and PostgreSQL's programs (not /bin either: it links to /usr/bin here).
    path = f"{Path(sys.executable).parent}:{pg.bindir}"
    result = pgscope(*REFERENCE_RUN, "--results-dir", str(results), env={"PATH": path})
    assert result.returncode == 0, result.stderr[-3000:]
    document: dict[str, Any] = json.loads(result.stdout)
    return Path(document["run_dir"]), document


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
