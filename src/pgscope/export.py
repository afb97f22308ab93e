"""A run's store as plain files, one per table (`pgscope export`): for tools that read CSV or
Parquet and not DuckDB. The store is only read.

A run folder may be someone else's (sent for a second opinion), and `export` may run as root,
so nothing in the folder steers a write: a table's file is named from pgscope's own list of
its tables (pgscope.tables declares them), never from the store, whose table names could
hold a quote (`x" TO '/root/y'`) or a path (`../../y`); a table not on that list is not
exported. Files
are written into a fresh folder only pgscope can write in, made inside the export folder, then
renamed into place (a rename replaces a link there, never writes through it); an export
folder that is itself a link is refused. Every step is taken from a descriptor of the export
folder, so the folder cannot be swapped for a link while it runs either.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb

from pgscope import tables
from pgscope.errors import EnvironmentProblem, InputFileError, UsageError
from pgscope.store import STORE_FILE, RunStore

FORMATS = {
    # CSV with a header; BIGINT query ids and microsecond times stay exact digits.
    "csv": "(FORMAT csv, HEADER true)",
    # zstd, as the per-step transaction logs are.
    "parquet": "(FORMAT parquet, COMPRESSION zstd)",
}
DEFAULT_FOLDER = "export"  # inside the run folder


@dataclass(frozen=True)
class ExportedTable:
    table: str
    path: Path
    rows: int


def export_run(run_dir: Path, fmt: str, out: Path | None = None) -> list[ExportedTable]:
    """Every known table of the run's store into `out` (default: `export/` in the run folder)
    as `<table>.<fmt>`, in the store's table order."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: expected {' or '.join(FORMATS)}")
    folder = out if out is not None else run_dir / DEFAULT_FOLDER
    if not (run_dir / STORE_FILE).is_file():  # said before a folder is made for nothing
        RunStore.open(run_dir)
    with _private_folder(folder) as (folder_fd, scratch_fd):
        # DuckDB writes through the descriptor's path: the scratch folder itself, whatever
        # is done to the names above it.
        writable = Path(f"/proc/self/fd/{scratch_fd}")
        store = RunStore.open(run_dir, writable=writable)
        try:
            written = []
            for table in sorted(t for t in tables.declared() if store.has_table(t)):
                name = f"{table}.{fmt}"
                rows = _copy(store.db, table, writable / name, fmt, folder / name)
                try:
                    os.replace(name, name, src_dir_fd=scratch_fd, dst_dir_fd=folder_fd)
                except OSError as exc:
                    raise EnvironmentProblem(
                        f"cannot write {folder / name}: {exc.strerror or exc}"
                    ) from None
                written.append(ExportedTable(table, folder / name, rows))
            return written
        finally:
            store.close()


@contextlib.contextmanager
def _private_folder(folder: Path) -> Iterator[tuple[int, int]]:
    """`folder` (made if missing; refused if it is a link) and a fresh folder of pgscope's own
    inside it, as descriptors. The scratch folder is removed on the way out, and `folder` too
    when it was made here and nothing was written into it."""
    made = not os.path.lexists(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        pass  # a link, a file: said below
    except OSError as exc:
        raise EnvironmentProblem(f"cannot create {folder}: {exc.strerror or exc}") from None
    try:
        folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if folder.is_symlink():
            raise InputFileError(
                f"{folder} is a symbolic link: pgscope export writes only into a folder of its "
                f"own (give the folder it points to with --out)"
            ) from None
        raise EnvironmentProblem(f"cannot write in {folder}: {exc.strerror or exc}") from None
    scratch = f".export-{secrets.token_hex(6)}"
    try:
        try:
            os.mkdir(scratch, 0o700, dir_fd=folder_fd)
            scratch_fd = os.open(
                scratch,
                os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                dir_fd=folder_fd,
            )
        except OSError as exc:
            raise EnvironmentProblem(f"cannot write in {folder}: {exc.strerror or exc}") from None
        try:
            yield folder_fd, scratch_fd
        finally:
            for name in os.listdir(scratch_fd):  # what a failed copy left
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=scratch_fd)
            os.close(scratch_fd)
            with contextlib.suppress(OSError):
                os.rmdir(scratch, dir_fd=folder_fd)
    finally:
        os.close(folder_fd)
        if made:
            with contextlib.suppress(OSError):  # not empty: something was exported
                folder.rmdir()


# A spreadsheet takes a cell that starts with one of these for a formula (=HYPERLINK(...),
# a DDE call): a query text or an application name is anyone's who can connect to the server.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _rows(table: str, fmt: str) -> str:
    """What to copy out of `table`: as it is, or for CSV with every text cell a spreadsheet
    would evaluate prefixed with `'`, which makes it text (OWASP's advice on CSV injection);
    numbers and the other types are left alone. The columns are the table's declared ones."""
    name = '"' + table.replace('"', '""') + '"'
    if fmt != "csv":
        return name
    starts = ", ".join(f"chr({ord(c)})" for c in FORMULA_STARTS)
    selected = []
    for column in tables.of(table).columns:
        quoted = f'"{column.name}"'
        if column.type == "VARCHAR":
            quoted = (
                f"CASE WHEN left({quoted}, 1) IN ({starts}) THEN chr(39) || {quoted} "
                f"ELSE {quoted} END AS {quoted}"
            )
        selected.append(quoted)
    return f"(SELECT {', '.join(selected)} FROM {name})"


def _copy(db: duckdb.DuckDBPyConnection, table: str, path: Path, fmt: str, shown: Path) -> int:
    """`table` (a declared table: a plain name, quoted all the same) into `path`; its row
    count. `shown`: where the user will find it, for a message."""
    quoted = '"' + table.replace('"', '""') + '"'
    target = "'" + str(path).replace("'", "''") + "'"
    try:
        db.execute(f"COPY {_rows(table, fmt)} TO {target} {FORMATS[fmt]}")
    except (OSError, duckdb.IOException) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc).splitlines()[0]
        raise EnvironmentProblem(f"cannot write {shown}: {reason or exc}") from None
    count = db.execute(f"SELECT count(*) FROM {quoted}").fetchone()
    return int(count[0]) if count else 0
