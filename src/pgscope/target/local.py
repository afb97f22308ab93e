"""A server running on this host, found by its data directory (for `trace` and `profile`).

Tracing and profiling need the postmaster's PID, which only `postmaster.pid` in the data
directory gives reliably; a DSN does not say which process serves it.

The data directory and everything in it are the server's account's, and pgscope reads them
as root: `postmaster.pid` is read only as a regular file of the directory's owner, opened
without following a link or blocking (`files.open_owned`), and the PID it names is taken for
the server only when /proc shows a process of that owner, running a postgres binary, whose
working directory is that data directory (the postmaster chdirs into it at start-up, and its
children inherit it). Otherwise root would profile, trace or watch whatever process the file
names (PID 1), read whatever a link there points at, or hang on a FIFO.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from pgscope.errors import TargetError, UsageError
from pgscope.files import NotReadable, account_name, read_owned
from pgscope.target.conn import ConnParams

POSTGRES_BINARIES = ("postgres", "postmaster")


def data_dir_owner(data_dir: Path) -> tuple[int, tuple[int, int]]:
    """(owner's uid, (device, inode)) of a data directory: a folder with a PG_VERSION file,
    not root's (PostgreSQL runs no server as root, so a folder of root's is no live data
    directory, and none of its files may be trusted as the server's)."""
    try:
        folder = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise UsageError(f"--data-dir {data_dir}: not a PostgreSQL data directory") from None
    except PermissionError:
        raise TargetError(
            f"--data-dir {data_dir}: cannot read it (run as root or as the server's owner)"
        ) from None
    try:
        info = os.fstat(folder)
        version = os.stat("PG_VERSION", dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        version = None
    except PermissionError:
        raise TargetError(
            f"--data-dir {data_dir}: cannot read it (run as root or as the server's owner)"
        ) from None
    finally:
        os.close(folder)
    if version is None or not stat.S_ISREG(version.st_mode):
        raise UsageError(f"--data-dir {data_dir}: not a PostgreSQL data directory")
    if info.st_uid == 0:
        raise TargetError(
            f"--data-dir {data_dir}: owned by root, and PostgreSQL runs no server as root: "
            f"none of its files is taken for a server's"
        )
    return info.st_uid, (info.st_dev, info.st_ino)


def pid_file_lines(data_dir: Path, owner: int) -> list[str]:
    """The lines of `data_dir/postmaster.pid`, a regular file of `owner` read without
    following a link or blocking. OSError as reading it gives (FileNotFoundError: no server);
    NotReadable when it is not such a file."""
    text = read_owned(data_dir / "postmaster.pid", (owner,), beneath=data_dir, limit=8192)
    return text.decode("utf-8", "replace").splitlines()


def not_the_postmaster(pid: int, data_dir: tuple[int, int], owner: int) -> str | None:
    """None when /proc shows `pid` is a process of `owner` running a postgres binary in the
    data directory `data_dir` (device, inode); else why not. FileNotFoundError when no such
    process runs."""
    proc = Path(f"/proc/{pid}")
    fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):  # exited, not yet reaped
        raise FileNotFoundError(f"process {pid} exited")
    uids = next(
        (ln.split()[1:3] for ln in (proc / "status").read_text().splitlines() if ln[:4] == "Uid:"),
        [],
    )
    if any(int(uid) != owner for uid in uids) or not uids:
        runs_as = account_name(int(uids[1])) if uids else "an unknown account"
        return f"a process of {runs_as}, not of {account_name(owner)} (the data directory's owner)"
    try:
        exe = os.readlink(proc / "exe").removesuffix(" (deleted)")
        cwd = os.stat(proc / "cwd")
    except PermissionError:
        return "a process pgscope may not inspect (run as root or as the server's owner)"
    if Path(exe).name not in POSTGRES_BINARIES:
        return f"which runs {exe}, not a postgres binary"
    if (cwd.st_dev, cwd.st_ino) != data_dir:
        return "whose working directory is not this data directory (a postmaster's is)"
    return None


@dataclass(frozen=True)
class LocalServer:
    data_dir: Path
    pid: int
    port: int
    socket_dir: Path | None
    owner: int = -1  # the data directory's owner: the server's account
    started: int = 0  # the postmaster's start, in seconds since the epoch (postmaster.pid)

    @classmethod
    def from_data_dir(cls, data_dir: Path) -> LocalServer:
        owner, identity = data_dir_owner(data_dir)
        try:
            lines = pid_file_lines(data_dir, owner)
        except FileNotFoundError:
            raise TargetError(
                f"--data-dir {data_dir}: the server is not running (no postmaster.pid)"
            ) from None
        except PermissionError:
            raise TargetError(
                f"--data-dir {data_dir}: cannot read postmaster.pid "
                f"(run as root or as the server's owner)"
            ) from None
        except NotReadable as exc:
            raise TargetError(f"--data-dir {data_dir}: postmaster.pid not read: {exc}") from None
        except OSError as exc:
            raise TargetError(
                f"--data-dir {data_dir}: cannot read postmaster.pid: {exc.strerror or exc}"
            ) from None
        # postmaster.pid: pid, data dir, start time, port, socket dir, listen address, ...
        fields = [ln.strip() for ln in lines[:5]]
        if len(fields) < 5 or not all(f.isdigit() for f in (fields[0], fields[2], fields[3])):
            raise TargetError(
                f"--data-dir {data_dir}: postmaster.pid is incomplete; is the server starting?"
            )
        pid = int(fields[0])
        try:
            why = not_the_postmaster(pid, identity, owner)
        except (OSError, IndexError, ValueError):
            raise TargetError(
                f"--data-dir {data_dir}: postmaster.pid names PID {pid}, which "
                f"is not running (stale file)"
            ) from None
        if why is not None:
            raise TargetError(
                f"--data-dir {data_dir}: postmaster.pid names PID {pid}, {why}: "
                f"not taken for its server"
            )
        socket_dir = Path(lines[4].split(",")[0].strip()) if lines[4].strip() else None
        return cls(data_dir, pid, int(fields[3]), socket_dir, owner, int(fields[2]))

    def current_pid(self) -> int:
        """The postmaster's PID now: a restart gives a new one (the one found at first
        while postmaster.pid names no running process, or none pgscope trusts)."""
        try:
            now = LocalServer.from_data_dir(self.data_dir).pid
        except (TargetError, UsageError, OSError, ValueError):
            return self.pid
        return now

    def conn(self, user: str = "postgres", dbname: str = "postgres") -> ConnParams:
        host = str(self.socket_dir) if self.socket_dir else "127.0.0.1"
        return ConnParams({"host": host, "port": str(self.port), "user": user, "dbname": dbname})
