"""The run store's tables, declared once: each table's columns, their types, and the store
version that added them.

Everything else derives from these declarations: the writers create their tables from them
(`RunStore.create_tables`), a store opened for reading shows each declared table as the
declaration says, whatever version wrote it (`shadow`: a column a store predates reads as
NULL, a table it lacks as empty), `pgscope export` writes these tables and no other, and
`tests/test_tables.py` checks docs/store.md against them. A table is declared in the module of
its area (`run`, `sampling`, `statistics`, `tracing`, `profiles`); this package finds them.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the types only: the repository's commands start without DuckDB
    import duckdb

# The store's version, in `schema_info`: 2 added collectors and collector_gaps; 3
# timeline.instance and step_instances; 4 the steps' transaction outcomes and workload_error;
# 5 the steps' reconnects and connection_ms; 6 every time column of pg_stat_statements (and
# whether a statement ran at top level), functions, indexes, partition roots, sampled actual
# plans, and the lock and its holder behind each blocked session; 7 the server's identity in
# `run` (system identifier, host, port: what a central repository files a run under); 8
# open-loop steps (the steps' offered rate, schedule lag, skipped, late and served
# transactions; step_objectives; the seconds' lag and skipped); 9 the text of what a session
# ran without a query id (activity_samples.command); 10 the span of the log's lines each row
# of server_errors counted (from_us, to_us); 11 the estimated plans of the heaviest
# statements on a server pgscope did not start (plan_estimates). Collectors' tables are
# created when a collector starts: a run without one has none, whatever the version.
STORE_VERSION = 11
TYPES = frozenset({"BIGINT", "INTEGER", "SMALLINT", "DOUBLE", "VARCHAR", "BOOLEAN"})


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    constraint: str = ""  # "NOT NULL", "PRIMARY KEY"
    since: int = 1  # the store version that added it

    def ddl(self) -> str:
        return " ".join(part for part in (self.name, self.type, self.constraint) if part)


@dataclass(frozen=True)
class Table:
    name: str
    writer: str  # who writes it: "run" (the runner and pgscope itself) or a collector's name
    columns: tuple[Column, ...]
    since: int = 1  # the store version that added it
    # A time series: the column holding the time each row describes (epoch microseconds),
    # which a central repository partitions the table by, month by month
    # (pgscope.repository). None: a table that grows with steps, statements or collectors.
    series: str | None = None
    # Rows are changed after they are written (a step's results, the run's end, a
    # collector's state): a repository that takes an unfinished run in instalments
    # (`observe --push`) takes such a table whole each time, the others from where it
    # stopped.
    updated: bool = False

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def ddl(self) -> str:
        body = ",\n    ".join(c.ddl() for c in self.columns)
        return f"CREATE TABLE IF NOT EXISTS {self.name} (\n    {body}\n);"


def table(
    name: str,
    writer: str,
    *columns: str,
    since: int = 1,
    series: str | None = None,
    updated: bool = False,
) -> Table:
    """A table from its columns written as SQL: "name TYPE [constraint] [@version]", the last
    part for a column added after the table (its store version)."""
    table_since = since
    parsed = []
    for text in columns:
        words = text.split()
        since = table_since
        if words[-1].startswith("@"):
            since = int(words.pop()[1:])
        column = Column(words[0], words[1], " ".join(words[2:]), since)
        if column.type not in TYPES:
            raise ValueError(f"table {name}: column {column.name} has type {column.type}")
        parsed.append(column)
    if series is not None and series not in {c.name for c in parsed}:
        raise ValueError(f"table {name}: its series column {series} is not one of its columns")
    return Table(name, writer, tuple(parsed), table_since, series, updated)


@cache
def declared() -> dict[str, Table]:
    """Every declared table by name, in the order of their modules (run first)."""
    found: dict[str, Table] = {}
    for module in ("run", *sorted(_areas() - {"run"})):
        for declared_table in importlib.import_module(f"{__name__}.{module}").TABLES:
            if declared_table.name in found:
                raise ValueError(f"table {declared_table.name} declared twice")
            found[declared_table.name] = declared_table
    return found


def _areas() -> set[str]:
    return {m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")}


def of(name: str) -> Table:
    try:
        return declared()[name]
    except KeyError:
        raise KeyError(f"no store table {name!r} is declared in pgscope.tables") from None


def written_by(writer: str) -> tuple[Table, ...]:
    return tuple(t for t in declared().values() if t.writer == writer)


def stored_columns(db: duckdb.DuckDBPyConnection) -> dict[str, set[str]]:
    """The columns of each base table in the store's main schema (a view is no table), asked
    of DuckDB's own catalog by its full name (a store's macro could shadow an unqualified
    one)."""
    columns: dict[str, set[str]] = {}
    for name, column in db.execute(
        "SELECT c.table_name, c.column_name FROM system.main.duckdb_columns() c "
        "JOIN system.main.duckdb_tables() t USING (database_name, schema_name, table_name) "
        "WHERE c.database_name = current_database() AND c.schema_name = 'main' "
        "AND NOT t.temporary"
    ).fetchall():
        columns.setdefault(str(name), set()).add(str(column))
    return columns


def catalog_of(db: duckdb.DuckDBPyConnection) -> str:
    """The store's catalog name, quoted, to name its base tables beside a temporary view of
    the same name (`shadow`): f'{catalog_of(db)}.main."steps"'."""
    row = db.execute("SELECT current_database()").fetchone()
    assert row is not None
    return '"' + str(row[0]).replace('"', '""') + '"'


def shadow(db: duckdb.DuckDBPyConnection) -> frozenset[str]:
    """Show every declared table, to a connection that reads a store, as declared: a view of
    the same name in the connection's temporary catalog (read first) selects the declared
    columns of the store's own table, NULL for a column the store predates, or no row for a
    table the store lacks. Only the store's base tables are read: a view the file holds
    under a declared name is never used. Returns the declared tables the store holds."""
    catalog = catalog_of(db)
    columns = stored_columns(db)
    for t in declared().values():
        have = columns.get(t.name)
        selected = ", ".join(
            f'"{c.name}"' if have and c.name in have else f'CAST(NULL AS {c.type}) AS "{c.name}"'
            for c in t.columns
        )
        source = f' FROM {catalog}.main."{t.name}"' if have else " WHERE false"
        db.execute(f'CREATE OR REPLACE TEMP VIEW "{t.name}" AS SELECT {selected}{source}')
    return frozenset(name for name in declared() if name in columns)


def markdown() -> str:
    """Every declared table as docs/store.md lists it (between its markers): name, who writes
    it, columns with their types, and the store version that added what came later."""
    lines = ["| table | written by | columns |", "|---|---|---|"]
    for t in declared().values():
        columns = ", ".join(
            f"`{c.name}` {c.type}{f' (v{c.since})' if c.since > t.since else ''}" for c in t.columns
        )
        since = f" (v{t.since})" if t.since > 1 else ""
        lines.append(f"| `{t.name}`{since} | {t.writer} | {columns} |")
    return "\n".join(lines) + "\n"
