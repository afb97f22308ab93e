"""Statements and tables per step, from the `statements` collector's readings: what each
statement and each table did between the reading just before a step's load and the one just
after (warm-up included on both sides).

Counters are differences; live and dead rows, index counts and sizes are the end reading's.
A statement or table first seen at a step's end counts from zero. Pure functions of the store.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields
from typing import Any

import duckdb

from pgscope.analyze.queryid import QueryId
from pgscope.duck import table_exists
from pgscope.tables.statistics import OWN_MARK

BLOCK_BYTES = 8192  # PostgreSQL's default block size: temp and shared blocks are counted in it


@dataclass(frozen=True)
class StatementStep:
    """One statement's work during one step (pg_stat_statements)."""

    step_id: int
    queryid: QueryId
    calls: float
    exec_ms: float
    plan_ms: float
    rows: float
    shared_hit: float
    shared_read: float
    shared_dirtied: float
    shared_written: float
    temp_read: float
    temp_written: float
    wal_records: float
    wal_fpi: float
    wal_bytes: float
    jit_ms: float
    # Every other part of its time pg_stat_statements reports apart (store version 6; 0 in
    # older stores and on servers whose view lacks the column).
    read_ms: float = 0.0  # reading shared blocks (track_io_timing)
    write_ms: float = 0.0
    temp_read_ms: float = 0.0
    temp_write_ms: float = 0.0
    local_read_ms: float = 0.0
    local_write_ms: float = 0.0
    jit_generation_ms: float = 0.0
    jit_inlining_ms: float = 0.0
    jit_optimization_ms: float = 0.0
    jit_emission_ms: float = 0.0
    jit_deform_ms: float = 0.0
    jit_functions: float = 0.0
    toplevel: bool = True  # False: run nested in a function, trigger or check

    @property
    def total_ms(self) -> float:
        return self.exec_ms + self.plan_ms


@dataclass(frozen=True)
class FunctionStep:
    """One function's calls and time during one step (pg_stat_user_functions)."""

    step_id: int
    funcid: int
    name: str
    calls: float
    total_ms: float  # with the functions it called
    self_ms: float  # its own


@dataclass(frozen=True)
class IndexDef:
    relname: str
    indexname: str
    definition: str  # pg_get_indexdef
    valid: bool

    @property
    def columns(self) -> list[str]:
        """The indexed columns (or expressions), in order."""
        inside = self.definition[self.definition.find("(") + 1 : self.definition.rfind(")")]
        return [c.strip().strip('"') for c in inside.split(",") if c.strip()]


@dataclass(frozen=True)
class TableStep:
    """One table's statistics during one step (pg_stat_user_tables, pg_statio_user_tables)."""

    step_id: int
    relname: str
    seq_scan: float
    seq_tup_read: float
    idx_scan: float
    idx_tup_fetch: float
    n_tup_ins: float
    n_tup_upd: float
    n_tup_hot_upd: float
    n_tup_del: float
    vacuums: float
    analyzes: float
    heap_blks_read: float
    heap_blks_hit: float
    idx_blks_read: float
    idx_blks_hit: float
    n_live_tup: float  # at the step's end
    n_dead_tup: float
    indexes: int
    heap_bytes: float
    index_bytes: float
    root: str | None = None  # the root of its partition tree, where it is a partition
    n_mod_since_analyze: float = 0.0  # rows changed since its statistics were last gathered


@dataclass(frozen=True)
class Statements:
    """The section: per step, what statements and tables did; the statements' texts."""

    read: bool = False  # the collector ran
    statements_read: bool = False  # pg_stat_statements was there to read
    statements: list[StatementStep] = field(default_factory=list)
    tables: list[TableStep] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict)  # queryid (as text) -> normalised SQL
    # queryid (as text) -> the sequential scans with a filter in its generic plan (embedded)
    seq_filters: dict[str, list[SeqFilter]] = field(default_factory=dict)
    functions: list[FunctionStep] = field(default_factory=list)
    indexes: list[IndexDef] = field(default_factory=list)
    # Per step, the transactions pgbench ran between the step's two readings of
    # pg_stat_statements, warm-up included (a sweep's measured window leaves it out); none
    # where no pgbench ran (an observation reads the statements at its windows' edges).
    xacts_read: dict[int, float] = field(default_factory=dict)

    def root_of(self, relation: str) -> str:
        """The table a partition belongs to (its tree's root), or the relation itself."""
        return next((t.root for t in self.tables if t.relname == relation and t.root), relation)

    def indexes_on(self, relation: str) -> list[IndexDef]:
        return [i for i in self.indexes if i.relname in (relation, self.root_of(relation))]


@dataclass(frozen=True)
class SeqFilter:
    """A sequential scan that filters rows in a statement's plan: an index on `columns` of
    `relation` would serve the filter."""

    relation: str
    filter: str  # as EXPLAIN shows it: "(customer = $1)"
    columns: list[str]


# Counters are differences between a step's two readings; gauges are the end reading's.
TABLE_GAUGES = (
    "n_live_tup", "n_dead_tup", "indexes", "heap_bytes", "index_bytes", "n_mod_since_analyze"
)  # fmt: skip
_STATEMENT_COUNTERS = tuple(
    f.name for f in fields(StatementStep) if f.name not in ("step_id", "queryid", "toplevel")
)
_TABLE_COUNTERS = tuple(
    f.name for f in fields(TableStep) if f.name not in ("step_id", "relname", "root", *TABLE_GAUGES)
)
_INTS = ("step_id", "indexes")


def _deltas(counters: tuple[str, ...]) -> str:
    return ", ".join(
        f"greatest(0, coalesce(e.{c}, 0) - coalesce(s.{c}, 0)) AS {c}" for c in counters
    )


def read(db: duckdb.DuckDBPyConnection) -> Statements:
    if not table_exists(db, "table_readings"):
        return Statements()
    # The last word: an observation that found the load in another database says again.
    absent = db.execute(
        "SELECT count(*) FROM (SELECT detail FROM events WHERE kind = 'statements' "
        "ORDER BY ts_us DESC LIMIT 1) WHERE detail LIKE '%absent%'"
    ).fetchone()
    # A statement run both at top level and nested has a row of each (toplevel true/false);
    # stores from before store version 6 counted top-level statements only (NULL).
    statements = [
        StatementStep(
            int(r[0]),
            int(r[1]),
            **{c: float(v) for c, v in zip(_STATEMENT_COUNTERS, r[3:], strict=True)},
            toplevel=r[2] is not False,
        )
        for r in db.execute(
            f"SELECT e.step_id, e.queryid, e.toplevel, {_deltas(_STATEMENT_COUNTERS)} "
            "FROM statement_readings e LEFT JOIN statement_readings s "
            "ON s.step_id = e.step_id AND s.queryid = e.queryid AND s.mark = 'start' "
            "AND s.toplevel IS NOT DISTINCT FROM e.toplevel "
            "WHERE e.mark = 'end' ORDER BY e.step_id, e.queryid, e.toplevel DESC"
        ).fetchall()
        if r[3]  # called during the step
    ]
    gauges = ", ".join(f"coalesce(e.{c}, 0) AS {c}" for c in TABLE_GAUGES)
    names = ("step_id", "relname", "root", *_TABLE_COUNTERS, *TABLE_GAUGES)
    tables = [
        _table_step(dict(zip(names, r, strict=True)))
        for r in db.execute(
            f"SELECT e.step_id, e.relname, e.root, {_deltas(_TABLE_COUNTERS)}, {gauges} "
            "FROM table_readings e LEFT JOIN table_readings s "
            "ON s.step_id = e.step_id AND s.relname = e.relname AND s.mark = 'start' "
            "WHERE e.mark = 'end' ORDER BY e.step_id, e.relname"
        ).fetchall()
    ]
    functions = [
        FunctionStep(int(step), int(funcid), str(name), float(calls), float(total), float(own))
        for step, funcid, name, calls, total, own in db.execute(
            "SELECT e.step_id, e.funcid, any_value(e.name), "
            f"{_deltas(('calls', 'total_ms', 'self_ms'))} "
            "FROM function_readings e LEFT JOIN function_readings s "
            "ON s.step_id = e.step_id AND s.funcid = e.funcid AND s.mark = 'start' "
            "WHERE e.mark = 'end' GROUP BY ALL ORDER BY 1, 2"
        ).fetchall()
        if calls
    ]
    indexes = [
        IndexDef(str(r), str(i), str(d), bool(v))
        for r, i, d, v in db.execute(
            "SELECT relname, indexname, any_value(definition), bool_and(valid) "
            "FROM table_indexes GROUP BY 1, 2 ORDER BY 1, 2"
        ).fetchall()
    ]
    # pgscope's own sessions turn tracking off with a statement that is itself tracked, after
    # asking which settings they may set (marked: target/conn.py OWN_MARK).
    own = {
        int(q)
        for (q,) in db.execute(
            "SELECT queryid FROM statement_texts WHERE query ILIKE 'SET pg_stat_statements.track%' "
            "OR starts_with(query, ?)",
            [OWN_MARK],
        ).fetchall()
    }
    # seen running in pgscope's sessions
    own |= {int(q) for (q,) in db.execute("SELECT queryid FROM statement_own").fetchall()}
    statements = [s for s in statements if s.queryid not in own]
    called = {s.queryid for s in statements}
    texts = {
        str(q): str(t)
        for q, t in db.execute(
            "SELECT queryid, min(query) FROM statement_texts GROUP BY 1 ORDER BY 1"
        ).fetchall()
        if int(q) in called
    }
    # The generic plans: the statements collector's (embedded clusters), else the explain
    # collector's estimated plans (a server pgscope did not start).
    plans = db.execute(
        "SELECT queryid, plan FROM statement_plans WHERE plan IS NOT NULL "
        "UNION ALL SELECT queryid, plan FROM plan_estimates WHERE plan IS NOT NULL "
        "AND queryid NOT IN (SELECT queryid FROM statement_plans WHERE plan IS NOT NULL)"
    ).fetchall()
    filters = {str(q): found for q, plan in plans if (found := seq_filters(json.loads(plan)))}
    xacts_read = {
        int(step): float(xacts)
        for step, xacts in db.execute(
            "SELECT step_id, sum(xacts) FROM latency_seconds GROUP BY 1 ORDER BY 1"
        ).fetchall()
        if xacts
    }
    return Statements(
        read=True,
        statements_read=not (absent and absent[0]),
        statements=statements,
        tables=tables,
        texts=texts,
        seq_filters=filters,
        functions=functions,
        indexes=indexes,
        xacts_read=xacts_read,
    )


# A column compared in a filter: `(customer = $1)`, `((code)::text = $2)`, `(t.x > $1)`.
_COMPARED = re.compile(
    r"\(*(?:\w+\.)?(\w+)\)?(?:::[\w ]+)?\s*(?:=|<>|!=|<=|>=|<|>|~~\*?|!~~|IS\b|IN\b|= ANY)"
)


def seq_filters(explained: Any) -> list[SeqFilter]:
    """The sequential scans with a filter in EXPLAIN (FORMAT JSON)'s output, outermost first."""
    found: list[SeqFilter] = []

    def walk(node: dict[str, Any]) -> None:
        if node.get("Node Type") == "Seq Scan" and node.get("Filter"):
            text = str(node["Filter"])
            columns = list(dict.fromkeys(m for m in _COMPARED.findall(text) if not m.isdigit()))
            found.append(SeqFilter(str(node.get("Relation Name", "?")), text, columns))
        for child in node.get("Plans", []):
            walk(child)

    for entry in explained if isinstance(explained, list) else [explained]:
        if isinstance(entry, dict) and isinstance(entry.get("Plan"), dict):
            walk(entry["Plan"])
    return found


def _table_step(row: dict[str, Any]) -> TableStep:
    values: dict[str, Any] = {
        k: (str(v) if v is not None else None)
        if k in ("relname", "root")
        else int(v)
        if k in _INTS
        else float(v)
        for k, v in row.items()
    }
    return TableStep(**values)
