"""What a killed pgscope left behind, found and removed by the next run and by `doctor`.

Every scratch directory pgscope makes (a cluster's, the load account's, a process's initdb
templates, perf's control FIFOs) carries a marker naming the pgscope process that made it:
its PID and its start time (so a reused PID is not mistaken for it). A directory whose maker
is gone was left by a run that could not clean up (SIGKILL, a power cut). Removing one stops
first any PostgreSQL server still running from it, by the PID in its `postmaster.pid`, and
only when that process is a postmaster whose data directory is inside the leftover.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from pgscope.files import read_regular, remove_tree, write_atomic

MARKER = ".pgscope-owner"
PREFIX = "pgscope-"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19]


def claim(directory: Path) -> None:
    """Mark `directory` as this process's: the next run removes it if this one dies."""
    write_atomic(directory / MARKER, f"{os.getpid()} {_start_time(os.getpid())}\n")


@dataclass(frozen=True)
class Leftover:
    path: Path
    owner_pid: int
    bytes: int
    servers: tuple[int, ...]  # postmasters still running from it

    def describe(self) -> str:
        running = f", {len(self.servers)} server(s) still running" if self.servers else ""
        size = f"{self.bytes / 1e6:.0f} MB"
        return f"{self.path} ({size}, left by pgscope PID {self.owner_pid}{running})"


def _owner(directory: Path) -> tuple[int, str] | None:
    """The maker named by `directory`'s marker, if pgscope (this user) wrote it: $TMPDIR is
    everyone's, and a folder anyone made with a marker of their own (or a link to a server's
    data directory) would have had root stop that server and remove the folder."""
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return None  # a link, a file
        marker = os.lstat(directory / MARKER)
        if not stat.S_ISREG(marker.st_mode) or marker.st_uid != os.geteuid():
            return None
        pid_text, started = read_regular(directory / MARKER, 4096).decode().split()
        return int(pid_text), started
    except (OSError, ValueError):
        return None


def _size(directory: Path) -> int:
    total = 0
    for folder, _dirs, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def _postmasters(directory: Path) -> tuple[int, ...]:
    """PIDs of postmasters running from a data directory inside `directory`."""
    found = []
    # Not through links (os.walk follows none): a data directory is its account's.
    pidfiles = [
        Path(folder, "postmaster.pid")
        for folder, _dirs, files in os.walk(directory)
        if "postmaster.pid" in files
    ]
    for pidfile in pidfiles:
        try:
            pid = int(read_regular(pidfile, 4096).decode().split("\n", 1)[0])
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except (OSError, ValueError):
            continue
        # A postmaster runs in its data directory; a reused PID would be elsewhere.
        if name in ("postgres", "postmaster") and cwd == pidfile.parent.resolve():
            found.append(pid)
    return tuple(found)


def find(parents: list[Path]) -> list[Leftover]:
    """Marked directories in `parents` whose maker is no longer running."""
    leftovers = []
    for parent in dict.fromkeys(parents):
        with contextlib.suppress(OSError):
            for directory in sorted(parent.glob(f"{PREFIX}*")):
                owner = _owner(directory)
                if owner is None or _start_time(owner[0]) == owner[1]:
                    continue  # not pgscope's, or its maker is still at work
                leftovers.append(
                    Leftover(directory, owner[0], _size(directory), _postmasters(directory))
                )
    return leftovers


def remove(leftover: Leftover, grace_s: float = 10) -> None:
    """Stop the servers still running from `leftover` (fast shutdown, then SIGKILL), then
    delete it."""
    for pid in leftover.servers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + grace_s
    while any(Path(f"/proc/{p}").exists() for p in leftover.servers):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for pid in leftover.servers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    remove_tree(leftover.path)
