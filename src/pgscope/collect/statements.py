"""Which statements and which tables a step's time went to: `pg_stat_statements` and the
per-table statistics, read just before and just after each step's load.

What it records, per step boundary ('start', 'end'):
- for each statement of the target database (`pg_stat_statements`, top-level only): calls,
  execution and planning time, rows, shared blocks hit/read/dirtied/written, temp blocks
  read/written, WAL records/full-page images/bytes, JIT time; its normalised text once;
- for each user table (`pg_stat_user_tables`, `pg_statio_user_tables`): sequential and
  index scans and the rows they read, rows inserted/updated (HOT or not)/deleted, live and
  dead rows, vacuums and analyzes, heap and index blocks read/hit, its index count and the
  heap's and indexes' size.
A step's figures are the differences between its two readings (`analyze/statements.py`).

Where `pg_stat_statements` is absent (a server without it), the table statistics are still
read and the statement-level findings say they could not be assessed. On an embedded
cluster pgscope loads it (`shared_preload_libraries`) and creates the extension; pgscope's
own sessions there set `pg_stat_statements.track = none`, so its monitoring queries are not
counted among the workload's.

On an embedded cluster it also keeps the generic plan of the step's busiest statements (the
top 3 by execution time, each once a run): `PREPARE` of the normalised text, then `EXPLAIN
(FORMAT JSON) EXECUTE` with `plan_cache_mode = force_generic_plan` (PostgreSQL 15 has no
`EXPLAIN (GENERIC_PLAN)`), so a sequential scan's filter names the column an index would
serve. Never on a user's server: it plans the user's statements in pgscope's session.

What it costs: two readings per step, none during the load (one query over
`pg_stat_statements`, whose size is bounded by `pg_stat_statements.max`, and one over the
user tables), and on embedded clusters up to three plannings after a step.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import psycopg
from pydantic import BaseModel, ConfigDict, Field

from pgscope.collect.base import Availability, Collector, CollectorContext, CollectorEnv, StepInfo
from pgscope.errors import TargetError
from pgscope.store import RunStore, now_us

APPLICATION_NAME = "pgscope-statements"

SCHEMA = """
CREATE TABLE IF NOT EXISTS statement_readings (
    step_id INTEGER NOT NULL, mark VARCHAR NOT NULL, ts_us BIGINT NOT NULL,
    queryid BIGINT NOT NULL, calls DOUBLE, exec_ms DOUBLE, plan_ms DOUBLE, rows DOUBLE,
    shared_hit DOUBLE, shared_read DOUBLE, shared_dirtied DOUBLE, shared_written DOUBLE,
    temp_read DOUBLE, temp_written DOUBLE, wal_records DOUBLE, wal_fpi DOUBLE,
    wal_bytes DOUBLE, jit_ms DOUBLE, read_ms DOUBLE, write_ms DOUBLE
);
CREATE TABLE IF NOT EXISTS statement_texts (queryid BIGINT NOT NULL, query VARCHAR);
CREATE TABLE IF NOT EXISTS statement_own (queryid BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS statement_plans (
    step_id INTEGER NOT NULL, queryid BIGINT NOT NULL, plan VARCHAR, error VARCHAR
);
CREATE TABLE IF NOT EXISTS table_readings (
    step_id INTEGER NOT NULL, mark VARCHAR NOT NULL, ts_us BIGINT NOT NULL,
    relname VARCHAR NOT NULL, seq_scan DOUBLE, seq_tup_read DOUBLE, idx_scan DOUBLE,
    idx_tup_fetch DOUBLE, n_tup_ins DOUBLE, n_tup_upd DOUBLE, n_tup_hot_upd DOUBLE,
    n_tup_del DOUBLE, n_live_tup DOUBLE, n_dead_tup DOUBLE, vacuums DOUBLE, analyzes DOUBLE,
    heap_blks_read DOUBLE, heap_blks_hit DOUBLE, idx_blks_read DOUBLE, idx_blks_hit DOUBLE,
    indexes DOUBLE, heap_bytes DOUBLE, index_bytes DOUBLE
);
"""

# Column -> the view's names for it, newest first (PostgreSQL renamed some: total_time became
# total_exec_time in 13, blk_read_time and blk_write_time shared_blk_read_time and
# shared_blk_write_time in 17; several are absent before 13 or 15).
STATEMENT_COLUMNS: dict[str, tuple[str, ...]] = {
    "calls": ("calls",),
    "exec_ms": ("total_exec_time", "total_time"),
    "plan_ms": ("total_plan_time",),
    "rows": ("rows",),
    "shared_hit": ("shared_blks_hit",),
    "shared_read": ("shared_blks_read",),
    "shared_dirtied": ("shared_blks_dirtied",),
    "shared_written": ("shared_blks_written",),
    "temp_read": ("temp_blks_read",),
    "temp_written": ("temp_blks_written",),
    "wal_records": ("wal_records",),
    "wal_fpi": ("wal_fpi",),
    "wal_bytes": ("wal_bytes",),
    "jit_ms": ("jit_generation_time",),  # + the other jit_*_time columns, summed below
    # Time reading and writing shared blocks (track_io_timing on; on by default in embedded
    # clusters)
    "read_ms": ("shared_blk_read_time", "blk_read_time"),
    "write_ms": ("shared_blk_write_time", "blk_write_time"),
}
JIT_TIMES = ("jit_inlining_time", "jit_optimization_time", "jit_emission_time")

# The third column marks pgscope's own statements, which its sessions cannot keep out of
# pg_stat_statements where the role may not set pg_stat_statements.track (a pg_monitor role on
# a user's server): those its sessions run at the moment of the reading, this one and the
# activity sampler's batch above all (its pg_sleep makes its execution time the wall clock:
# on a quiet server it would be the statement with the most execution time).
STATEMENTS_SQL = """
WITH own AS (
  SELECT query_id FROM pg_stat_activity
  WHERE application_name LIKE 'pgscope%' AND query_id IS NOT NULL
)
SELECT s.queryid, row_to_json(s)::text, s.queryid IN (SELECT query_id FROM own)
FROM pg_stat_statements(false) s
WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND s.queryid IS NOT NULL
"""
# pg_stat_statements(false) skips reading the texts' file; texts are read once per new id.
TEXTS_SQL = """
SELECT DISTINCT ON (queryid) queryid, left(query, 2000) FROM pg_stat_statements(true)
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND queryid = ANY(%s)
"""

TABLES_SQL = """
SELECT CASE WHEN t.schemaname = 'public' THEN t.relname
            ELSE t.schemaname || '.' || t.relname END,
       t.seq_scan, t.seq_tup_read, t.idx_scan, t.idx_tup_fetch, t.n_tup_ins, t.n_tup_upd,
       t.n_tup_hot_upd, t.n_tup_del, t.n_live_tup, t.n_dead_tup,
       t.vacuum_count + t.autovacuum_count, t.analyze_count + t.autoanalyze_count,
       io.heap_blks_read, io.heap_blks_hit, io.idx_blks_read, io.idx_blks_hit,
       (SELECT count(*) FROM pg_index i WHERE i.indrelid = t.relid),
       pg_relation_size(t.relid), pg_indexes_size(t.relid)
FROM pg_stat_user_tables t JOIN pg_statio_user_tables io USING (relid)
"""
TABLE_COLUMNS = (
    "relname",
    "seq_scan",
    "seq_tup_read",
    "idx_scan",
    "idx_tup_fetch",
    "n_tup_ins",
    "n_tup_upd",
    "n_tup_hot_upd",
    "n_tup_del",
    "n_live_tup",
    "n_dead_tup",
    "vacuums",
    "analyzes",
    "heap_blks_read",
    "heap_blks_hit",
    "idx_blks_read",
    "idx_blks_hit",
    "indexes",
    "heap_bytes",
    "index_bytes",
)
# The load's sessions flush their table statistics when they exit: the end reading waits
# (this long at most) for them to be gone.
CLIENTS_GONE_S = 2.0
EXPLAINED_PER_STEP = 3
# Statements whose plan EXPLAIN shows without running them (a normalised text: $1, $2 ...).
_EXPLAINABLE = re.compile(r"^\s*(select|with|update|delete|insert)\b", re.IGNORECASE)
_PARAMETER = re.compile(r"\$(\d+)")


class StatementsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    wait_for_load: bool = Field(
        True,
        description="at a step's end, wait (2 s at most) for pgbench's sessions to exit and "
        "flush their table statistics; off where the load is not pgscope's (observe)",
    )


def _has_statements(session: psycopg.Connection[Any]) -> bool:
    row = session.execute(
        "SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'"
    ).fetchone()
    return row is not None


class StatementsCollector(Collector):
    name = "statements"
    summary = "pg_stat_statements and per-table statistics, read before and after each step"
    cost = "two readings per step, none during the load"
    default_in_runs = True
    Options = StatementsOptions

    options: StatementsOptions

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        if env.conn is None:  # embedded: the extension ships with the server (contrib)
            return Availability.yes()
        try:
            with env.conn.connect(application_name=APPLICATION_NAME) as session:
                session.execute(TABLES_SQL).fetchall()
        except TargetError as exc:
            return Availability.no(str(exc))
        except psycopg.Error as exc:
            return Availability.no(
                f"cannot read the table statistics: {exc.diag.message_primary or exc}"
            )
        return Availability.yes()

    def startup_settings(self, env: CollectorEnv) -> dict[str, str]:
        if env.target_kind != "embedded":
            return {}
        control = env.pg.sharedir() / "extension" / "pg_stat_statements.control"
        if not control.is_file():
            return {}
        return {"shared_preload_libraries": "pg_stat_statements"}

    def start(self, ctx: CollectorContext) -> None:
        self.ctx = ctx
        self.store: RunStore = ctx.store
        ctx.store.ensure_schema(SCHEMA)
        self.known_texts: dict[int, str] = {}
        self.explained: set[int] = set()
        self.own: set[int] = set()  # pgscope's own statements, as seen so far
        self.started_ms: dict[int, float] = {}  # exec time per statement at the step's start
        self.explain = ctx.env.target_kind == "embedded"
        with ctx.conn.connect(application_name=APPLICATION_NAME) as session:
            if ctx.env.target_kind == "embedded":
                try:
                    session.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                except psycopg.Error as exc:
                    ctx.say(
                        f"statements: pg_stat_statements unavailable "
                        f"({exc.diag.message_primary or exc}); table statistics only"
                    )
            self.statements = _has_statements(session)
        if not self.statements:
            ctx.say(
                "statements: pg_stat_statements is not installed in the target database; "
                "query-level findings will not be assessed (CREATE EXTENSION "
                "pg_stat_statements, with it in shared_preload_libraries)"
            )
        self.store.add_event(
            "statements",
            "pg_stat_statements read" if self.statements else "pg_stat_statements absent",
            None,
        )

    def step_started(self, step: StepInfo) -> None:
        self._reading([(step.step_id, "start")])

    def step_finished(self, step: StepInfo) -> None:
        self._reading([(step.step_id, "end")])

    def window_edge(self, ending: StepInfo, starting: StepInfo) -> None:
        """One reading ends a window and begins the next: the windows share its instant."""
        self._reading([(ending.step_id, "end"), (starting.step_id, "start")])

    def _reading(self, marks: list[tuple[int, str]]) -> None:
        """One reading of the statements and tables, stored once per (step, mark) it stands
        for."""
        ending = [step_id for step_id, mark in marks if mark == "end"]
        with self.ctx.conn.connect(application_name=APPLICATION_NAME) as session:
            if ending and self.options.wait_for_load:
                _wait_for_clients_to_leave(session)
            ts = now_us()
            tables = session.execute(TABLES_SQL).fetchall()
            statements = session.execute(STATEMENTS_SQL).fetchall() if self.statements else []
            new = [int(q) for q, _, _ in statements if int(q) not in self.known_texts]
            texts = session.execute(TEXTS_SQL, [new]).fetchall() if new else []
        for step_id, mark in marks:
            self._store_reading(step_id, mark, ts, tables, statements)
        exec_ms: dict[int, float] = {}
        for queryid, payload, _ in statements:
            row = json.loads(payload)
            ms = next((row[n] for n in STATEMENT_COLUMNS["exec_ms"] if row.get(n) is not None), 0)
            exec_ms[int(queryid)] = float(ms or 0.0)
        own = [int(q) for q, _, mine in statements if mine and int(q) not in self.own]
        if own:
            self.own.update(own)
            self.store.append("statement_own", {"queryid": own})
        if texts:
            self.store.append(
                "statement_texts",
                {"queryid": [int(q) for q, _ in texts], "query": [t for _, t in texts]},
            )
            self.known_texts.update((int(q), str(t)) for q, t in texts)
        if ending and self.explain:
            self._explain_busiest(ending[0], exec_ms)
        if any(mark == "start" for _, mark in marks):
            self.started_ms = exec_ms

    def _store_reading(
        self,
        step_id: int,
        mark: str,
        ts: int,
        tables: list[tuple[Any, ...]],
        statements: list[tuple[Any, ...]],
    ) -> None:
        self.store.append(
            "table_readings",
            {
                "step_id": [step_id] * len(tables),
                "mark": [mark] * len(tables),
                "ts_us": [ts] * len(tables),
                **{name: [row[i] for row in tables] for i, name in enumerate(TABLE_COLUMNS)},
            },
        )
        if not statements:
            return
        columns: dict[str, list[Any]] = {
            "step_id": [],
            "mark": [],
            "ts_us": [],
            "queryid": [],
            **{k: [] for k in STATEMENT_COLUMNS},
        }
        for queryid, payload, _ in statements:
            row = json.loads(payload)
            columns["step_id"].append(step_id)
            columns["mark"].append(mark)
            columns["ts_us"].append(ts)
            columns["queryid"].append(int(queryid))
            for column, names in STATEMENT_COLUMNS.items():
                value = next((row[n] for n in names if row.get(n) is not None), None)
                if column == "jit_ms" and value is not None:
                    value += sum(row.get(n) or 0.0 for n in JIT_TIMES)
                columns[column].append(value)
        self.store.append("statement_readings", columns)

    def _explain_busiest(self, step_id: int, exec_ms: dict[int, float]) -> None:
        """The generic plans of the step's busiest statements not yet explained."""
        spent = {q: ms - self.started_ms.get(q, 0.0) for q, ms in exec_ms.items()}
        busiest = sorted((q for q in spent if spent[q] > 0), key=lambda q: -spent[q])
        chosen = [
            q
            for q in busiest[:EXPLAINED_PER_STEP]
            if q not in self.explained and _EXPLAINABLE.match(self.known_texts.get(q, ""))
        ]
        if not chosen:
            return
        plans: dict[str, list[Any]] = {"step_id": [], "queryid": [], "plan": [], "error": []}
        with self.ctx.conn.connect(application_name=APPLICATION_NAME) as session:
            session.execute("SET plan_cache_mode = force_generic_plan")
            for queryid in chosen:
                plan, error = _generic_plan(session, self.known_texts[queryid])
                self.explained.add(queryid)
                for key, value in zip(plans, (step_id, queryid, plan, error), strict=True):
                    plans[key].append(value)
        self.store.append("statement_plans", plans)

    def stop(self) -> str | None:
        return None


def _generic_plan(session: psycopg.Connection[Any], text: str) -> tuple[str | None, str | None]:
    """(EXPLAIN's JSON of the statement's generic plan, None) or (None, why not). Its
    parameters get NULLs: a generic plan does not depend on their values, and EXPLAIN without
    ANALYZE runs nothing."""
    count = max((int(n) for n in _PARAMETER.findall(text)), default=0)
    arguments = f"({', '.join(['NULL'] * count)})" if count else ""
    try:
        session.execute(f"PREPARE pgscope_plan AS {text}")
        try:
            row = session.execute(
                f"EXPLAIN (FORMAT JSON) EXECUTE pgscope_plan{arguments}"
            ).fetchone()
        finally:
            session.execute("DEALLOCATE pgscope_plan")
    except psycopg.Error as exc:
        return None, str(exc.diag.message_primary or exc)
    return (json.dumps(row[0]) if row else None), None


def _wait_for_clients_to_leave(session: psycopg.Connection[Any]) -> None:
    """Until the load's sessions have exited (each flushes its table statistics then)."""
    deadline = time.monotonic() + CLIENTS_GONE_S
    while time.monotonic() < deadline:
        row = session.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
            "AND application_name = 'pgbench'"
        ).fetchone()
        if not row or not row[0]:
            return
        time.sleep(0.02)
