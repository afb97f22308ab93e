"""Which statements and which tables a step's time went to: `pg_stat_statements` and the
per-table statistics, read just before and just after each step's load.

What it records, per step boundary ('start', 'end'):
- for each statement of the target database (`pg_stat_statements`, at top level or nested in
  a function, a trigger or a foreign key's check, where `pg_stat_statements.track = all`):
  calls, rows, every part of its time the view reports apart (planning, execution, reading
  and writing shared, local and temporary blocks, JIT's generation, inlining, optimisation,
  emission and deforming), shared blocks hit/read/dirtied/written, temp blocks read/written,
  WAL records/full-page images/bytes; its normalised text once;
- for each user function (`pg_stat_user_functions`, where `track_functions` counts them):
  calls, total and self time;
- for each user table (`pg_stat_user_tables`, `pg_statio_user_tables`): sequential and
  index scans and the rows they read, rows inserted/updated (HOT or not)/deleted, live and
  dead rows and rows changed since the last analyze, vacuums and analyzes, heap and index
  blocks read/hit, its index count, the heap's and indexes' size, and the root of its
  partition tree; each index's definition, once.
A step's figures are the differences between its two readings (`analyze/statements.py`).

On an embedded cluster it decides the settings that open these branches (nested statements,
planning time, functions) and samples actual plans with auto_explain while the load runs
(`plancapture.py`).

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

What it costs: two readings per step (one query over `pg_stat_statements`, whose size is
bounded by `pg_stat_statements.max`, one over the user functions and one over the user
tables), and on embedded clusters up to three plannings after a step, and during the load the
plans auto_explain samples (about `plans_per_s` a second) and the counting the settings above
turn on (docs/benchmarks.md measures them together).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from typing import Any

import psycopg
from pydantic import BaseModel, ConfigDict, Field

from pgscope.collect.base import Availability, Collector, CollectorContext, CollectorEnv, StepInfo
from pgscope.collect.statistics.plancapture import SETTINGS as PLAN_SETTINGS
from pgscope.collect.statistics.plancapture import PlanCapture
from pgscope.errors import TargetError
from pgscope.store import RunStore, now_us
from pgscope.target.conn import ConnParams

APPLICATION_NAME = "pgscope-statements"


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
    "toplevel": ("toplevel",),
    "temp_read_ms": ("temp_blk_read_time",),
    "temp_write_ms": ("temp_blk_write_time",),
    "local_read_ms": ("local_blk_read_time",),
    "local_write_ms": ("local_blk_write_time",),
    "jit_generation_ms": ("jit_generation_time",),
    "jit_inlining_ms": ("jit_inlining_time",),
    "jit_optimization_ms": ("jit_optimization_time",),
    "jit_emission_ms": ("jit_emission_time",),
    "jit_deform_ms": ("jit_deform_time",),  # 17+: part of the generation time
    "jit_functions": ("jit_functions",),
}
JIT_TIMES = ("jit_inlining_time", "jit_optimization_time", "jit_emission_time")
# The view's columns a reading keeps that add up (counts and times), by their view names.
_SUMMED = frozenset(
    name for names in STATEMENT_COLUMNS.values() for name in names if name != "toplevel"
) | frozenset(JIT_TIMES)

# The third column marks pgscope's own statements, which its sessions cannot keep out of
# pg_stat_statements where the role may not set pg_stat_statements.track (a pg_monitor role on
# a user's server): those its sessions run at the moment of the reading, this one and the
# activity sampler's batch above all (its pg_sleep makes its execution time the wall clock:
# on a quiet server it would be the statement with the most execution time).
# The statements of the databases read (`%(databases)s`: the connection's own, or the busy
# ones an observation found), from the one database whose pg_stat_statements view is read.
STATEMENTS_SQL = """
WITH own AS (
  SELECT query_id FROM pg_stat_activity
  WHERE application_name LIKE 'pgscope%%' AND query_id IS NOT NULL
)
SELECT s.queryid, row_to_json(s)::text, s.queryid IN (SELECT query_id FROM own)
FROM pg_stat_statements(false) s
WHERE s.dbid IN (SELECT oid FROM pg_database WHERE datname = ANY(%(databases)s))
  AND s.queryid IS NOT NULL
"""
# pg_stat_statements(false) skips reading the texts' file; texts are read once per new id
# (a statement run both at top level and nested has one id and one text).
TEXTS_SQL = """
SELECT DISTINCT ON (queryid) queryid, left(query, 2000) FROM pg_stat_statements(true)
WHERE dbid IN (SELECT oid FROM pg_database WHERE datname = ANY(%(databases)s))
  AND queryid = ANY(%(ids)s)
"""
# Which databases client sessions are busy in (not idle: running a statement, or inside a
# transaction), pgscope's own left out: one look of up to BUSY_LOOKS, BUSY_LOOK_S apart.
BUSY_SQL = """
SELECT datname, count(*) FROM pg_stat_activity
WHERE backend_type = 'client backend' AND state IS DISTINCT FROM 'idle' AND datname IS NOT NULL
  AND pid <> pg_backend_pid() AND coalesce(application_name, '') NOT LIKE 'pgscope%'
GROUP BY datname
"""
BUSY_LOOKS = 5
BUSY_LOOK_S = 0.1
# Looks that found the same busy databases in a row: enough to stop looking.
BUSY_AGREED = 3
# A database whose sessions were busy in fewer looks than this share of the busiest's is
# not among the busy ones (a stray session of a tool).
BUSY_SHARE = 0.1

# A relation's name as pgscope writes it: `name` in public, `schema.name` elsewhere.
_NAME = (
    "CASE WHEN {n}.nspname = 'public' THEN {c}.relname ELSE {n}.nspname || '.' || {c}.relname END"
)
TABLES_SQL = f"""
SELECT CASE WHEN t.schemaname = 'public' THEN t.relname
            ELSE t.schemaname || '.' || t.relname END,
       t.seq_scan, t.seq_tup_read, t.idx_scan, t.idx_tup_fetch, t.n_tup_ins, t.n_tup_upd,
       t.n_tup_hot_upd, t.n_tup_del, t.n_live_tup, t.n_dead_tup,
       t.vacuum_count + t.autovacuum_count, t.analyze_count + t.autoanalyze_count,
       io.heap_blks_read, io.heap_blks_hit, io.idx_blks_read, io.idx_blks_hit,
       (SELECT count(*) FROM pg_index i WHERE i.indrelid = t.relid),
       pg_relation_size(t.relid), pg_indexes_size(t.relid),
       (SELECT {_NAME.format(n="rn", c="rc")} FROM pg_class rc
        JOIN pg_namespace rn ON rn.oid = rc.relnamespace
        WHERE rc.oid = pg_partition_root(t.relid) AND rc.oid <> t.relid),
       t.n_mod_since_analyze
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
    "root",
    "n_mod_since_analyze",
)
FUNCTIONS_SQL = """
SELECT funcid, CASE WHEN schemaname = 'public' THEN funcname
                    ELSE schemaname || '.' || funcname END,
       calls, total_time, self_time
FROM pg_stat_user_functions
"""
FUNCTION_COLUMNS = ("funcid", "name", "calls", "total_ms", "self_ms")
INDEXES_SQL = f"""
SELECT {_NAME.format(n="n", c="t")}, i.relname, pg_get_indexdef(x.indexrelid), x.indisvalid
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
"""
INDEX_COLUMNS = ("relname", "indexname", "definition", "valid")
# The settings that decide how far a statement's time can be followed (said in the account
# where a branch is closed), as the server has them.
COUNTING_SQL = """
SELECT name, reset_val FROM pg_settings
WHERE name IN ('pg_stat_statements.track', 'pg_stat_statements.track_planning',
               'track_functions', 'track_io_timing', 'shared_preload_libraries',
               'compute_query_id')
"""
# What opens the branches of a statement's time on a cluster pgscope starts: statements
# nested in functions and triggers, planning time, functions' time.
COUNTING = {
    "pg_stat_statements.track": "all",
    "pg_stat_statements.track_planning": "on",
    "track_functions": "all",
}
# The load's sessions flush their table statistics when they exit: the end reading waits
# (this long at most) for them to be gone.
CLIENTS_GONE_S = 2.0
EXPLAINED_PER_STEP = 3
# Statements whose plan EXPLAIN shows without running them (a normalised text: $1, $2 ...).
_EXPLAINABLE = re.compile(r"^\s*(select|with|update|delete|insert)\b", re.IGNORECASE)
_PARAMETER = re.compile(r"\$(\d+)")
# A typed literal (`interval '1 day'`, `date '2026-01-01'`) whose string pg_stat_statements
# replaced with a parameter: `interval $2` is no SQL PREPARE accepts ("syntax error at or near
# $2"), so the plan of a statement holding one was never stored. Written as the cast it is.
_FIELDS = r"(?:year|month|day|hour|minute|second)"
_TYPED_PARAMETER = re.compile(
    r"(?<![\w.\"$])(?P<type>"
    r"interval(?:\s*\(\s*\d+\s*\))?|date|timestamptz|timetz"
    r"|(?:timestamp|time)(?:\s*\(\s*\d+\s*\))?(?:\s+with(?:out)?\s+time\s+zone)?"
    r"|numeric|decimal|integer|int[248]?|bigint|smallint|real|float[48]|double\s+precision"
    r"|boolean|bool|text|varchar|char|uuid|jsonb?|inet|cidr|macaddr8?|bytea|money|xml"
    r"|tsquery|tsvector|oid|regclass|point)"
    r"\s+\$(?P<n>\d+)"
    rf"(?P<fields>\s+{_FIELDS}(?:\s+to\s+{_FIELDS})?(?:\s*\(\s*\d+\s*\))?)?(?![\w$])",
    re.IGNORECASE,
)


def preparable(text: str) -> str:
    """A normalised statement as PREPARE reads it: each typed literal whose constant became a
    parameter (`interval $2`, `interval $1 day`, `date $3`) as the cast it stands for
    (`CAST($2 AS interval)`). Quoted text and identifiers are left as they are."""
    out, last = [], 0
    for start, end, quoted in _quoted_spans(text):
        if quoted:
            continue
        out.append(text[last:start])
        out.append(_TYPED_PARAMETER.sub(_cast, text[start:end]))
        last = end
    out.append(text[last:])
    return "".join(out)


_QUOTED = re.compile(
    r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|(\$[A-Za-z_]*\$).*?\1|--[^\n]*|/\*.*?\*/", re.S
)


def _cast(match: re.Match[str]) -> str:
    fields = f" {' '.join(match['fields'].split())}" if match["fields"] else ""
    return f"CAST(${match['n']} AS {' '.join(match['type'].split())}{fields})"


def _quoted_spans(text: str) -> list[tuple[int, int, bool]]:
    """`text` cut into (start, end, quoted) spans: '...', "...", $tag$...$tag$ and comments
    quoted, the rest not."""
    spans, i, plain = [], 0, 0
    while (match := _QUOTED.search(text, i)) is not None:
        if match.group(0).startswith("$") and not match.group(1):
            i = match.start() + 1
            continue
        spans.append((plain, match.start(), False))
        spans.append((match.start(), match.end(), True))
        i = plain = match.end()
    spans.append((plain, len(text), False))
    return spans


# The statements whose constants pg_stat_statements replaces with $1, $2 ... (a utility
# statement's text it keeps as it was run: `ALTER ROLE r PASSWORD 'secret'`).
_NORMALISED = re.compile(
    r"^[\s(]*(select|insert|update|delete|merge|with|values|table)\b", re.IGNORECASE
)
_PASSWORD = re.compile(r"password", re.IGNORECASE)
_LITERAL = re.compile(r"'|\$[A-Za-z_]*\$")  # a string's quote, or a dollar quote's
MASK = "'********' (masked by pgscope)"


def masked(text: str | None) -> str | None:
    """A statement's text as pgscope stores it: a utility statement that names a password
    (CREATE or ALTER ROLE/USER ... PASSWORD, a user mapping's OPTIONS (password ...)) kept up
    to and with that word, the rest replaced by MASK; anything else as it is. Comments and
    quotes are no hiding place: the word is looked for anywhere in the text. A normalised
    statement (`SELECT password FROM users WHERE id = $1`) is masked too where a literal
    follows the word (one pg_stat_statements left in its text)."""
    if text is None:
        return text
    found = _PASSWORD.search(text)
    if found is None:
        return text
    if _NORMALISED.match(_uncommented(text)) and not _LITERAL.search(text, found.end()):
        return text
    return f"{text[: found.end()]} {MASK}"


def _uncommented(text: str) -> str:
    """`text` without its leading comments (`/* ... */`, `-- ...`)."""
    while True:
        stripped = text.lstrip()
        if stripped.startswith("--"):
            text = stripped.partition("\n")[2]
        elif stripped.startswith("/*"):
            text = stripped.partition("*/")[2]
        else:
            return stripped


class StatementsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    wait_for_load: bool = Field(
        True,
        description="at a step's end, wait (2 s at most) for pgbench's sessions to exit and "
        "flush their table statistics; off where the load is not pgscope's (observe)",
    )
    plans: bool = Field(
        True,
        description="on clusters pgscope starts: sample actual plans with auto_explain while "
        "the load runs (node times, triggers, nested statements)",
    )
    plans_per_s: float = Field(
        5.0, gt=0, le=100, description="statements sampled a second, about, for their plans"
    )
    follow_load: bool = Field(
        False,
        description="read the statements and tables of the databases the client sessions are "
        "busy in (found by looking at pg_stat_activity at the start, for half a second at "
        "most, and at each window's edge until some are), not the connection's: a server "
        "pgscope does not drive (observe --data-dir connects to database postgres)",
    )


def _has_statements(session: psycopg.Connection[Any]) -> bool:
    row = session.execute(
        "SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'"
    ).fetchone()
    return row is not None


class StatementsCollector(Collector):
    name = "statements"
    summary = (
        "pg_stat_statements, functions and per-table statistics, read before and after each "
        "step; on clusters pgscope starts, actual plans sampled during the load"
    )
    cost = "three readings per step; plans: about 5 sampled statements a second"
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
        settings = {"track_functions": COUNTING["track_functions"]}
        libraries = []
        if (env.pg.sharedir() / "extension" / "pg_stat_statements.control").is_file():
            libraries.append("pg_stat_statements")
            settings.update(COUNTING)
        if self.options.plans and env.pg.has_library("auto_explain"):
            libraries.append("auto_explain")
            settings.update(PLAN_SETTINGS)
        if libraries:
            settings["shared_preload_libraries"] = ",".join(libraries)
        return settings

    def start(self, ctx: CollectorContext) -> None:
        self.ctx = ctx
        self.store: RunStore = ctx.store
        ctx.store.create_tables(self.name)
        # Where the readings come from: the connection's database, or where the load is.
        self.conn = ctx.conn
        self.databases: list[str] = []  # whose statements are read; tables: conn's
        self.followed = False  # a busy database was found (follow_load)
        if self.options.follow_load:
            self._follow(busy_databases(ctx.conn))
        self.known_texts: dict[int, str] = {}
        self.explained: set[int] = set()
        self.own: set[int] = set()  # pgscope's own statements, as seen so far
        self.started_ms: dict[int, float] = {}  # exec time per statement at the step's start
        self.explain = ctx.env.target_kind == "embedded"
        self.known_indexes: set[tuple[str, str]] = set()
        self.plans: PlanCapture | None = None
        with self.conn.connect(application_name=APPLICATION_NAME) as session:
            if not self.databases:
                row = session.execute("SELECT current_database()").fetchone()
                self.databases = [str(row[0])] if row else []
            if ctx.env.target_kind == "embedded":
                try:
                    session.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                except psycopg.Error as exc:
                    ctx.say(
                        f"statements: pg_stat_statements unavailable "
                        f"({exc.diag.message_primary or exc}); table statistics only"
                    )
            self.statements = _has_statements(session)
            if self.explain and self.options.plans:
                self.plans = _plan_capture(session, ctx, self.options.plans_per_s)
        if not self.statements:
            ctx.say(
                f"statements: pg_stat_statements is not installed in database "
                f"{self.databases[0]}; query-level findings will not be assessed (CREATE "
                f"EXTENSION pg_stat_statements there, with it in shared_preload_libraries)"
            )
        self.store.add_event(
            "statements",
            "pg_stat_statements read" if self.statements else "pg_stat_statements absent",
            None,
        )
        self._said_databases()
        with self.conn.connect(application_name=APPLICATION_NAME) as session:
            counting = dict(session.execute(COUNTING_SQL).fetchall())
        counting["plans sampled"] = "on" if self.plans is not None else "off"
        self.store.add_event("statements-settings", json.dumps(counting), None)

    def step_started(self, step: StepInfo) -> None:
        self._reading([(step.step_id, "start")])
        self._plans_started()

    def step_finished(self, step: StepInfo) -> None:
        self._plans_finished(step.step_id)
        self._reading([(step.step_id, "end")])

    def window_edge(self, ending: StepInfo, starting: StepInfo) -> None:
        """One reading ends a window and begins the next: the windows share its instant. An
        observation whose sessions were busy nowhere yet looks again: found, the window
        ends with a reading where it was read, the next begins with one where the load is."""
        self._plans_finished(ending.step_id)
        if self.options.follow_load and not self.followed:
            busy = busy_databases(self.ctx.conn, looks=1)
            if busy and busy != self.databases:
                self._reading([(ending.step_id, "end")])
                self._follow(busy)
                self.store.add_event(
                    "statements",
                    "pg_stat_statements read" if self.statements else "pg_stat_statements absent",
                    None,
                )
                self._said_databases()
                self._reading([(starting.step_id, "start")])
                self._plans_started()
                return
        self._reading([(ending.step_id, "end"), (starting.step_id, "start")])
        self._plans_started()

    def _follow(self, busy: list[str]) -> None:
        """Read the busy databases from now on: their statements through the busiest one's
        pg_stat_statements (it shows every database's), tables in the busiest."""
        if not busy:
            return
        there = replace(self.ctx.conn, params={**self.ctx.conn.params, "dbname": busy[0]})
        try:
            with there.connect(application_name=APPLICATION_NAME) as session:
                self.statements = _has_statements(session)
        except TargetError as exc:  # the role may not connect there (CONNECT revoked)
            self.ctx.say(f"statements: the load runs in database {busy[0]}, not readable: {exc}")
            self.followed = True  # looked for, found, not readable: not asked again
            return
        self.followed = True
        self.databases, self.conn = busy, there

    def _said_databases(self) -> None:
        """Which databases the statements and tables are read in, for the report."""
        if self.options.follow_load:
            found = "busy" if self.followed else "no session busy yet: the connection's"
            self.store.add_event(
                "statements-database",
                json.dumps({"read": self.databases, "tables": self.databases[0], "how": found}),
            )

    def _plans_started(self) -> None:
        self.step_started_us = now_us()
        if self.plans is not None:
            self.plans.step_started()

    def _plans_finished(self, step_id: int) -> None:
        if self.plans is not None:
            self.plans.step_finished(step_id, self.step_started_us)

    def _reading(self, marks: list[tuple[int, str]]) -> None:
        """One reading of the statements, tables and functions, stored once per (step, mark)
        it stands for."""
        ending = [step_id for step_id, mark in marks if mark == "end"]
        databases = {"databases": self.databases}
        with self.conn.connect(application_name=APPLICATION_NAME) as session:
            if ending and self.options.wait_for_load:
                _wait_for_clients_to_leave(session)
            ts = now_us()
            tables = session.execute(TABLES_SQL).fetchall()
            functions = session.execute(FUNCTIONS_SQL).fetchall()
            statements = (
                _per_statement(session.execute(STATEMENTS_SQL, databases).fetchall())
                if self.statements
                else []
            )
            new = list({int(q) for q, _, _ in statements if int(q) not in self.known_texts})
            texts = session.execute(TEXTS_SQL, {**databases, "ids": new}).fetchall() if new else []
            indexes = session.execute(INDEXES_SQL).fetchall() if ending else []
        for step_id, mark in marks:
            self._store_reading(step_id, mark, ts, tables, functions, statements)
        indexes = [row for row in indexes if (row[0], row[1]) not in self.known_indexes]
        if indexes:
            self.known_indexes.update((row[0], row[1]) for row in indexes)
            self.store.append(
                "table_indexes",
                {name: [row[i] for row in indexes] for i, name in enumerate(INDEX_COLUMNS)},
            )
        # Top-level execution time only: a nested statement's time is inside its caller's.
        exec_ms: dict[int, float] = {}
        for queryid, payload, _ in statements:
            row = json.loads(payload)
            if row.get("toplevel") is False:
                continue
            ms = next((row[n] for n in STATEMENT_COLUMNS["exec_ms"] if row.get(n) is not None), 0)
            exec_ms[int(queryid)] = exec_ms.get(int(queryid), 0.0) + float(ms or 0.0)
        own = [int(q) for q, _, mine in statements if mine and int(q) not in self.own]
        if own:
            self.own.update(own)
            self.store.append("statement_own", {"queryid": own})
        if texts:
            # Masked before they are stored: a password's text never reaches the store, its
            # export or a repository.
            texts = [(q, masked(t)) for q, t in texts]
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
        functions: list[tuple[Any, ...]],
        statements: list[tuple[Any, ...]],
    ) -> None:
        self._columns("table_readings", step_id, mark, ts, TABLE_COLUMNS, tables)
        self._columns("function_readings", step_id, mark, ts, FUNCTION_COLUMNS, functions)
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

    def _columns(
        self,
        table: str,
        step_id: int,
        mark: str,
        ts: int,
        names: tuple[str, ...],
        rows: list[tuple[Any, ...]],
    ) -> None:
        self.store.append(
            table,
            {
                "step_id": [step_id] * len(rows),
                "mark": [mark] * len(rows),
                "ts_us": [ts] * len(rows),
                **{name: [row[i] for row in rows] for i, name in enumerate(names)},
            },
        )

    def stop(self) -> str | None:
        return None


def busy_databases(conn: ConnParams, looks: int = BUSY_LOOKS) -> list[str]:
    """The databases client sessions are busy in, busiest first: up to `looks` looks at
    pg_stat_activity, BUSY_LOOK_S apart (fewer once BUSY_AGREED in a row found the same
    ones); none where no session was busy."""
    counts: dict[str, int] = {}
    agreed, last = 0, None
    with conn.connect(application_name=APPLICATION_NAME) as session:
        for look in range(looks):
            found = dict(session.execute(BUSY_SQL).fetchall())
            for datname, busy in found.items():
                counts[str(datname)] = counts.get(str(datname), 0) + int(busy)
            agreed = agreed + 1 if found and set(found) == last else 1
            last = set(found)
            if agreed >= BUSY_AGREED:
                break
            if look < looks - 1:
                time.sleep(BUSY_LOOK_S)
    top = max(counts.values(), default=0)
    return sorted(
        (d for d, n in counts.items() if n and n >= BUSY_SHARE * top),
        key=lambda d: (-counts[d], d),
    )


def _per_statement(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """pg_stat_statements' rows summed per (query id, top level): the view keeps a row per
    role and database running a statement, and a reading that kept them apart would pair
    each start row with every end row of the same id (counting them twice, four times...)."""
    merged: dict[tuple[int, Any], tuple[dict[str, Any], bool]] = {}
    for queryid, payload, own in rows:
        row = json.loads(payload)
        key = (int(queryid), row.get("toplevel"))
        if key not in merged:
            merged[key] = (row, bool(own))
            continue
        kept, kept_own = merged[key]
        for name in _SUMMED:
            value, before = row.get(name), kept.get(name)
            if isinstance(value, int | float) and isinstance(before, int | float):
                kept[name] = before + value
        merged[key] = (kept, kept_own or bool(own))
    return [(q, json.dumps(row), own) for (q, _), (row, own) in merged.items()]


def _plan_capture(
    session: psycopg.Connection[Any], ctx: CollectorContext, plans_per_s: float
) -> PlanCapture | None:
    """The plan capture of this run, where auto_explain is loaded; its log is the run's
    server.log, or the logging collector's file when a spec turned it on."""
    loaded = session.execute(
        "SELECT 1 FROM pg_settings WHERE name = 'auto_explain.sample_rate'"
    ).fetchone()
    if loaded is None:
        ctx.say("statements: auto_explain is not available here; no plans are sampled")
        return None
    current = session.execute("SELECT pg_current_logfile()").fetchone()
    log = ctx.run_dir / "server.log"
    if current is not None and current[0] and ctx.data_dir is not None:
        log = ctx.data_dir / str(current[0])
    return PlanCapture(ctx.conn, ctx.store, log, plans_per_s, ctx.say)


def _generic_plan(session: psycopg.Connection[Any], text: str) -> tuple[str | None, str | None]:
    """(EXPLAIN's JSON of the statement's generic plan, None) or (None, why not). Its
    parameters get NULLs: a generic plan does not depend on their values, and EXPLAIN without
    ANALYZE runs nothing."""
    count = max((int(n) for n in _PARAMETER.findall(text)), default=0)
    arguments = f"({', '.join(['NULL'] * count)})" if count else ""
    try:
        session.execute(f"PREPARE pgscope_plan AS {preparable(text)}")
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
