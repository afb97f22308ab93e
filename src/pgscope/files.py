"""Files pgscope writes whole (summaries, reports): all of the new one, or the old one intact;
files created and read without following links; and scratch trees removed whole.

A plain `write_text` truncates first: on a full or read-only disk it left an empty
summary.json behind, which readers then took for a broken run. It also follows a symbolic link
in the file's place: a run folder received from someone else, with `summary.json` planted as a
link to a file of root's, made `pgscope report --format html` (as root) overwrite that file.
So a file is written under a fresh name that no one else can have made (O_EXCL) and renamed
over its place: a rename replaces a link, never what it points to.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from pgscope.errors import EnvironmentProblem


def _umask() -> int:
    """The process's umask, read without changing it (os.umask would, for a moment, for every
    thread)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def write_atomic(path: Path, text: str | bytes, *, mode: int | None = None) -> Path:
    """Write `text` to a new temporary file beside `path`, then rename it over `path`. Raises
    EnvironmentProblem, one line, when the folder cannot take it (full, read-only, gone).
    `mode`: the file's permissions (default: 0666 less the umask, as open() makes them)."""
    existed = path.exists()
    temp: Path | None = None
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        temp = Path(name)
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), 0o666 & ~_umask() if mode is None else mode)
            out.write(text.encode("utf-8") if isinstance(text, str) else text)
            out.flush()
            os.fsync(out.fileno())  # the rename must not outlive the data on a crash
        os.replace(temp, path)
    except OSError as exc:
        _discard(temp)
        kept = f" (the previous {path.name} is unchanged)" if existed else ""
        raise EnvironmentProblem(f"cannot write {path}: {exc.strerror or exc}{kept}") from None
    except BaseException:  # a Ctrl-C mid-write leaves no half file behind either
        _discard(temp)
        raise
    return path


def _discard(temp: Path | None) -> None:
    if temp is not None:
        with contextlib.suppress(OSError):
            temp.unlink()


_FLAGS = {
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
}


def open_for_writing(path: Path, mode: str = "w") -> IO[Any]:
    """`path` opened to write ("w", "wb") or append ("ab"), for output that streams in (a
    program's stdout, a trace): a link in its place is an error, not followed, and so is
    anything but a regular file there (a FIFO would block)."""
    fd = os.open(path, _FLAGS[mode] | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path}: not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path, limit: int | None = None) -> bytes:
    """The bytes of `path`, a regular file: OSError when it is a link (never followed) or
    anything else (a FIFO, a device). For files in folders pgscope did not make."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path}: not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read() if limit is None else handle.read(limit)
    finally:
        os.close(fd)


def open_beneath(trusted: Path, path: Path, flags: int, mode: int = 0o666) -> int:
    """`os.open(path, flags)` where `path` lies in `trusted` (opened as given) and every folder
    between them, and the file itself, may belong to another account (a cluster's folder and
    data directory, the server's): no link on the way is followed, so that account cannot
    point root at a file of root's by putting a link, or swapping a folder for one, anywhere
    in the path."""
    relative = path.relative_to(trusted)
    if ".." in relative.parts or not relative.parts:
        raise OSError(f"{path}: not a file beneath {trusted}")  # `..` would climb out of it
    folder = os.open(trusted, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        *parts, name = relative.parts
        for part in parts:
            inner = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder
            )
            os.close(folder)
            folder = inner
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=folder)
    finally:
        os.close(folder)


class NotReadable(OSError):
    """A file pgscope will not read where another account put it, and why (a phrase:
    "a symbolic link, not followed")."""


def account_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link, not followed"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_owned(
    path: Path,
    owners: tuple[int, ...],
    *,
    beneath: Path | None = None,
    follow: bool = False,
) -> int:
    """A descriptor to read `path` (a file another account controls: a data directory's
    `postmaster.pid`, a server's log), or NotReadable saying why not. It must be a regular
    file whose owner is one of `owners`. Nothing else is ever opened: the name is first taken
    with O_PATH, which opens nothing (a FIFO would block the reader, a device's open can act,
    /dev/watchdog's arms it); only a regular file of those owners is then opened, through
    that very handle (/proc/self/fd), so no swap in between can change what is read.
    `beneath`: `path` lies in that folder and no link on the way is followed
    (`open_beneath`), no `..` either; else only its last component must be no link, or with
    `follow` (a /proc/<pid>/fd/N link: the file a process holds) it is followed."""
    try:
        if beneath is not None:
            handle = open_beneath(beneath, path, os.O_PATH)
        else:
            nofollow = 0 if follow else os.O_NOFOLLOW
            handle = os.open(path, os.O_PATH | nofollow | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotReadable("a symbolic link on its way, not followed") from None
        if exc.strerror is None:  # `..` in it (open_beneath)
            raise NotReadable(f"{exc}") from None
        raise
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            raise NotReadable(_kind(info.st_mode))
        if info.st_uid not in owners:
            expected = " or ".join(account_name(uid) for uid in owners)
            raise NotReadable(f"owned by {account_name(info.st_uid)}, not by {expected}")
        fd = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(handle)
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):  # cannot happen
        os.close(fd)
        raise NotReadable("changed while it was opened")
    return fd


def read_owned(
    path: Path, owners: tuple[int, ...], *, beneath: Path | None = None, limit: int = 1 << 16
) -> bytes:
    """The first `limit` bytes of `path`, opened as `open_owned` opens it."""
    fd = open_owned(path, owners, beneath=beneath)
    try:
        return os.pread(fd, limit, 0)
    finally:
        os.close(fd)


def make_private_folder(path: Path) -> Path:
    """Create the folder `path` (its parents as `mkdir -p` makes them), its owner's alone
    (0700) from the moment it exists: a run folder, whose store, server.log and logs hold the
    server's text. FileExistsError when something is there already (a link is not followed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkdir(path, 0o700)  # the umask can only take bits away
    folder = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(folder, 0o700)  # a umask that took the owner's own bits away
    finally:
        os.close(folder)
    return path


def copy_new(
    source: Path, target: Path, *, mode: int | None = None, group: int | None = None
) -> Path:
    """Copy `source`, a regular file, into a new file `target`, which must not exist (a link
    there is not followed, nor replaced). Its permissions: `mode`, else at most the source's
    and never more open than 0644 (a file only its owner may read stays so in a folder others
    can read); its group: `group`, else pgscope's."""
    src = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(src)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{source}: not a regular file")
        os.set_blocking(src, True)
        dst = os.open(
            target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        with os.fdopen(dst, "wb") as writer:
            try:
                if group is not None:
                    os.fchown(writer.fileno(), -1, group)
                shown = stat.S_IMODE(info.st_mode) & 0o644 & ~_umask() if mode is None else mode
                os.fchmod(writer.fileno(), shown)
                with os.fdopen(src, "rb", closefd=False) as reader:
                    shutil.copyfileobj(reader, writer)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(target)
                raise
    finally:
        os.close(src)
    return target


def remove_tree(path: Path, within_s: float = 5.0) -> bool:
    """Remove `path` and everything in it; True when it is gone. One `rmtree` is not enough
    for a cluster's directory: a server process that outlived its postmaster (killed after a
    shutdown that timed out) can still create files while the tree is removed, and the
    directory stayed behind (once, in a suite run on a host loaded by other work)."""
    deadline = time.monotonic() + within_s
    while True:
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists() or time.monotonic() > deadline:
            return not path.exists()
        time.sleep(0.1)
