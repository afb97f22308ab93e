"""A server running on this host, found by its data directory (for `trace` and `profile`).

Tracing and profiling need the postmaster's PID, which only `postmaster.pid` in the data
directory gives reliably; a DSN does not say which process serves it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pgscope.errors import TargetError, UsageError
from pgscope.target.conn import ConnParams


@dataclass(frozen=True)
class LocalServer:
    data_dir: Path
    pid: int
    port: int
    socket_dir: Path | None

    @classmethod
    def from_data_dir(cls, data_dir: Path) -> LocalServer:
        pid_file = data_dir / "postmaster.pid"
        if not (data_dir / "PG_VERSION").is_file():
            raise UsageError(f"--data-dir {data_dir}: not a PostgreSQL data directory")
        try:
            lines = pid_file.read_text().splitlines()
        except FileNotFoundError:
            raise TargetError(
                f"--data-dir {data_dir}: the server is not running (no postmaster.pid)"
            ) from None
        except PermissionError:
            raise TargetError(
                f"--data-dir {data_dir}: cannot read postmaster.pid "
                f"(run as root or as the server's owner)"
            ) from None
        # postmaster.pid: pid, data dir, start time, port, socket dir, listen address, ...
        if len(lines) < 5 or not lines[0].strip().isdigit():
            raise TargetError(
                f"--data-dir {data_dir}: postmaster.pid is incomplete; is the server starting?"
            )
        pid = int(lines[0])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            raise TargetError(
                f"--data-dir {data_dir}: postmaster.pid names PID {pid}, which "
                f"is not running (stale file)"
            ) from None
        except PermissionError:
            pass  # running, owned by another user
        socket_dir = Path(lines[4].split(",")[0].strip()) if lines[4].strip() else None
        return cls(data_dir, pid, int(lines[3]), socket_dir)

    def current_pid(self) -> int:
        """The postmaster's PID now: a restart gives a new one (the one found at first
        while postmaster.pid names no running process)."""
        try:
            now = LocalServer.from_data_dir(self.data_dir).pid
        except (TargetError, UsageError, OSError, ValueError):
            return self.pid
        return now

    def conn(self, user: str = "postgres", dbname: str = "postgres") -> ConnParams:
        host = str(self.socket_dir) if self.socket_dir else "127.0.0.1"
        return ConnParams({"host": host, "port": str(self.port), "user": user, "dbname": dbname})
