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


def confine(db: duckdb.DuckDBPyConnection, writable: str | None = None) -> None:
    """Shut a connection to a run store off from everything but that file, before it reads
    anything from it, and lock that in.

    A store may come from someone else (a run folder sent for a second opinion), and a view,
    a table macro or a generated column in it is SQL that runs when read: a `run` view over
    `read_text('/proc/self/environ')` put root's environment on the screen of `pgscope runs`.
    With external access off DuckDB opens no file but the store (no `read_text`, `read_csv`,
    `COPY`, `ATTACH`, extension or Python object); locked, no statement turns it back on.
    `writable`: a folder `COPY ... TO` may still write in (an export's private folder,
    ending in a slash). Allowed folders can only be set while access is on, hence the order.
    A connection to a file this process opened before shares its database, already
    confined: then nothing changes."""
    locked = db.execute("SELECT current_setting('lock_configuration')").fetchone()
    if locked and locked[0]:
        return
    if writable is not None:
        db.execute("SET allowed_directories = ?", [[writable]])
    db.execute("SET enable_external_access = false")
    db.execute("SET lock_configuration = true")


def foreign_code(db: duckdb.DuckDBPyConnection) -> list[str]:
    """The views and macros a database file defines, by name: pgscope writes neither in a
    store, so a store that has any was not written by it (or was changed since), and its SQL
    is not to be run. Asked of DuckDB's own catalog functions by their full name: a store's
    macro can shadow an unqualified `duckdb_views()` (and with it information_schema)."""
    rows = db.execute(
        "SELECT 'view ' || view_name FROM system.main.duckdb_views() "
        "WHERE NOT internal AND NOT temporary "
        "UNION ALL SELECT 'macro ' || function_name FROM system.main.duckdb_functions() "
        "WHERE NOT internal AND database_name <> 'temp' ORDER BY 1"
    ).fetchall()
    return [str(row[0]) for row in rows]


def table_exists(db: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether the store's file holds the table: collectors create their tables when they
    start, so a run without one has none. Only a base table of the store counts (a view of
    the same name is not one, nor the temporary view `pgscope.tables.shadow` shows it as)."""
    row = db.execute(
        "SELECT count(*) FROM system.main.duckdb_tables() "
        "WHERE table_name = ? AND schema_name = 'main' AND NOT temporary",
        [name],
    ).fetchone()
    return bool(row and row[0])


class Queryable(Protocol):
    """What the analyses need of an open run store: rows as dicts, and which tables exist."""

    def query(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]: ...

    def has_table(self, name: str) -> bool: ...
