"""DuckDB helpers shared by the run store (which writes runs) and the analyses (which read
them), so that reading a run needs no part of the writing side."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import duckdb

# No extension is ever installed or loaded behind our back: a run store is a DuckDB file, and a
# file of another kind (SQLite, say) must be an error, not a download from the internet.
CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}


def connect(path: str = ":memory:", *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection that never fetches nor loads an extension on its own."""
    return duckdb.connect(path, read_only=read_only, config=dict(CONFIG))


def table_exists(db: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Collectors create their tables when they start: a run without one has none."""
    row = db.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]
    ).fetchone()
    return bool(row and row[0])


def column_exists(db: duckdb.DuckDBPyConnection, table: str, column: str) -> bool:
    """Columns added in a later version: a store written before has none."""
    row = db.execute(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = ? AND column_name = ?",
        [table, column],
    ).fetchone()
    return bool(row and row[0])


class Queryable(Protocol):
    """What the analyses need of an open run store: rows as dicts, and which tables exist."""

    def query(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]: ...

    def has_table(self, name: str) -> bool: ...
