"""The explain collector (collect/statistics/planexplain.py): on a server pgscope did not start,
the heaviest statements' estimated plans, asked read-only as a pg_monitor role, and the
account of active time that splits a statement's execution by them (issue 39)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest

from pgscope import tables
from pgscope.analyze.account import ESTIMATED_SOURCE, Node
from pgscope.analyze.load import load_analysis
from pgscope.analyze.plans import estimated_nodes, in_ms, read_estimated
from pgscope.collect import build
from pgscope.collect.base import CollectorContext, CollectorEnv, StepInfo
from pgscope.collect.statistics.planexplain import ExplainCollector, explainable
from pgscope.labels import READ_ONLY_OPTION
from pgscope.proc import server_account
from pgscope.store import RunMeta, RunStore
from pgscope.target.conn import ConnParams
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import PgBinaries
from tests.cli import pgscope
from tests.poll import wait_until
from tests.servers import SMALL_SERVER
from tests.stores import HOST, sampled_session

LOOKUP = "SELECT count(*) FROM items WHERE val = %s"
HIDDEN = "SELECT count(*) FROM hidden WHERE val = %s"
# EXPLAIN (FORMAT JSON) of the lookup on a table without an index on val.
SEQ_SCAN_PLAN: dict[str, Any] = {
    "Plan": {
        "Node Type": "Aggregate",
        "Strategy": "Plain",
        "Startup Cost": 1791.0,
        "Total Cost": 1791.01,
        "Plan Rows": 1,
        "Plans": [
            {
                "Node Type": "Seq Scan",
                "Parent Relationship": "Outer",
                "Relation Name": "items",
                "Alias": "items",
                "Startup Cost": 0.0,
                "Total Cost": 1791.0,
                "Plan Rows": 10,
                "Filter": "(val = $1)",
            }
        ],
    }
}


# -- what may be explained ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "SELECT count(*) FROM items WHERE val = $1",
        "update items set val = val + $1 where id = $2",
        "insert into items values ($1, $2)",
        "DELETE FROM s.t USING u WHERE s.t.id = u.id",
        "WITH x AS (SELECT 1 FROM b) SELECT * FROM x JOIN c ON true",
        "select now() - interval $1 from t",  # a typed parameter, as a cast
    ],
)
def test_plain_reads_and_writes_of_user_tables_are_explained(text: str) -> None:
    assert explainable(text) is not None, text


@pytest.mark.parametrize(
    "text",
    [
        "WITH x AS (DELETE FROM a RETURNING *) SELECT * FROM x",  # writes inside a read
        "SELECT * FROM t FOR UPDATE",
        "SELECT * INTO z FROM t",
        "MERGE INTO t USING u ON t.id = u.id WHEN MATCHED THEN DELETE",
        "begin",
        "CREATE INDEX ON t (a)",
        "select pg_sleep($1)",  # no relation: nothing to place
        "SELECT * FROM pg_stat_activity",  # the catalogs only (pgscope's own readings)
        "SELECT 1; SELECT 2",
        "SELECT * FROM",  # not SQL
    ],
)
def test_anything_else_is_never_explained(text: str) -> None:
    assert explainable(text) is None, text


def test_the_privileges_asked_are_those_planning_needs() -> None:
    found = explainable("update items set val = $1 from other where other.id = items.id")
    assert found is not None
    assert set(found.needs) == {
        (None, "items", "SELECT"),
        (None, "other", "SELECT"),
        (None, "items", "UPDATE"),
    }
    inserted = explainable("insert into items values ($1, $2)")
    assert inserted is not None and inserted.needs == ((None, "items", "INSERT"),)
    assert inserted.parameters == 2
    cte = explainable("WITH x AS (SELECT 1 FROM b) SELECT * FROM x")
    assert cte is not None and cte.needs == ((None, "b", "SELECT"),), "a WITH name is no table"


# -- estimated plans as plan nodes -------------------------------------------------------------


def test_an_estimated_plans_nodes_hold_their_own_cost() -> None:
    nodes = estimated_nodes([SEQ_SCAN_PLAN])  # EXPLAIN's own form: a list of one document
    assert [n.node_type for n in nodes] == ["Seq Scan", "Aggregate"]
    scan = nodes[0]
    assert scan.self_ms == pytest.approx(1791.0)
    assert nodes[1].self_ms == pytest.approx(0.01)
    assert (scan.relation, scan.condition, scan.columns) == ("items", "(val = $1)", ["val"])
    assert scan.rows == 10 and scan.removed == 0


def test_a_nested_loops_inner_side_costs_once_per_outer_row() -> None:
    plan = {
        "Plan": {
            "Node Type": "Nested Loop",
            "Total Cost": 1100.0,
            "Plan Rows": 100,
            "Plans": [
                {"Node Type": "Seq Scan", "Relation Name": "a", "Total Cost": 100.0,
                 "Plan Rows": 100},
                {"Node Type": "Index Scan", "Relation Name": "b", "Index Name": "b_pkey",
                 "Total Cost": 9.0, "Plan Rows": 1},
            ],
        }
    }  # fmt: skip
    by_type = {n.node_type: n for n in estimated_nodes(plan)}
    assert by_type["Index Scan"].self_ms == pytest.approx(900.0)
    assert by_type["Index Scan"].loops == 100
    assert by_type["Seq Scan"].self_ms == pytest.approx(100.0)
    assert by_type["Nested Loop"].self_ms == pytest.approx(100.0)


def test_an_estimated_plan_in_ms_is_a_calls_execution_split_by_cost() -> None:
    db = duckdb.connect()
    db.execute(tables.of("plan_estimates").ddl())
    for ts, doc in ((1, {"Plan": {"Node Type": "Result", "Total Cost": 1.0}}), (2, SEQ_SCAN_PLAN)):
        db.execute(
            "INSERT INTO plan_estimates VALUES (1, ?, 7, 'q', ?, NULL)", [ts, json.dumps(doc)]
        )
    db.execute("INSERT INTO plan_estimates VALUES (1, 3, 8, 'q', NULL, 'permission denied')")
    plans = read_estimated(db)
    assert set(plans) == {7}, "the latest plan of each statement; a failure is none"
    assert plans[7].estimated and plans[7].nodes[0].node_type == "Seq Scan"
    scaled = in_ms(plans[7], 5.0)
    assert scaled.node_ms == pytest.approx(5.0)
    assert scaled.nodes[0].self_ms == pytest.approx(5.0 * 1791.0 / 1791.01)


def _plan_nodes(root: Node) -> list[tuple[Node, ...]]:
    return [path for path in root.walk() if path[-1].kind == "plan"]


def test_the_account_puts_a_statements_time_under_its_estimated_seq_scan(tmp_path: Path) -> None:
    """A session observed on a server pgscope did not start: all of query 7's time on CPU,
    no sampled plan, its estimated plan kept by the explain collector."""
    run_dir = sampled_session(tmp_path / "run", 0.0)
    db = duckdb.connect(str(run_dir / "run.duckdb"))
    db.execute(tables.of("plan_estimates").ddl())
    db.execute(
        "INSERT INTO plan_estimates VALUES (1, 1, 7, ?, ?, NULL)",
        ["SELECT count(*) FROM items WHERE val = $1", json.dumps(SEQ_SCAN_PLAN)],
    )
    db.close()
    analysis = load_analysis(run_dir)
    [account] = analysis.accounts
    paths = _plan_nodes(account.root)
    assert paths, "the statement's execution is split by its estimated plan"
    heaviest = max(paths, key=lambda p: p[-1].share)
    node = heaviest[-1]
    assert node.name == "Seq Scan on items, (val = $1)"
    assert node.source == ESTIMATED_SOURCE
    statement = next(n for n in heaviest if n.kind == "statement")
    assert node.share == pytest.approx(statement.share, rel=0.01)
    assert node.detail["columns"] == "val" and node.detail["misestimate"] is None
    closed = {c.branch: c.why for c in account.closed}
    assert "plan nodes" not in closed or "estimated plans" in closed["plan nodes"]


# -- on a server, as pg_monitor ----------------------------------------------------------------

PRELOADED = {"shared_preload_libraries": "pg_stat_statements"}  # no auto_explain


def _watched(pg: PgBinaries, tmp_path: Path) -> EmbeddedCluster:
    if not pg.has_library("pg_stat_statements"):
        pytest.skip(f"PostgreSQL {pg.major_version()} here has no pg_stat_statements")
    return EmbeddedCluster(
        pg,
        server_account(None),
        tmp_path / "server.log",
        {**benchmark_defaults(8), **SMALL_SERVER, **PRELOADED, "log_min_messages": "error"},
    )


def _prepared(cluster: EmbeddedCluster, database: str = "postgres") -> None:
    """100k rows without an index on val; a table the monitoring role may not read; `mon`,
    a role with pg_monitor and SELECT on items only."""
    if database != "postgres":
        with cluster.connect() as admin:
            admin.execute(f"CREATE DATABASE {database}")
    there = ConnParams({**cluster.conn.params, "dbname": database})
    with there.connect() as admin:
        admin.execute("CREATE EXTENSION pg_stat_statements")
        for table in ("items", "hidden"):
            admin.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, val int, pad text)")
            admin.execute(
                f"INSERT INTO {table} SELECT g, g % 10000, repeat('x', 40) "
                "FROM generate_series(1, 100000) g"
            )
            admin.execute(f"ANALYZE {table}")
        admin.execute("CREATE ROLE mon LOGIN IN ROLE pg_monitor")
        admin.execute("GRANT SELECT ON items TO mon")


def _context(
    pg: PgBinaries, conn: ConnParams, run_dir: Path, said: list[str]
) -> tuple[RunStore, CollectorContext]:
    store = RunStore.create(
        run_dir,
        RunMeta("run", "observe", "observe", "", "{}", "pgscope observe", "0", "server",
                conn.conninfo(), HOST),
    )  # fmt: skip
    with conn.connect() as session:
        version = session.info.server_version
    ctx = CollectorContext(
        CollectorEnv(pg, "server", conn, True), conn, store, run_dir, lambda: None, None,
        version, said.append,
    )  # fmt: skip
    return store, ctx


def _monitor(cluster: EmbeddedCluster) -> ConnParams:
    """The monitoring role's connection, read-only as pgscope opens one on a user's server."""
    return ConnParams({**cluster.conn.params, "user": "mon", "options": READ_ONLY_OPTION})


def _client(cluster: EmbeddedCluster, database: str = "postgres") -> psycopg.Connection[Any]:
    """A session as the workload's client opens one (pgscope's own keep their statements out
    of pg_stat_statements)."""
    there = ConnParams({**cluster.conn.params, "dbname": database})
    return psycopg.connect(there.conninfo(), autocommit=True)


def _lookups(cluster: EmbeddedCluster, calls: int) -> None:
    with _client(cluster) as session:
        for n in range(calls):
            session.execute(LOOKUP, [n])
            session.execute(HIDDEN, [n])
        session.execute("UPDATE hidden SET pad = pad WHERE val = %s", [1])


def _seq_scans(plan: dict[str, Any]) -> list[tuple[str, str]]:
    found = []
    stack = [plan["Plan"]]
    while stack:
        node = stack.pop()
        if node.get("Node Type") == "Seq Scan":
            found.append((node.get("Relation Name"), node.get("Filter")))
        stack.extend(node.get("Plans") or [])
    return found


@pytest.mark.server
def test_the_heaviest_statements_plans_are_asked_as_pg_monitor(
    pg_version: PgBinaries, tmp_path: Path
) -> None:
    """GENERIC_PLAN on 16 and later, PREPARE and EXECUTE with NULLs on 15: the lookup's plan
    names its Seq Scan and filter; the statements on a table the role may not read, and the
    UPDATE it may not make, are passed over without an error in the server's log."""
    with _watched(pg_version, tmp_path) as cluster:
        _prepared(cluster)
        said: list[str] = []
        store, ctx = _context(pg_version, _monitor(cluster), tmp_path / "run", said)
        collector = build("explain", {})
        assert isinstance(collector, ExplainCollector)
        collector.start(ctx)
        before = cluster.log_path.stat().st_size
        _lookups(cluster, 300)
        collector.step_finished(StepInfo(1, "base", 1, 1))
        collector.step_finished(StepInfo(2, "base", 1, 1))  # within every_s: not asked again
        collector.stop()
        with cluster.log_path.open("rb") as log:
            log.seek(before)
            written = log.read().decode(errors="replace")
        rows = store.query("SELECT step_id, query_text, plan, error FROM plan_estimates")
        store.close()
    assert "ERROR" not in written, written[-2000:]
    assert [r["step_id"] for r in rows] == [1], rows
    [row] = rows
    assert row["error"] is None and "items" in row["query_text"]
    assert _seq_scans(json.loads(row["plan"])) == [("items", "(val = $1)")]
    counts = collector.counts
    assert (counts.asks, counts.explained, counts.failed) == (1, 1, 0)
    assert counts.not_permitted == 2, "the hidden lookup and the UPDATE"


@pytest.mark.server
def test_the_statements_are_read_where_the_extension_is(pg: PgBinaries, tmp_path: Path) -> None:
    """pg_stat_statements installed only in the database the load runs in, the connection
    naming another (observe --data-dir connects to postgres): the collector finds the busy
    database, takes its baseline there, and explains at the next edge."""
    with _watched(pg, tmp_path) as cluster:
        _prepared(cluster, "app")
        stop = threading.Event()

        def lookups() -> None:
            with _client(cluster, "app") as session:
                n = 0
                while not stop.is_set():
                    session.execute(LOOKUP, [n % 10000])
                    n += 1

        said: list[str] = []
        store, ctx = _context(pg, _monitor(cluster), tmp_path / "run", said)
        collector = build("explain", {})
        assert isinstance(collector, ExplainCollector)
        collector.start(ctx)
        assert collector.reader is None and said, "not in postgres: said so, looked again later"
        thread = threading.Thread(target=lookups)
        thread.start()
        try:
            wait_until(lambda: _calls(cluster) >= 20, "the lookups under way")

            def found() -> ConnParams | None:
                # One look at the sessions an edge: one between two lookups sees none busy.
                collector.step_finished(StepInfo(1, "observed", 1, 1))
                return collector.reader

            assert wait_until(found, "the busy database found", timeout=10).dbname == "app"
            wait_until(lambda: _calls(cluster) >= 100, "more lookups")
            collector.step_finished(StepInfo(2, "observed", 1, 1))
        finally:
            stop.set()
            thread.join(timeout=30)
        rows = store.query("SELECT step_id, plan FROM plan_estimates")
        store.close()
    assert [r["step_id"] for r in rows] == [2], rows
    assert _seq_scans(json.loads(rows[0]["plan"])) == [("items", "(val = $1)")]


def _calls(cluster: EmbeddedCluster) -> int:
    there = ConnParams({**cluster.conn.params, "dbname": "app"})
    with there.connect() as session:
        row = session.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query LIKE %s",
            ["%FROM items WHERE val%"],
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.server
def test_observe_names_the_seq_scan_that_holds_a_lookups_time(
    pg: PgBinaries, tmp_path: Path
) -> None:
    """`pgscope observe --dsn` as pg_monitor on a server without auto_explain: the lookup's
    time goes to its execution, and there to the estimated plan's Seq Scan with its filter."""
    with _watched(pg, tmp_path) as cluster:
        _prepared(cluster)
        stop = threading.Event()

        def lookups() -> None:
            with _client(cluster) as session:
                n = 0
                while not stop.is_set():
                    session.execute(LOOKUP, [n % 10000])
                    n += 1

        threads = [threading.Thread(target=lookups) for _ in range(2)]
        for thread in threads:
            thread.start()
        try:
            result = pgscope(
                "observe", "--dsn", _monitor(cluster).conninfo(), "--json", "--results-dir",
                str(tmp_path / "results"), "--duration", "6", "--window", "2",
            )  # fmt: skip
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=30)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = Path(json.loads(result.stdout)["run_dir"])
    with duckdb.connect(str(run_dir / "run.duckdb"), read_only=True) as db:
        stored = db.execute("SELECT plan FROM plan_estimates WHERE plan IS NOT NULL").fetchall()
    assert any(_seq_scans(json.loads(p)) == [("items", "(val = $1)")] for (p,) in stored)
    analysis = load_analysis(run_dir)
    # The estimated plan is the seq-scan finding's generic plan too: the filter to index.
    filters = [f for found in analysis.statements.seq_filters.values() for f in found]
    assert [(f.relation, f.columns) for f in filters] == [("items", ["val"])]
    whole = next(a for a in analysis.accounts if a.scope == "whole")
    lookup = [
        p
        for p in _plan_nodes(whole.root)
        if any("items" in n.name for n in p if n.kind == "statement")
    ]
    assert lookup, [n.name for p in whole.root.walk() for n in p[-1:]]
    heaviest = max(lookup, key=lambda p: p[-1].share)
    assert heaviest[-1].name == "Seq Scan on items, (val = $1)"
    assert heaviest[-1].source == ESTIMATED_SOURCE
    execution = next(n for n in heaviest if n.kind == "part")
    assert execution.name == "execution"
    assert heaviest[-1].share >= 0.8 * execution.share
