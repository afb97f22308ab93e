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
`other`). A file that shrinks or is replaced (rotation) is read again from its start. At most
8 MiB a second are read; the rest waits for the next second.

What the server names is the server's account's to choose (`pg_current_logfile()` returns what
`current_logfiles` in the data directory says, and that account writes it), and pgscope reads
it as root. So a file is read only when it is a regular file of the data directory's owner
(never root's: a root-only file named there was read, and its ERROR line stored in the run),
opened without blocking and without following a link (beneath the data directory: no link on
the way, no `..`; elsewhere, in `log_directory`: not at its name), and nothing but a regular
file is ever opened (a FIFO named there hung `observe`). The postmaster's standard error is
read through /proc when it is a regular file the postmaster, checked to be the server's
process, holds open for writing: the server's account's, or root's when root started the
server with its log there (pgscope's own clusters: the run folder's server.log). A file
refused is said once, in one line, with why.

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
from pgscope.files import NotReadable, open_owned
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
        self.refused: set[str] = set()
        postmaster = ctx.postmaster_pid()
        if postmaster is None or ctx.data_dir is None:
            raise CollectorError("the server's postmaster is not on this host")
        self.owner = os.stat(ctx.data_dir).st_uid  # the server's account
        if self.owner == 0:
            raise CollectorError("the data directory is root's: no server's log is read there")
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
        assert ctx.data_dir is not None
        current = None
        try:
            with ctx.conn.connect(application_name=APPLICATION_NAME) as session:
                row = session.execute("SELECT pg_current_logfile()").fetchone()
                current = str(row[0]) if row and row[0] else None
        except (TargetError, psycopg.Error):
            current = None  # not allowed (pg_monitor), or not asked for
        if current is not None:
            try:
                return open_named_log(ctx.data_dir, current, self.owner)
            except NotReadable as exc:
                self._refuse(f"{current} (the log current_logfiles names)", exc)
            except (OSError, ValueError):
                pass
        postmaster = ctx.postmaster_pid()
        if postmaster is None:
            return None
        try:  # the postmaster's standard error, where it is a file
            return open_stderr(postmaster, self.owner)
        except NotReadable as exc:
            self._refuse(f"postmaster {postmaster}'s standard error", exc)
        except (OSError, ValueError, IndexError):
            pass
        return None

    def _refuse(self, what: str, why: NotReadable) -> None:
        if what not in self.refused:
            self.refused.add(what)
            self.ctx.say(f"serverlog: {what} is not read: {why}")

    def _open(self, at_end: bool) -> bool:
        found = self._path()
        self.looked = time.monotonic()
        if found is None:
            return False
        where, fd = found
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # open_owned saw to it; said again here
            os.close(fd)
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


def open_named_log(data_dir: Path, named: str, owner: int) -> tuple[str, int]:
    """(where, a descriptor) of the log file `named` by the server (`pg_current_logfile()`:
    `current_logfiles`, which the server's account writes), a regular file of `owner`; else
    NotReadable saying why not. A relative name, or one in the data directory, is opened
    beneath it (no link on the way, no `..`); one elsewhere (an absolute `log_directory`)
    must be no link at its name. Nothing else is opened, not even for a moment: a FIFO
    would block, a device's open can act."""
    path = Path(named)
    if not path.is_absolute():
        path = data_dir / path
    if path.is_relative_to(data_dir):
        return str(path), open_owned(path, (owner,), beneath=data_dir)
    return str(path), open_owned(path, (owner,))


def open_stderr(pid: int, owner: int) -> tuple[str, int]:
    """(where, a descriptor) of the file postmaster `pid`, a process of `owner`, writes its
    standard error to (`pg_ctl -l`, pg_ctlcluster, pgscope's own clusters): a regular file the
    process holds open for writing, of `owner` or of root (who started the server with its
    log there); NotReadable otherwise. The process is the same one from the first look to
    the last (its start time), so a PID reused meanwhile is not read from."""
    proc = Path(f"/proc/{pid}")
    started = _started(proc)
    status = (proc / "status").read_text().splitlines()
    uids = next((ln.split()[1:3] for ln in status if ln[:4] == "Uid:"), [])
    if not uids or any(int(uid) != owner for uid in uids):
        raise NotReadable("the process is not the server's account's")
    fdinfo = (proc / "fdinfo/2").read_text().splitlines()
    flags = next((int(ln.split()[1], 8) for ln in fdinfo if ln.startswith("flags:")), 0)
    if flags & os.O_ACCMODE == os.O_RDONLY:
        raise NotReadable("not open for writing: no log of the server's")
    fd = open_owned(proc / "fd/2", (owner, 0), follow=True)
    where = os.readlink(proc / "fd/2")
    if _started(proc) != started:
        os.close(fd)
        raise NotReadable("the process exited while it was looked at")
    return where, fd


def _started(proc: Path) -> str:
    """A process's start time since boot (the 22nd field of its stat)."""
    return (proc / "stat").read_text().rsplit(")", 1)[1].split()[19]
