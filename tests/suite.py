"""The test session's own world, set up before anything else is imported: its marker in every
process it starts, its TMPDIR, its initdb templates; what each tier may start; and the check,
after the whole suite, that nothing it started is left."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgscope.target.embedded import NO_SERVER_ENV, TEMPLATES_ENV, ServerForbidden
from tests import cli
from tests.poll import wait_until

# Every process this test session starts inherits this marker in its environment, and every
# cluster directory lands in this session's own TMPDIR: the leftover check below then sees
# exactly what the suite started, even when other suites run on the same host.
SESSION_MARK = f"pgscope-tests-{uuid.uuid4().hex}"
os.environ["PGSCOPE_TEST_SESSION"] = SESSION_MARK
# Under pytest-xdist each worker is a session of its own, started with the controller's TMPDIR:
# its folder goes beside the controller's, not inside it, since a cluster's unix socket path
# must stay under 108 bytes ("could not create Unix-domain socket" at two levels deep).
ROOT_TMP = os.environ.setdefault("PGSCOPE_TESTS_ROOT_TMP", tempfile.gettempdir())
SESSION_TMP = Path(tempfile.mkdtemp(prefix="pgscope-tests-", dir=ROOT_TMP))
os.chmod(SESSION_TMP, 0o755)  # the server's unprivileged account must reach its cluster
os.environ["TMPDIR"] = str(SESSION_TMP)
# A developer's own server must not become every run's target (`run` reads it as --dsn).
os.environ.pop("PGSCOPE_DSN", None)
tempfile.tempdir = None  # re-read TMPDIR
# One initdb for the whole session: every embedded cluster, in this process or in a CLI
# child, starts from a copy of it (src/pgscope/target/embedded.py).
os.environ[TEMPLATES_ENV] = str(SESSION_TMP / "initdb-templates")


# -- tiers ------------------------------------------------------------------------------------
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


# -- leftovers ------------------------------------------------------------------------------


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
        if pid == os.getpid() or pid == cli.zygote_pid():
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
    cli.stop_zygote()
    with contextlib.suppress(AssertionError):
        wait_until(
            lambda: not (server_processes() or pgscope_temp_dirs()), "the suite's leftovers", 15
        )
    left_procs, left_dirs = server_processes(), pgscope_temp_dirs()
    shutil.rmtree(SESSION_TMP, ignore_errors=True)
    assert not left_procs, f"processes left behind by the suite: {describe(left_procs)}"
    assert not left_dirs, f"cluster directories left behind by the suite: {sorted(left_dirs)}"


def programs(pids: set[int]) -> set[str]:
    """The names (`comm`) of those of `pids` still running."""
    names = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            names.add(Path(f"/proc/{pid}/comm").read_text().strip())
    return names


def wait_for_programs(before: set[int], names: set[str], timeout: float = 120) -> set[int]:
    """The processes this session started since `before`, once `names` all run among them."""

    def started() -> set[int] | None:
        now = server_processes() - before
        return now if names <= programs(now) else None

    return wait_until(started, f"{', '.join(sorted(names))} running", timeout, every=0.05)


def wait_for_nothing_left(
    before: set[int], before_dirs: set[str] | None = None, timeout: float = 15
) -> None:
    """Until no process started since `before` (and no scratch folder made since
    `before_dirs`) is left: a command's exit can precede its last child's by a moment. The
    assertion names what stayed."""

    def left() -> tuple[set[int], set[str]]:
        dirs = pgscope_temp_dirs() - before_dirs if before_dirs is not None else set()
        return server_processes() - before, dirs

    with contextlib.suppress(AssertionError):
        wait_until(lambda: left() == (set(), set()), "nothing left", timeout, every=0.05)
    procs, dirs = left()
    assert not procs, f"processes left: {describe(procs)}"
    assert not dirs, f"folders left: {sorted(dirs)}"
