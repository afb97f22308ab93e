"""Which processes on this host are a given PostgreSQL server, and which binary they run.

Tracing attaches to processes and files, not to a connection: a `--dsn` has to be turned into
a local postmaster first. Costs one query and a walk of /proc (root sees every postmaster).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from pgscope.collect.base import CollectorError
from pgscope.errors import PgscopeError
from pgscope.target.conn import ConnParams
from pgscope.target.local import LocalServer


def running_binary(pid: int) -> Path:
    """The executable a running postmaster was started from (what the uprobes go on)."""
    try:
        target = os.readlink(f"/proc/{pid}/exe")
    except FileNotFoundError:
        raise CollectorError(f"postmaster PID {pid} is not running") from None
    except PermissionError:
        raise CollectorError(f"cannot read /proc/{pid}/exe (tracing needs root)") from None
    if target.endswith(" (deleted)"):
        raise CollectorError(
            f"the server's binary {target[: -len(' (deleted)')]} was replaced since the "
            f"server started (a package upgrade?); restart the server to trace it"
        )
    return Path(target)


def _postmasters() -> Iterator[tuple[int, Path]]:
    """(pid, data directory) of every postmaster on this host: a postgres process whose
    parent is not one (the postmaster chdirs to its data directory)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            comm, rest = stat.read_text().rsplit(")", 1)
            if not comm.endswith("(postgres"):
                continue
            parent = int(rest.split()[1])
            parent_comm = Path(f"/proc/{parent}/comm").read_text().strip() if parent else ""
            if parent_comm == "postgres":
                continue
            yield int(stat.parent.name), Path(os.readlink(stat.parent / "cwd"))
        except (OSError, ValueError, IndexError):
            continue


def local_server_for(conn: ConnParams) -> LocalServer | None:
    """The server behind `conn` when it runs on this host, else None.

    A DSN names no process. A server is this one when a local postmaster's postmaster.pid
    gives the port the server reports (`current_setting('port')`) and the same start time
    (`pg_postmaster_start_time()`, to the second): a remote server would have to share both.
    A process calling itself postgres is any account's to start: its folder is read as
    `--data-dir` is (`LocalServer.from_data_dir`), never through a link nor a FIFO. Needs root
    to see other users' postmasters.
    """
    with conn.connect() as session:
        row = session.execute(
            "SELECT current_setting('port')::int, "
            "extract(epoch FROM pg_postmaster_start_time())::bigint"
        ).fetchone()
    if row is None:
        return None
    port, started = int(row[0]), int(row[1])
    for pid, data_dir in _postmasters():
        try:  # read as --data-dir reads it: a postmaster.pid of the folder's owner, no link
            local = LocalServer.from_data_dir(data_dir)  # followed, its PID checked in /proc
        except PgscopeError:
            continue
        if local.pid == pid and local.port == port and abs(local.started - started) <= 1:
            return local
    return None
