"""Which role (backend, walwriter, checkpointer, ...) is each process of a cluster?

Profiles are read after the step, when backends have exited, so the roles are read while a
recording runs: the process titles of the postmaster's children, polled every 0.5 s (~1 ms a
poll, one thread per recording).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path

from pgscope.proc import child_pids

# Process titles after "postgres: " (optionally "cluster_name: "), for PostgreSQL 12-17.
_AUX_ROLES = {
    "logger": "logger",
    "checkpointer": "checkpointer",
    "background writer": "bgwriter",
    "walwriter": "walwriter",
    "autovacuum launcher": "autovacuum",
    "autovacuum worker": "autovacuum",
    "logical replication launcher": "logical-replication",
    "logical replication worker": "logical-replication",
    "logical replication apply worker": "logical-replication",
    "walsender": "walsender",
    "walreceiver": "walreceiver",
    "startup": "startup",
    "archiver": "archiver",
    "stats collector": "stats",
    "parallel worker": "parallel-worker",
    "walsummarizer": "walsummarizer",
}


def process_role(title: str) -> str:
    """The role of a cluster process from its title (`/proc/PID/cmdline`), e.g.
    "postgres: walwriter" -> walwriter, "postgres: bench bench [local] SELECT" -> backend."""
    if not title.startswith("postgres: "):
        return "postmaster"
    rest = title[len("postgres: ") :].strip()
    for candidate in (rest, rest.split(": ", 1)[-1]):  # with or without a cluster_name
        for prefix, role in _AUX_ROLES.items():
            if candidate == prefix or candidate.startswith(prefix + " "):
                return role
    return "backend"


def _title(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def postmasters_of(binary: Path) -> list[int]:
    """Postmasters running `binary`: processes of it whose parent runs something else (every
    other process of a cluster is a postmaster's child)."""
    target = binary.resolve()
    running: dict[int, int] = {}  # pid -> parent, for processes of `binary`
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(proc / "exe")) != target:
                continue
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        running[int(proc.name)] = int(stat[1])
    return sorted(pid for pid, parent in running.items() if parent not in running)


def cluster_pids(postmaster: int) -> list[int]:
    """The postmaster and its children (PostgreSQL forks every process from the postmaster)."""
    return [postmaster, *child_pids(postmaster)]


class ProcessRoles:
    """Who is who in the cluster while a recording runs: PID -> role, polled from the process
    titles (every 0.5 s, ~1 ms each), because backends are gone by the time stacks are folded.
    A PID never seen alive falls back to its stack (see role_of)."""

    def __init__(self, postmaster: int, interval_s: float = 0.5) -> None:
        self.postmaster = postmaster
        self.interval_s = interval_s
        self.roles: dict[int, str] = {}
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.poll()

    def poll(self) -> None:
        for pid in cluster_pids(self.postmaster):
            if pid in self.roles:
                continue
            title = _title(pid)
            if title is not None:
                self.roles[pid] = "postmaster" if pid == self.postmaster else process_role(title)

    def start(self) -> None:
        def loop() -> None:
            while not self._done.wait(self.interval_s):
                self.poll()

        self._thread = threading.Thread(target=loop, name="pgscope-roles", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(5)
        self.poll()

    def role_of(self, pid: int, frames: Iterable[str]) -> str:
        known = self.roles.get(pid)
        if known is not None:
            return known
        # Too short-lived for the poll: a connection that started or ended between two
        # polls, or an autovacuum / background worker. Every process here is a postmaster
        # child (perf and offcpu.bt follow nothing else), so the stack decides.
        names = set(frames)
        if "StartAutoVacWorker" in names:
            return "autovacuum"
        if "StartBackgroundWorker" in names:
            return "bgworker"
        if "PostgresMain" in names or "PostmasterMain" in names:
            return "backend"
        return "unknown"
