"""Who runs the programs that execute user-provided files, and where they work.

pgbench scripts (`\\shell`, `\\setshell`) and init SQL (psql's `\\!`) run shell commands: run
as root, a spec file shared between colleagues would be root code. So pgbench and psql run as
the unprivileged account that owns the embedded server (`--run-as`, else `postgres`; on a
user's server, the same account, or `nobody` where there is no `postgres`). Root stays only
with the kernel-side collectors (bpftrace, perf) and pgscope itself.

That account may not reach the results folder (under `/root`, say) or the user's scripts, so
each run gets a private directory (0700, owned by the account, removed at the end) where
pgbench writes its transaction logs and reads copies of the scripts; pgscope, as root, reads
the logs from there and archives them into the run folder.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pgscope.errors import RefusedError
from pgscope.leftovers import claim
from pgscope.proc import RunAs, server_account
from pgscope.target.conn import ConnParams

FALLBACK_ACCOUNT = "nobody"
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
SERVICE = "pgscope"  # the section of the service file that carries the SSL key's passphrase


def load_account(requested: str | None) -> RunAs:
    """The account for the load's programs. Not root: the current user. Root: `requested`,
    else `postgres`, else `nobody`: never root itself."""
    if os.geteuid() != 0 or requested:
        return server_account(requested)
    for name in ("postgres", FALLBACK_ACCOUNT):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return server_account(name)
    return server_account(None)  # raises: says how to create one


@dataclass(frozen=True)
class LoadUser:
    """The account that runs pgbench and psql, and its private working directory."""

    run_as: RunAs
    workdir: Path

    @classmethod
    @contextlib.contextmanager
    def private(cls, run_as: RunAs, parent: Path) -> Iterator[LoadUser]:
        """A fresh working directory for `run_as` under `parent`, removed on the way out."""
        workdir = Path(tempfile.mkdtemp(prefix="pgscope-load-", dir=parent))
        try:
            claim(workdir)
            run_as.chown(workdir)
            yield cls(run_as, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def directory(self, name: str) -> Path:
        """A subdirectory of the working directory the account can write in."""
        os.close(self._opened(name))
        return self.workdir / name

    def _opened(self, name: str) -> int:
        """The subdirectory `name` of the working directory (made where absent, then the
        account's), open, reached one name at a time from the working directory and never
        through a link. The account owns these folders, and a script's `\\shell` runs as it:
        it can put a link where pgscope, as root, is about to write. A copy written through
        one wrote a script over a root-only file, and gave that file to the account."""
        fd = os.open(self.workdir, _FOLDER)
        try:
            for part in Path(name).parts:
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                    made = True
                except FileExistsError:
                    made = False
                try:
                    child = os.open(part, _FOLDER, dir_fd=fd)
                except OSError as exc:  # ELOOP, ENOTDIR: a link or a file in its place
                    raise RefusedError(
                        f"{self.workdir / name}: not a folder of the load account's own "
                        f"({exc.strerror}); pgscope writes nothing through a link there"
                    ) from None
                os.close(fd)
                fd = child
                if made and self.run_as.switches_user:
                    os.fchown(fd, self.run_as.uid, self.run_as.gid)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def libpq_env(self, conn: ConnParams) -> dict[str, str]:
        """The environment pgbench and psql connect with: the password in PGPASSWORD, and
        the SSL key's passphrase, which libpq takes from no variable, in a service file in
        the working directory (0600, the account's), named by PGSERVICEFILE and PGSERVICE:
        neither ever in their arguments. What pgbench can read, a `\\shell` it runs could
        too; on a user's server shell commands are refused unless --allow-writes."""
        env = conn.env()
        passphrase = conn.secrets.get("sslpassword")
        if passphrase is None:
            return env
        path = self.workdir / "pg_service.conf"
        folder = self._opened(".")
        try:
            # Written once, in a directory the account owns: never through a link.
            fd = os.open(path.name, _NEW_FILE, 0o600, dir_fd=folder)
        except FileExistsError:
            pass  # an earlier program's, still as written
        else:
            with os.fdopen(fd, "w") as service:
                service.write(f"[{SERVICE}]\nsslpassword={passphrase}\n")
                if self.run_as.switches_user:
                    os.fchown(service.fileno(), self.run_as.uid, self.run_as.gid)
        finally:
            os.close(folder)
        return {**env, "PGSERVICEFILE": str(path), "PGSERVICE": SERVICE}

    def readable_copy(self, source: Path, slot: str) -> Path:
        """A copy of `source` the account can read, keeping its file name (pgbench and psql
        name the script in their messages). Copied by pgscope, so a file only root may read
        is passed on: the user who gave it to pgscope could read it."""
        folder = self._opened(f"files/{slot}")
        try:
            # A fresh file each time: whatever is there (an earlier step's copy, or a link the
            # account put in its place) is removed, never written through.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(source.name, dir_fd=folder)
            fd = os.open(source.name, _NEW_FILE, 0o600, dir_fd=folder)
        except FileExistsError:
            raise RefusedError(
                f"{self.workdir / 'files' / slot / source.name}: made again while pgscope "
                f"replaced it; pgscope writes nothing through a link there"
            ) from None
        finally:
            os.close(folder)
        with os.fdopen(fd, "wb") as copy, source.open("rb") as original:
            shutil.copyfileobj(original, copy)
            if self.run_as.switches_user:
                os.fchown(copy.fileno(), self.run_as.uid, self.run_as.gid)
        return self.workdir / "files" / slot / source.name
