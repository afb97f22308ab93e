"""Child processes: spawning them as the right user, and always stopping them.

Children get their own session, so a terminal's Ctrl-C reaches only pgscope, which then stops
load, collectors and servers in order. Each child also gets a parent-death signal: if pgscope
itself is killed with SIGKILL, the kernel still stops what it started.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pgscope.errors import EnvironmentProblem

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class RunAs:
    """The unprivileged account that owns and runs server processes."""

    name: str
    uid: int
    gid: int

    @classmethod
    def current(cls) -> RunAs:
        entry = pwd.getpwuid(os.geteuid())
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid)

    @property
    def switches_user(self) -> bool:
        return self.uid != os.geteuid()

    def chown(self, path: Path) -> None:
        if self.switches_user:
            os.chown(path, self.uid, self.gid)


def server_account(requested: str | None) -> RunAs:
    """Who runs PostgreSQL. As root: `requested`, else the `postgres` system account
    (PostgreSQL refuses to run as root). Otherwise: the current user."""
    if os.geteuid() != 0:
        if requested and requested != RunAs.current().name:
            raise EnvironmentProblem(
                f"--run-as {requested}: only root can start the server as another user"
            )
        return RunAs.current()
    name = requested or "postgres"
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise EnvironmentProblem(
            f"user {name!r} does not exist, and PostgreSQL refuses to run as root; "
            f"create one (useradd --system {name}) or pass --run-as USER"
        ) from None
    if entry.pw_uid == 0:
        raise EnvironmentProblem(f"--run-as {name}: PostgreSQL refuses to run as root")
    return RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _child_setup(death_signal: int, cpus: set[int] | None) -> Callable[[], None]:
    def setup() -> None:
        # Runs in the child after fork and after the user switch (which would clear it).
        _libc.prctl(_PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
        # An ignored SIGINT survives exec: started from a background job or nohup, pgbench
        # would ignore the SIGINT that asks it to stop and print its summary.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if cpus:
            os.sched_setaffinity(0, cpus)

    return setup


def spawn(
    argv: Sequence[str | os.PathLike[str]],
    *,
    run_as: RunAs | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    stdin: IO[Any] | int | None = subprocess.DEVNULL,
    stdout: IO[Any] | int | None = subprocess.DEVNULL,
    stderr: IO[Any] | int | None = subprocess.DEVNULL,
    death_signal: int = signal.SIGTERM,
    text: bool = False,
    cpus: set[int] | None = None,
) -> subprocess.Popen[Any]:
    """Start a child in its own session. Call only from the main thread: the kernel sends
    the parent-death signal when the *thread* that forked exits."""
    kwargs: dict[str, Any] = {}
    if run_as is not None and run_as.switches_user:
        kwargs.update(user=run_as.uid, group=run_as.gid, extra_groups=[])
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    try:
        return subprocess.Popen(
            [str(a) for a in argv],
            cwd=cwd,
            env=full_env,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            preexec_fn=_child_setup(death_signal, cpus),
            text=text,
            **kwargs,
        )
    except FileNotFoundError:
        raise EnvironmentProblem(f"{argv[0]}: program not found") from None
    except PermissionError as exc:
        raise EnvironmentProblem(f"{argv[0]}: cannot start: {exc.strerror}") from None


def run_as_user(
    argv: Sequence[str | os.PathLike[str]],
    *,
    run_as: RunAs | None,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a short command to completion (initdb, pg_ctl-like helpers), capturing output."""
    proc = spawn(
        argv,
        run_as=run_as,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        stop_process(proc, signal.SIGTERM, grace_s=5)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def stop_process(proc: subprocess.Popen[Any], first: int, grace_s: float) -> int | None:
    """Send `first`, wait up to `grace_s`, then SIGKILL the child's whole process group."""
    if proc.poll() is None:
        try:
            proc.send_signal(first)
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            pass
    kill_group(proc.pid)
    try:
        return proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


def child_pids(parent: int) -> list[int]:
    """Direct children of `parent`, from /proc (PostgreSQL backends call setsid, so they are
    not in the postmaster's process group)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name may contain spaces and parentheses: split after the last ')'.
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent:
            children.append(int(stat.parent.name))
    return children


def kill_tree(pid: int) -> None:
    """SIGKILL a process and its direct children (a postmaster and its backends)."""
    for victim in [*child_pids(pid), pid]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(victim, signal.SIGKILL)


def kill_group(pgid: int) -> None:
    """SIGKILL whatever is left in a process group (children share their leader's group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
