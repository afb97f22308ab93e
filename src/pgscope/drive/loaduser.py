"""Who runs the programs that execute user-provided files, and where they work.

pgbench scripts (`\\shell`, `\\setshell`) and init SQL (psql's `\\!`) run shell commands: run
as root, a spec file shared between colleagues would be root code. So pgbench and psql run as
the unprivileged account that owns the embedded server (`--run-as`, else `postgres`; on a
user's server, the same account, or `nobody` where there is no `postgres`). Root stays only
with the kernel-side collectors (bpftrace, perf) and pgscope itself.

That account may not reach the results folder (under `/root`, say) or the user's scripts, so
each run gets a private directory, and that directory is root's: the account could otherwise
replace anything in it, between two steps, with a link, and root would then write through the
link (a script whose `\\shell` swapped its copy for a link to a root file made root overwrite
that file with the script and hand it to the account). So:

    pgscope-load-XXXX/        root, 0711: only root makes or replaces anything here
      files/N/script.sql      root, the account's group, 0750/0640: copies the account reads
      work/                   the account's, 0700: where pgbench -i and psql start
      steps/NNNN/             the account's, 0700: a step's pgbench writes its logs here
      taken/NNNN/             root, 0700: the logs, moved out of the account's reach

Root never writes, chowns or follows a link inside the account's folders: it makes them (in
its own folder, where no one else can have put anything) and, after a step, moves pgbench's
logs out of them by name (a rename moves a link, never what it points to), keeping only
regular files the account owns.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pgscope.files import copy_new
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
    """The account that runs pgbench and psql, and the private directory it works in."""

    run_as: RunAs
    base: Path  # root's; only root writes in it
    workdir: Path  # the account's own folder in `base`

    @classmethod
    @contextlib.contextmanager
    def private(cls, run_as: RunAs, parent: Path) -> Iterator[LoadUser]:
        """A fresh private directory for `run_as` under `parent`, removed on the way out."""
        base = Path(tempfile.mkdtemp(prefix="pgscope-load-", dir=parent))
        try:
            claim(base)
            os.chmod(base, 0o711)  # the account reaches its folders, and lists nothing
            user = cls(run_as, base, base / "work")
            user._folder(user.workdir, 0o700, owned=True)
            yield user
        finally:
            shutil.rmtree(base, ignore_errors=True)  # never follows a link it meets

    def _folder(self, path: Path, mode: int = 0o711, *, owned: bool = False) -> Path:
        """A folder under `base` made by root (idempotent), with `mode`: the account's own
        (`owned`), else root's with the account's group (which 0750 lets read it). Everything
        above it is root's, so nothing can have been planted in its place."""
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            return path  # made by an earlier call
        if owned:
            self.run_as.chown(path)
        elif self.run_as.switches_user:
            os.chown(path, -1, self.run_as.gid)
        os.chmod(path, mode)
        return path

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
        folder = os.open(self.workdir, _FOLDER)  # the account's: never through a link
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

    def step_folder(self, name: str) -> Path:
        """A folder the account writes in for one step (pgbench's transaction logs)."""
        return self._folder(self._folder(self.base / "steps") / name, 0o700, owned=True)

    def readable_copy(self, source: Path, slot: str) -> Path:
        """A copy of `source` the account can read and not replace, keeping its file name
        (pgbench and psql name the script in their messages): root's, in a folder of root's,
        readable by the account's group. Copied by pgscope, so a file only root may read is
        passed on: the user who gave it to pgscope could read it."""
        folder = self._folder(self._folder(self.base / "files") / slot, 0o750)
        target = folder / source.name
        # A fresh name, renamed over the last step's copy: a pgbench still reading that one
        # reads it whole.
        temp = folder / f".{source.name}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        group = self.run_as.gid if self.run_as.switches_user else None
        copy_new(source, temp, mode=0o640, group=group)
        os.replace(temp, target)
        return target

    def take_logs(self, prefix: Path) -> list[Path]:
        """pgbench's per-transaction logs `prefix`.PID (and .PID.THREAD for -j > 1), written
        by the account in a step folder: moved by name into a folder of root's, and of those
        only regular files the account owns, with no other name (a hard link), are kept.
        A link, a FIFO or another's file planted under such a name is removed unread: root
        reads the logs back and archives them into the run folder, and would otherwise copy
        whatever a script pointed it at there."""
        pattern = re.compile(re.escape(prefix.name) + r"\.\d+(\.\d+)?")
        taken = self._folder(self._folder(self.base / "taken", 0o700) / prefix.parent.name, 0o700)
        with contextlib.suppress(FileNotFoundError):
            folder = os.open(prefix.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                for name in os.listdir(folder):
                    if pattern.fullmatch(name):
                        os.rename(name, taken / name, src_dir_fd=folder)
            finally:
                os.close(folder)
        kept = []
        for path in sorted(taken.iterdir()):
            if not pattern.fullmatch(path.name):
                continue
            found = os.lstat(path)
            if (
                stat.S_ISREG(found.st_mode)
                and found.st_uid == self.run_as.uid
                and found.st_nlink == 1
            ):
                kept.append(path)
            elif stat.S_ISDIR(found.st_mode):
                # A folder named like a log (a script's `\\shell mkdir`) ended the run with
                # IsADirectoryError. Out of the account's reach here: removed without
                # following a link inside it.
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink()
        return kept
