"""Is the server `observe` watches still there? Asked about once a second, so that an
observation of a server that died or shut down ends within seconds, not at --duration (issue
27: 120 s of observing a dead server ended "complete" with a CPU-bound verdict).

A server on this host: its postmaster process, by PID and start time (a PID reused since is
another process), still running and not a zombie, and its postmaster.pid not saying
"stopping" (a shutdown has begun: the server refuses new sessions and ends the others). Two
small file reads, no query; postmaster.pid is read as `LocalServer` reads it (a regular file
of the data directory's owner, no link followed, never a blocking open: a FIFO there
would block `observe`).

A server elsewhere: `SELECT 1` every PROBE_S on a session of its own (application `pgscope`,
which no analysis counts), connecting again when it drops; lost after LOST_AFTER_S without an
answer. A crash and restart takes a few seconds; the probe's connection gives up after
PROBE_TIMEOUT_S so that a host gone from the network is noticed as quickly.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg

from pgscope.errors import TargetError
from pgscope.store import now_us
from pgscope.target.conn import ConnParams
from pgscope.target.local import LocalServer, pid_file_lines

PROBE_S = 1.0
LOST_AFTER_S = 5.0
PROBE_TIMEOUT_S = 2


@dataclass(frozen=True)
class Lost:
    """The server is gone: the last moment it was seen, and why it is taken for gone."""

    seen_us: int
    why: str


class ServerWatch:
    def __init__(self, local: LocalServer | None, conn: ConnParams | None) -> None:
        self.local = local
        self.seen_us = now_us()
        self.started = _start_time(local.pid) if local is not None else None
        self.conn: ConnParams | None = None
        if local is None and conn is not None:
            self.conn = replace(
                conn,
                params={
                    **conn.params,
                    "connect_timeout": str(PROBE_TIMEOUT_S),
                    "tcp_user_timeout": str(PROBE_TIMEOUT_S * 1000),
                },
            )
        self.session: psycopg.Connection[Any] | None = None
        self.probed = 0.0
        self.failing: str | None = None

    def check(self) -> Lost | None:
        """None while the server is there; once it is not, when it was last seen and why."""
        if self.local is not None:
            why = self._local()
            if why is None:
                self.seen_us = now_us()
                return None
            return Lost(self.seen_us, why)
        why = self._remote()
        if why is None or (now_us() - self.seen_us) / 1e6 < LOST_AFTER_S:
            return None  # a connection that dropped: a few seconds to come back
        return Lost(self.seen_us, why)

    def close(self) -> None:
        if self.session is not None:
            with contextlib.suppress(Exception):
                self.session.close()
            self.session = None

    def _local(self) -> str | None:
        assert self.local is not None
        pid = self.local.pid
        if _start_time(pid) != self.started:
            return f"postmaster {pid} exited"
        try:
            lines = pid_file_lines(self.local.data_dir, self.local.owner)
        except FileNotFoundError:
            return f"postmaster {pid} is shutting down (its postmaster.pid is gone)"
        except OSError:  # unreadable here, or no regular file of the server's: not read
            return None  # the process alone says
        if lines and lines[0].strip() != str(pid):
            return f"postmaster {pid} was replaced (postmaster.pid names {lines[0].strip()})"
        # Line 8 is the postmaster's state: starting, ready, standby, or stopping.
        if len(lines) >= 8 and lines[7].strip() == "stopping":
            return f"postmaster {pid} is shutting down"
        return None

    def _remote(self) -> str | None:
        """None when the last probe was answered (probes are PROBE_S apart), else why not."""
        if time.monotonic() - self.probed < PROBE_S:
            return self.failing
        self.probed = time.monotonic()
        assert self.conn is not None
        try:
            if self.session is None:
                self.session = self.conn.connect()
            self.session.execute("SELECT 1")
            self.failing = None
            self.seen_us = now_us()
        except (psycopg.Error, TargetError) as exc:
            self.close()
            self.failing = f"no answer from {self.conn.conninfo()}: {' '.join(str(exc).split())}"
        return self.failing


def _start_time(pid: int) -> int | None:
    """A process's start time in clock ticks since boot; None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # exited, not yet reaped by its parent
        return None
    return int(fields[19])
