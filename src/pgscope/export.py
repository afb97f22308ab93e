"""A run's store as plain files, one per table (`pgscope export`): for tools that read CSV or
Parquet and not DuckDB. Each file is written beside its place and renamed over it, so a file
that is there is whole; the store itself is only read."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import duckdb

from pgscope.errors import EnvironmentProblem, UsageError
from pgscope.store import RunStore

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
    """Every table of the run's store into `out` (default: `export/` in the run folder) as
    `<table>.<fmt>`, in the store's table order."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: expected {' or '.join(FORMATS)}")
    store = RunStore.open(run_dir)
    try:
        folder = out if out is not None else run_dir / DEFAULT_FOLDER
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise EnvironmentProblem(f"cannot create {folder}: {exc.strerror or exc}") from None
        tables = [
            str(row["table_name"])
            for row in store.query(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = 'main' AND table_type = 'BASE TABLE' ORDER BY table_name"
            )
        ]
        return [_copy(store.db, table, folder / f"{table}.{fmt}", fmt) for table in tables]
    finally:
        store.close()


# A spreadsheet takes a cell that starts with one of these for a formula (=HYPERLINK(...),
# a DDE call): a query text or an application name is anyone's who can connect to the server.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _rows(db: duckdb.DuckDBPyConnection, table: str, fmt: str) -> str:
    """What to copy out of `table`: as it is, or for CSV with every text cell a spreadsheet
    would evaluate prefixed with `'`, which makes it text (OWASP's advice on CSV injection);
    numbers and the other types are left alone."""
    name = '"' + table.replace('"', '""') + '"'
    if fmt != "csv":
        return name
    columns = db.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'main' AND table_name = ? ORDER BY ordinal_position",
        [table],
    ).fetchall()
    starts = ", ".join(f"chr({ord(c)})" for c in FORMULA_STARTS)
    selected = []
    for column, data_type in columns:
        quoted = '"' + str(column).replace('"', '""') + '"'
        if data_type == "VARCHAR":
            quoted = (
                f"CASE WHEN left({quoted}, 1) IN ({starts}) THEN chr(39) || {quoted} "
                f"ELSE {quoted} END AS {quoted}"
            )
        selected.append(quoted)
    return f"(SELECT {', '.join(selected)} FROM {name})"


def _copy(db: duckdb.DuckDBPyConnection, table: str, path: Path, fmt: str) -> ExportedTable:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    quoted = str(temp).replace("'", "''")
    try:
        db.execute(f"COPY {_rows(db, table, fmt)} TO '{quoted}' {FORMATS[fmt]}")
        os.replace(temp, path)
    except (OSError, duckdb.IOException) as exc:
        with contextlib.suppress(OSError):
            temp.unlink()
        reason = exc.strerror if isinstance(exc, OSError) else str(exc).splitlines()[0]
        raise EnvironmentProblem(f"cannot write {path}: {reason or exc}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    count = db.execute(f'SELECT count(*) FROM "{table}"').fetchone()
    return ExportedTable(table, path, int(count[0]) if count else 0)
