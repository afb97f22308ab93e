"""Finding the PostgreSQL binaries pgscope drives (postgres, initdb, pgbench, ...).

Order: an explicit `--pg-bin` directory, else `pg_config --bindir`, else the newest
`/usr/lib/postgresql/*/bin` (Debian's layout, where `pg_config` on PATH may belong to a
client-only package).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pgscope.errors import EnvironmentProblem

DEBIAN_ROOT = Path("/usr/lib/postgresql")


@dataclass(frozen=True)
class PgBinaries:
    bindir: Path
    how_found: str  # "--pg-bin", "pg_config" or "/usr/lib/postgresql"

    def path(self, name: str) -> Path:
        """The path of one program; raises a one-line error naming the directory if absent."""
        candidate = self.bindir / name
        if not candidate.is_file():
            raise EnvironmentProblem(
                f"{name} not found in {self.bindir} (found via {self.how_found}); "
                f"install the PostgreSQL server package or pass --pg-bin DIR"
            )
        return candidate

    def has(self, name: str) -> bool:
        return (self.bindir / name).is_file()

    def version(self, name: str = "postgres") -> str:
        """`postgres --version` output, e.g. 'postgres (PostgreSQL) 15.18 (Debian ...)'."""
        out = subprocess.run(
            [str(self.path(name)), "--version"], capture_output=True, text=True, timeout=30
        )
        return out.stdout.strip()

    def sharedir(self) -> Path:
        """Where extensions' control files live (`pg_config --sharedir` of this install)."""
        if self.has("pg_config"):
            out = subprocess.run(
                [str(self.path("pg_config")), "--sharedir"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if out.returncode == 0 and out.stdout.strip():
                return Path(out.stdout.strip())
        return Path("/usr/share/postgresql") / str(self.major_version())  # Debian's layout

    def has_library(self, name: str) -> bool:
        """Whether this install has the loadable module `name` (contrib's auto_explain, ...):
        in `pg_config --pkglibdir`, else in the lib folder beside bin (Debian's and the
        wheels' layout)."""
        folders = [self.bindir.parent / "lib", self.bindir.parent / "lib" / "postgresql"]
        if self.has("pg_config"):
            out = subprocess.run(
                [str(self.path("pg_config")), "--pkglibdir"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if out.returncode == 0 and out.stdout.strip():
                folders.insert(0, Path(out.stdout.strip()))
        return any((folder / f"{name}.so").is_file() for folder in folders)

    def major_version(self) -> int:
        match = re.search(r"\)\s+(\d+)", self.version())
        if not match:
            raise EnvironmentProblem(f"cannot read the PostgreSQL version of {self.bindir}")
        return int(match.group(1))


def _newest_debian_bindir() -> Path | None:
    if not DEBIAN_ROOT.is_dir():
        return None
    versions = []
    for entry in DEBIAN_ROOT.iterdir():
        if entry.name.isdigit() and (entry / "bin" / "postgres").is_file():
            versions.append(int(entry.name))
    return DEBIAN_ROOT / str(max(versions)) / "bin" if versions else None


def _pg_config_bindir() -> Path | None:
    pg_config = shutil.which("pg_config")
    if not pg_config:
        return None
    try:
        out = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, timeout=30, check=True
        )
    except (subprocess.SubprocessError, OSError):
        return None
    bindir = Path(out.stdout.strip())
    # Debian's client-only pg_config reports /usr/bin, which has no postgres server.
    return bindir if (bindir / "postgres").is_file() else None


def find_binaries(pg_bin: Path | None = None, *, need_server: bool = True) -> PgBinaries:
    """Locate the binaries. `need_server=False` accepts a directory with only client tools
    (pgbench, psql), which is all an existing-server target needs."""
    wanted = "postgres" if need_server else "pgbench"
    if pg_bin is not None:
        if not pg_bin.is_dir():
            raise EnvironmentProblem(f"--pg-bin {pg_bin}: no such directory")
        if not (pg_bin / wanted).is_file():
            raise EnvironmentProblem(
                f"--pg-bin {pg_bin}: {wanted} not found there; point it at a PostgreSQL bin "
                f"directory such as {DEBIAN_ROOT}/15/bin"
            )
        # Absolute: the server and pgbench start in other working directories.
        return PgBinaries(pg_bin.absolute(), "--pg-bin")
    bindir = _pg_config_bindir()
    if bindir is not None:
        return PgBinaries(bindir, "pg_config")
    bindir = _newest_debian_bindir()
    if bindir is not None:
        return PgBinaries(bindir, str(DEBIAN_ROOT))
    if not need_server:
        pgbench = shutil.which("pgbench")
        if pgbench:
            return PgBinaries(Path(pgbench).parent, "PATH")
    raise EnvironmentProblem(
        f"no PostgreSQL {'server ' if need_server else ''}binaries found (pg_config, "
        f"{DEBIAN_ROOT}/*/bin); install postgresql (apt-get install postgresql) "
        f"or pass --pg-bin DIR"
    )
