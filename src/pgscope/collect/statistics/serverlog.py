"""The errors the server logs, counted each second: transactions that failed, whoever ran
them.

Why: pgbench's log says which of its transactions failed, and why; a workload pgscope does
not drive (`observe`: a TPC-C client at REPEATABLE READ) says nothing to pgscope, and
pg_stat_database counts rollbacks without saying whether a client chose them. The server
logs every error: a serialization failure ("could not serialize access", SQLSTATE 40001), a
deadlock ("deadlock detected", 40P01), a lock or statement timeout, anything else (issue 30:
9,419 serialization errors in the log, 64% of transactions rolled back, and no finding said
so).

How: on a server on this host, its current log file: the logging collector's
(`pg_current_logfile()`, under the data directory or where `log_directory` says), else the
file the postmaster writes its standard error to (`pg_ctl -l`, Debian's pg_ctlcluster), read
from where it ended when the collector started, each second, its `ERROR:` lines counted by
kind (the English messages: a server with another `lc_messages` has its errors counted as
`other`). The file is opened without following a link (a relative log directory beneath the
data directory, every folder on the way), and is read only when the server's account owns it.
A file that shrinks or is replaced (rotation) is read again from its start. At most 8 MiB a
second are read; the rest waits for the next second.

What it records: `server_errors` (per read and kind: how many, the first message, and the
span the lines were written in: from the previous read to this one). A window counts the
part of each read its span overlaps: stamped by the second of its read alone, a read made
late on a busy host, or the last one at the end of an observation, fell after the window
that held most of its lines (CI: 3,138 errors counted against 4,376 the clients met).

What it costs: one stat and one read of the log's new bytes a second; one query a minute
(`pg_current_logfile()`, for rotation).
"""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path
from typing import Any

import psycopg

from pgscope.collect.base import Availability, CollectorContext, CollectorEnv, CollectorError
from pgscope.collect.polling import ThreadCollector
from pgscope.errors import TargetError
from pgscope.files import open_beneath
from pgscope.store import now_us

APPLICATION_NAME = "pgscope-serverlog"
# Each kind, by the server's own (English) message after `ERROR:`.
KINDS = (
    ("serialization", re.compile(r"could not serialize access")),
    ("deadlock", re.compile(r"deadlock detected")),
    ("lock_timeout", re.compile(r"canceling statement due to lock timeout")),
    ("statement_timeout", re.compile(r"canceling statement due to statement timeout")),
)
ERROR = re.compile(rb"\bERROR:\s+(.*)")
READ_CAP = 8 << 20
RELOOK_S = 60.0


def kind_of(message: str) -> str:
    return next((kind for kind, pattern in KINDS if pattern.search(message)), "other")


class ServerLogCollector(ThreadCollector):
    name = "serverlog"
    summary = "errors the server logs (serialization failures, deadlocks, timeouts), per second"
    cost = "one read of the server log's new lines a second"
    default_in_runs = False

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        if env.target_kind not in ("local", "embedded"):
            return Availability.no("the server's log is read on its own host (give --data-dir)")
        return Availability.yes()

    def prepare(self, ctx: CollectorContext) -> None:
        ctx.store.create_tables(self.name)
        self.handle: int | None = None
        self.identity: tuple[int, int] | None = None
        self.offset = 0
        self.pending = b""
        self.looked = 0.0
        postmaster = ctx.postmaster_pid()
        if postmaster is None:
            raise CollectorError("the server's postmaster is not on this host")
        self.owner = os.stat(f"/proc/{postmaster}").st_uid
        if not self._open(at_end=True):
            raise CollectorError(
                "no log file of the server that pgscope may read (the logging collector's, "
                "or the file its standard error goes to; as root or the server's owner): its "
                "errors are not counted"
            )
        self.read_us = now_us()  # opened at its end: what follows is new
        ctx.say(f"serverlog: counting the errors in {self.where}")
        ctx.store.add_event("serverlog", f"counting the errors the server logs in {self.where}")

    def _path(self) -> tuple[str, int] | None:
        """(where, an open descriptor) of the server's current log, or None."""
        ctx = self.ctx
        current = None
        try:
            with ctx.conn.connect(application_name=APPLICATION_NAME) as session:
                row = session.execute("SELECT pg_current_logfile()").fetchone()
                current = str(row[0]) if row and row[0] else None
        except (TargetError, psycopg.Error):
            current = None  # not allowed (pg_monitor), or not asked for
        if current is not None:
            path = Path(current)
            if not path.is_absolute() and ctx.data_dir is not None:
                path = ctx.data_dir / path
            try:
                if ctx.data_dir is not None and path.is_relative_to(ctx.data_dir):
                    fd = open_beneath(ctx.data_dir, path, os.O_RDONLY)
                else:
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                fd = -1
            if fd >= 0:
                return str(path), fd
        postmaster = ctx.postmaster_pid()
        if postmaster is None:
            return None
        try:  # the postmaster's standard error, where it is a file
            fd = os.open(f"/proc/{postmaster}/fd/2", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        return os.readlink(f"/proc/{postmaster}/fd/2"), fd

    def _open(self, at_end: bool) -> bool:
        found = self._path()
        self.looked = time.monotonic()
        if found is None:
            return False
        where, fd = found
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid not in (self.owner, 0):
            os.close(fd)  # a pipe (the logging collector's), a terminal, another's file
            return False
        identity = (info.st_dev, info.st_ino)
        if identity == self.identity:
            os.close(fd)
            return True
        if self.handle is not None:
            os.close(self.handle)
        self.handle, self.identity, self.where = fd, identity, where
        self.offset = info.st_size if at_end else 0
        self.pending = b""
        return True

    def run_loop(self) -> None:
        while not self.stop_event.wait(1.0):
            self._read_second()
        self._read_second()

    def _read_second(self) -> None:
        if time.monotonic() - self.looked >= RELOOK_S:
            self._open(at_end=False)  # rotated: the new file from its start
        if self.handle is None:
            return
        since, self.read_us = self.read_us, now_us()
        size = os.fstat(self.handle).st_size
        if size < self.offset:  # truncated: read again from its start
            self.offset, self.pending = 0, b""
        chunk = os.pread(self.handle, min(READ_CAP, size - self.offset), self.offset)
        self.offset += len(chunk)
        lines = (self.pending + chunk).split(b"\n")
        self.pending = lines.pop()
        counts: dict[str, list[Any]] = {}
        for line in lines:
            match = ERROR.search(line)
            if match is None:
                continue
            message = match[1].decode("utf-8", "replace").strip()
            kind = kind_of(message)
            seen = counts.setdefault(kind, [0, message[:300]])
            seen[0] += 1
        if counts:
            rows = len(counts)
            self.store.append(
                "server_errors",
                {
                    "second_us": [self.read_us // 1_000_000 * 1_000_000] * rows,
                    "kind": list(counts),
                    "errors": [n for n, _ in counts.values()],
                    "example": [example for _, example in counts.values()],
                    "from_us": [since] * rows,
                    "to_us": [self.read_us] * rows,
                },
            )

    def closed(self) -> None:
        if self.handle is not None:
            os.close(self.handle)
            self.handle = None
