"""Estimated plans of the heaviest statements, on a server pgscope did not start: where their
execution time is expected to go, when nothing samples their actual plans.

On clusters pgscope starts, auto_explain samples actual plans (`plancapture.py`). On a user's
server pgscope changes no setting, so no plan is sampled and the account of active time
stopped at "the statement's time goes to its execution". This collector asks the server for
the plan it would use, without running anything: at a step's (or an observation window's)
end, at most once every `every_s` seconds, it reads `pg_stat_statements` (the connection's
database's view, or one where the client sessions are busy, found as the statements collector
finds it; the view shows every database's statements, each planned in its own) and takes the
`statements` heaviest top-level statements by execution time since the collector started,
and for each it has not explained in the last `REPLAN_S` seconds asks

- on PostgreSQL 16 and later `EXPLAIN (GENERIC_PLAN, FORMAT JSON) <its normalised text>`;
- before 16, which has no GENERIC_PLAN, `PREPARE pgscope_explain AS <text>`, `EXPLAIN (FORMAT
  JSON) EXECUTE pgscope_explain(NULL, ...)` with a NULL for each parameter
  (`plan_cache_mode = force_generic_plan`: the plan does not depend on the NULLs), then
  `DEALLOCATE`. A text whose parameters' types the server cannot infer is not prepared: its
  error is kept, counted.

EXPLAIN without ANALYZE plans and runs nothing. Only a plain SELECT, INSERT, UPDATE or DELETE
is asked for, read by PostgreSQL's own parser (pglast): one statement, no SELECT INTO, no
locking clause, no data-modifying WITH inside a SELECT; a statement that reads no relation
outside the system catalogs is passed over (there is nothing to place). Before asking, the
session checks, quietly (`to_regclass`, `has_table_privilege`: no error in the server's
log), that its role may read every relation the statement names and may write the one it
writes; a statement it may not explain is passed over and counted, never tried. It asks as
its own role, in its own read-only session (`default_transaction_read_only`, on top of the
read-only guard of a user's server), with `statement_timeout` of `TIMEOUT_MS` and
`lock_timeout` of `LOCK_TIMEOUT_MS`, so a plan never waits long behind a lock.

What it costs, per ask (at most one every `every_s` seconds, 30 by default): one reading of
`pg_stat_statements` without texts, one of the chosen statements' texts, and at most
`statements` (5) plannings, each with one privilege check (and a PREPARE and a DEALLOCATE
before 16). A plan is kept in `plan_estimates` (its JSON, a few kB), a failure as its
message. On clusters pgscope starts it does nothing: their plans are sampled.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from pglast import ast, parse_sql
from pglast.parser import ParseError
from psycopg import sql
from pydantic import BaseModel, ConfigDict, Field

from pgscope.collect.base import Availability, Collector, CollectorContext, CollectorEnv, StepInfo
from pgscope.collect.statistics.statements import busy_databases, masked, preparable
from pgscope.errors import TargetError
from pgscope.labels import READ_ONLY_OPTION
from pgscope.store import now_us
from pgscope.target.conn import ConnParams

APPLICATION_NAME = "pgscope-explain"
TIMEOUT_MS = 2000
LOCK_TIMEOUT_MS = 200
# A statement explained less than this long ago is not explained again.
REPLAN_S = 600.0
# Asks at which a database with pg_stat_statements is looked for, at most.
LOOKS = 10
MAX_TEXT = 20_000  # a longer text is not explained (nor stored)
GENERIC_PLAN_SINCE = 160000

# Top-level execution time per statement and database, the texts left out (cheaper).
TOTALS_SQL = """
SELECT s.queryid, d.datname, sum(s.total_exec_time)
FROM pg_stat_statements(false) s JOIN pg_database d ON d.oid = s.dbid
WHERE s.queryid IS NOT NULL AND s.queryid <> 0 AND s.toplevel
GROUP BY 1, 2
"""
TEXTS_SQL = """
SELECT s.queryid, d.datname, min(s.query)
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE s.queryid = ANY(%(ids)s) AND s.toplevel
GROUP BY 1, 2
"""
PRIVILEGE_SQL = "SELECT pg_catalog.has_table_privilege(pg_catalog.to_regclass(%s), %s)"
HAS_STATEMENTS_SQL = "SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'"
_PARAMETER = re.compile(r"\$(\d+)")
_WRITTEN = {"InsertStmt": "INSERT", "UpdateStmt": "UPDATE", "DeleteStmt": "DELETE"}
_CATALOGS = ("pg_catalog", "information_schema")


class ExplainOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    statements: int = Field(5, ge=1, le=20, description="the heaviest statements explained")
    every_s: float = Field(
        30.0, ge=1, le=3600, description="seconds between two asks, at least (at window edges)"
    )


@dataclass(frozen=True)
class Explainable:
    """A statement's text as it is planned, and the privileges planning it needs."""

    text: str  # preparable(): typed parameters as casts
    parameters: int  # its highest $n
    # (schema or None, relation, privilege) for each relation it names
    needs: tuple[tuple[str | None, str, str], ...]


def explainable(text: str) -> Explainable | None:
    """The statement, if it is one this collector may explain: one plain SELECT (no INTO, no
    locking clause, nothing in it that writes), INSERT, UPDATE or DELETE (nothing in it that
    writes but itself) that names at least one relation outside the system catalogs; None
    otherwise."""
    if not text or len(text) > MAX_TEXT:
        return None
    prepared = preparable(text)
    try:
        statements = parse_sql(prepared)
    except ParseError:
        return None
    if len(statements) != 1:
        return None
    statement = statements[0].stmt
    kind = type(statement).__name__
    if not isinstance(statement, ast.SelectStmt) and kind not in _WRITTEN:
        return None
    written: tuple[str | None, str] | None = None
    if kind in _WRITTEN:
        target = statement.relation  # type: ignore[union-attr]
        written = (target.schemaname, target.relname or "")
    relations: set[tuple[str | None, str]] = set()
    ctes: set[str] = set()
    for node in _nodes(statement):
        if node is not statement and type(node).__name__ in (*_WRITTEN, "MergeStmt"):
            return None  # a data-modifying WITH
        if isinstance(node, ast.SelectStmt) and (node.intoClause or node.lockingClause):
            return None
        if isinstance(node, ast.CommonTableExpr) and node.ctename:
            ctes.add(node.ctename)
        elif isinstance(node, ast.RangeVar) and node.relname:
            relations.add((node.schemaname, node.relname))
    relations = {(s, n) for s, n in relations if s is not None or n not in ctes}
    if written is not None:
        relations.add(written)
    if not any(s not in _CATALOGS and not n.startswith("pg_") for s, n in relations):
        return None
    # An INSERT need not read its target; everything else it names is read.
    read = relations - {written} if kind == "InsertStmt" else relations
    needs = [(schema, name, "SELECT") for schema, name in sorted(read, key=str)]
    if written is not None:
        needs.append((*written, _WRITTEN[kind]))
    count = max((int(n) for n in _PARAMETER.findall(prepared)), default=0)
    return Explainable(prepared, count, tuple(needs))


def _nodes(node: object) -> Iterator[ast.Node]:
    """`node` and every node under it."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, ast.Node):
            yield item
            for cls in type(item).__mro__:
                if cls in (ast.Node, object):
                    continue
                stack.extend(
                    getattr(item, slot, None)
                    for slot in vars(cls).get("__slots__", ())
                    if slot != "ancestors"
                )
        elif isinstance(item, tuple | list):
            stack.extend(item)


@dataclass
class Counts:
    """What the asks did, for the run's events."""

    asks: int = 0
    explained: int = 0
    failed: int = 0
    not_permitted: int = 0  # passed over: its role may not read or write what it names
    not_explainable: int = 0  # not a plain SELECT/INSERT/UPDATE/DELETE, or no user relation
    errors: list[str] = field(default_factory=list)  # the first few failures' messages


class ExplainCollector(Collector):
    name = "explain"
    summary = (
        "on a server pgscope did not start: the estimated plans of the heaviest statements "
        "(EXPLAIN without ANALYZE, read-only)"
    )
    cost = "at most 5 plannings and 2 reads of pg_stat_statements every 30 s"
    default_in_runs = True
    Options = ExplainOptions

    options: ExplainOptions

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        return Availability.yes()

    def start(self, ctx: CollectorContext) -> None:
        self.ctx = ctx
        self.active = ctx.env.target_kind != "embedded"
        self.counts = Counts()
        self.explained_at: dict[tuple[int, str], float] = {}  # (query id, database) -> when
        self.last_ask: float | None = None
        self.baseline: dict[tuple[int, str], float] = {}
        if not self.active:
            return
        ctx.store.create_tables(self.name)
        self.generic_plan = ctx.server_version_num >= GENERIC_PLAN_SINCE
        self.reader: ConnParams | None = None  # where pg_stat_statements is read
        self.looked = 0
        self._find_reader()

    def _find_reader(self) -> None:
        """The database whose pg_stat_statements view is read (it shows every database's
        statements): the connection's, else one the client sessions are busy in (looked for
        at an ask, at most LOOKS times). Its totals now are the baseline."""
        if self.looked >= LOOKS:
            return
        self.looked += 1
        conn = self.ctx.conn
        candidates = [conn] + [
            replace(conn, params={**conn.params, "dbname": d})
            for d in busy_databases(conn, looks=1)
            if d != conn.dbname
        ]
        for candidate in candidates:
            try:
                with candidate.connect(application_name=APPLICATION_NAME) as session:
                    if session.execute(HAS_STATEMENTS_SQL).fetchone() is None:
                        continue
                    self.baseline = _totals(session)
            except TargetError:  # the role may not connect there (CONNECT revoked)
                continue
            self.reader = candidate
            return
        if self.looked == 1:
            self.ctx.say(
                "explain: pg_stat_statements is not installed where it was looked for; "
                "no plans are estimated until it is found"
            )

    def step_finished(self, step: StepInfo) -> None:
        if not self.active:
            return
        try:
            if self.reader is None:
                self._find_reader()  # found: its baseline is now, asked at a later edge
                return
            now = time.monotonic()
            if self.last_ask is not None and now - self.last_ask < self.options.every_s:
                return
            self.last_ask = now
            self.ask(step.step_id)
        except psycopg.Error as exc:
            self._failed(str(exc.diag.message_primary or exc))
        except TargetError as exc:
            self._failed(str(exc))

    def ask(self, step_id: int) -> int:
        """The heaviest statements' estimated plans, stored for `step_id`; how many."""
        self.counts.asks += 1
        assert self.reader is not None
        with self.reader.connect(application_name=APPLICATION_NAME) as session:
            totals = _totals(session)
            spent = {k: ms - self.baseline.get(k, 0.0) for k, ms in totals.items()}
            heaviest = sorted((k for k in spent if spent[k] > 0), key=lambda k: -spent[k])
            now = time.monotonic()
            due = [k for k in heaviest if now - self.explained_at.get(k, -REPLAN_S) >= REPLAN_S]
            texts = _texts(session, [q for q, _ in due[: self.options.statements * 4]])
        chosen: list[tuple[int, str, str, Explainable]] = []
        for key in due:
            if len(chosen) >= self.options.statements:
                break
            text = texts.get(key)
            if text is None:
                continue
            found = explainable(text)
            if found is None:
                self.counts.not_explainable += 1
                self.explained_at[key] = now  # judged on its text: not judged again soon
                continue
            chosen.append((*key, text, found))
        rows: dict[str, list[Any]] = {
            c: [] for c in ("step_id", "ts_us", "queryid", "query_text", "plan", "error")
        }
        for database in sorted({d for _, d, _, _ in chosen}):
            with self._session(database) as session:
                for queryid, db, text, found in chosen:
                    if db != database:
                        continue
                    self.explained_at[(queryid, db)] = now
                    if not _permitted(session, found):
                        self.counts.not_permitted += 1
                        continue
                    plan, error = self._plan(session, found)
                    if plan is None:
                        self._failed(error or "no plan")
                    else:
                        self.counts.explained += 1
                    for column, value in zip(
                        rows,
                        (step_id, now_us(), queryid, masked(text), plan, error),
                        strict=True,
                    ):
                        rows[column].append(value)
        if rows["queryid"]:
            self.ctx.store.append("plan_estimates", rows)
        return sum(1 for p in rows["plan"] if p is not None)

    def _session(self, database: str) -> psycopg.Connection[Any]:
        """A session in `database`, read-only, whose statements give up soon."""
        conn = replace(self.ctx.conn, params={**self.ctx.conn.params, "dbname": database})
        options = " ".join(
            part
            for part in (
                str(conn.params.get("options") or ""),
                f"-c statement_timeout={TIMEOUT_MS}",
                f"-c lock_timeout={LOCK_TIMEOUT_MS}",
                "-c plan_cache_mode=force_generic_plan",
            )
            if part
        )
        return conn.connect(
            application_name=APPLICATION_NAME, options=f"{options} {READ_ONLY_OPTION}"
        )

    def _plan(
        self, session: psycopg.Connection[Any], found: Explainable
    ) -> tuple[str | None, str | None]:
        """(the plan's JSON document, None) or (None, the server's message)."""
        try:
            if self.generic_plan:
                row = session.execute(
                    f"EXPLAIN (GENERIC_PLAN, FORMAT JSON) {found.text}"
                ).fetchone()
            else:
                row = _prepared_plan(session, found)
        except psycopg.Error as exc:
            return None, str(exc.diag.message_primary or exc)[:500]
        if not row or not row[0]:
            return None, "EXPLAIN returned no plan"
        document = row[0][0] if isinstance(row[0], list) else row[0]
        return json.dumps(document), None

    def _failed(self, message: str) -> None:
        self.counts.failed += 1
        if len(self.counts.errors) < 5:
            self.counts.errors.append(message[:300])

    def stop(self) -> str | None:
        if getattr(self, "active", False):
            self.ctx.store.add_event("explain", json.dumps(self.counts.__dict__))
        return None


def _prepared_plan(session: psycopg.Connection[Any], found: Explainable) -> Any:
    """Before 16: the generic plan of the prepared statement, its parameters NULL."""
    arguments = f"({', '.join(['NULL'] * found.parameters)})" if found.parameters else ""
    session.execute(f"PREPARE pgscope_explain AS {found.text}")
    try:
        return session.execute(
            f"EXPLAIN (FORMAT JSON) EXECUTE pgscope_explain{arguments}"
        ).fetchone()
    finally:
        session.execute("DEALLOCATE pgscope_explain")


def _totals(session: psycopg.Connection[Any]) -> dict[tuple[int, str], float]:
    return {
        (int(q), str(d)): float(ms or 0.0) for q, d, ms in session.execute(TOTALS_SQL).fetchall()
    }


def _texts(session: psycopg.Connection[Any], ids: list[int]) -> dict[tuple[int, str], str]:
    if not ids:
        return {}
    return {
        (int(q), str(d)): str(t)
        for q, d, t in session.execute(TEXTS_SQL, {"ids": ids}).fetchall()
        if t is not None
    }


def _permitted(session: psycopg.Connection[Any], found: Explainable) -> bool:
    """Whether the session's role may plan the statement: each relation it names exists in
    the session's search path and the role holds the privilege it needs there. Asked with
    functions that return NULL rather than fail, so nothing is written to the server's log."""
    for schema, name, privilege in found.needs:
        parts = [sql.Identifier(schema), sql.Identifier(name)] if schema else [sql.Identifier(name)]
        qualified = sql.SQL(".").join(parts).as_string(session)
        row = session.execute(PRIVILEGE_SQL, [qualified, privilege]).fetchone()
        if not row or row[0] is not True:
            return False
    return True
