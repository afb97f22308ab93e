"""DuckDB helpers shared by the run store (which writes runs) and the analyses (which read
them), so that reading a run needs no part of the writing side."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import duckdb

# No extension is ever installed or loaded behind our back: a run store is a DuckDB file, and a
# file of another kind (SQLite, say) must be an error, not a download from the internet.
CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}


# The storage format a run store is written in. DuckDB 2.0 writes its own format by default,
# which no DuckDB before 2.0 opens (the 1.5 CLI refuses it); 1.0's format is read by every
# DuckDB since, at no cost measured here (docs/store.md). A file keeps the format it was
# created in, whoever writes to it later.
STORAGE_VERSION = "v1.0.0"


def connect(
    path: str = ":memory:", *, read_only: bool = False, storage_version: str | None = None
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection that never fetches nor loads an extension on its own; a database
    file it creates is written in `storage_version`'s format (DuckDB's latest when None)."""
    config: dict[str, str | bool | int | float | list[str]] = dict(CONFIG)
    if storage_version is not None:
        config["storage_compatibility_version"] = storage_version
    return duckdb.connect(path, read_only=read_only, config=config)


def table_exists(db: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether the store's file holds the table: collectors create their tables when they
    start, so a run without one has none. (A store opened for reading also shows every
    declared table as a view, empty where the file has none: `pgscope.tables.shadow`.)"""
    row = db.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = ? "
        "AND table_catalog = current_database() AND table_schema = 'main' "
        "AND table_type = 'BASE TABLE'",
        [name],
    ).fetchone()
    return bool(row and row[0])


class Queryable(Protocol):
    """What the analyses need of an open run store: rows as dicts, and which tables exist."""

    def query(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]: ...

    def has_table(self, name: str) -> bool: ...
