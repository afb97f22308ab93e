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


def _copy(db: duckdb.DuckDBPyConnection, table: str, path: Path, fmt: str) -> ExportedTable:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    quoted = str(temp).replace("'", "''")
    try:
        db.execute(f"COPY \"{table}\" TO '{quoted}' {FORMATS[fmt]}")
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
