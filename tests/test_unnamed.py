"""Time sampled without a query id is named for what it was (issue 30: "(no query id)" took
64-70% of active time, a client's commits waiting on WAL). On a server that computes no query
ids (compute_query_id off, or `auto` without pg_stat_statements: Debian's default), a client
that is not pgbench (psycopg) commits many small transactions while another session's LOCK
TABLE (a utility statement) waits."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgscope.analyze.waits import COMMIT, NO_QUERY_ID
from pgscope.proc import server_account
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import PgBinaries
from tests.cli import pgscope
from tests.poll import wait_until
from tests.servers import SMALL_SERVER

# EXCLUSIVE, not ACCESS EXCLUSIVE: a reader's ACCESS SHARE (the statements collector's
# pg_relation_size) does not queue behind it.
LOCK = "LOCK TABLE planted IN EXCLUSIVE MODE"


def _committers(cluster: EmbeddedCluster, stop: threading.Event, n: int) -> list[threading.Thread]:
    def commit_often() -> None:
        with cluster.conn.connect(autocommit=False, application_name="planted-app") as s:
            while not stop.is_set():
                s.execute("INSERT INTO log(v) VALUES (%s)", [1])
                s.commit()  # "COMMIT", extended protocol: no query id while it flushes

    threads = [threading.Thread(target=commit_often, daemon=True) for _ in range(n)]
    for thread in threads:
        thread.start()
    return threads


def _observe(cluster: EmbeddedCluster, tmp_path: Path, sampler: str) -> dict[str, Any]:
    result = pgscope(
        *("observe", "--data-dir", str(cluster.data_dir), "--duration", "5"),
        *("--window", "5", "--sampler", sampler, "--json"),
        *("--results-dir", str(tmp_path / sampler)),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    document: dict[str, Any] = json.loads(result.stdout)
    return document


@pytest.fixture
def cluster(pg: PgBinaries, tmp_path: Path) -> Iterator[EmbeddedCluster]:
    """A server that computes no query ids."""
    settings = {**benchmark_defaults(16), **SMALL_SERVER, "compute_query_id": "off"}
    with EmbeddedCluster(pg, server_account(None), tmp_path / "server.log", settings) as c:
        yield c


# Load: clients committing while observe samples them, its memory sampler calibrated on a
# busy host (beside another test's load it could not find the wait field).
@pytest.mark.load
def test_commits_and_utility_statements_are_named_in_the_top_queries(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    with cluster.connect() as setup:
        setup.execute("CREATE TABLE log (id bigserial PRIMARY KEY, v int)")
        setup.execute("CREATE TABLE planted (id int)")
    holder = cluster.conn.connect(autocommit=False, application_name="planted-holder")
    holder.execute("LOCK TABLE planted IN ROW EXCLUSIVE MODE")  # held, idle in transaction
    # LOCK TABLE runs only in a transaction block.
    waiter = cluster.conn.connect(autocommit=False, application_name="planted-waiter")

    def wait_for_lock() -> None:
        with contextlib.suppress(psycopg.Error):  # cancelled at the end
            waiter.execute(LOCK)

    locker = threading.Thread(target=wait_for_lock, daemon=True)
    locker.start()
    stop = threading.Event()
    threads = _committers(cluster, stop, 3)
    try:
        with cluster.connect() as look:
            wait_until(
                lambda: look.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query_id IS NULL"
                ).fetchone()[0],  # type: ignore[index]
                "the LOCK TABLE waiting, without a query id",
            )
        documents = {s: _observe(cluster, tmp_path, s) for s in ("sql", "memory")}
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        waiter.cancel_safe()
        locker.join(timeout=10)
        waiter.close()
        holder.close()
    for sampler, document in documents.items():
        queries = document["waits"]["queries"]
        named = {q["query"]: q for q in queries}
        print(sampler, [(q["query"][:50], round(q["share"], 3), q["named_by"]) for q in queries])
        commits = [q for q in queries if q["query"].startswith(COMMIT)]
        assert commits and all(q["named_by"] == "commit" for q in commits), queries
        assert sum(q["share"] for q in commits) > 0.05, queries
        unnamed = [q for q in queries if q["query"] == NO_QUERY_ID]
        if sampler == "sql":
            # Nothing is left without a name: the commits, the lock wait and the inserts.
            assert sum(q["share"] for q in unnamed) < 0.02, queries
            # The utility statement by its text (its constants would be `?`), a lock wait,
            # not a commit; the INSERT too, by its text.
            lock = named.get(LOCK)
            assert lock is not None and lock["named_by"] == "text", queries
            assert lock["top_wait"] == "Lock:relation", lock
            assert any(q["query"] == "INSERT INTO log(v) VALUES ($1)" for q in queries), queries
        else:
            # Shared memory reads no text: the waits name the commits (and say how they
            # waited); the lock wait, no commit's, stays unnamed.
            assert any(q["query"].startswith(f"{COMMIT} (") for q in commits), commits
            assert [q["top_wait"] for q in unnamed] == ["Lock:relation"], queries
    # The account names the commit waits as the top queries do.
    account = documents["memory"]["accounts"][0]["root"]
    names = [
        statement["name"]
        for cls in account["children"]
        for event in cls["children"]
        for statement in event["children"]
    ]
    assert any(n.startswith(f"{COMMIT} (") for n in names), names


def test_unnamed_time_is_grouped_and_named_from_what_the_samples_hold(tmp_path: Path) -> None:
    """No server: samples without a query id as the collectors store them, named by the one
    function the top queries and the account share."""
    import duckdb

    from pgscope.analyze.waits import top_queries, unnamed_statement
    from pgscope.store import RunMeta, RunStore

    store = RunStore.create(
        tmp_path / "run",
        RunMeta("run", "sample", "pgscope sample", "", "{}", "pgscope sample", "0", "server",
                "host=db1", {}),
    )  # fmt: skip
    store.create_tables("activity")
    rows = []
    for n in range(100):
        for pid, (wtype, event, command) in enumerate(
            (
                ("IO", "WALSync", None),  # shared memory: a commit by its wait
                ("LWLock", "WALWrite", "COMMIT"),  # its text
                (None, None, "end;"),  # a commit on CPU, by its text
                ("Lock", "relation", "LOCK TABLE t IN EXCLUSIVE MODE"),
                (None, None, "SELECT * FROM t WHERE id = 42"),
                (None, None, "SELECT * FROM t WHERE id = 7"),  # the same statement
                ("Lock", "tuple", None),  # nothing tells
            )
        ):
            rows.append((1_000 + n * 20_000, n, pid, "client backend", "active", wtype, event,
                         None, "app", "u", "planted", command))  # fmt: skip
    names = ("ts_us", "sample_no", "pid", "backend_type", "state", "wait_event_type",
             "wait_event", "query_id", "datname", "usename", "application_name",
             "command")  # fmt: skip
    store.append("activity_samples", {k: [r[i] for r in rows] for i, k in enumerate(names)})
    store.close()
    db = duckdb.connect(str(tmp_path / "run" / "run.duckdb"), read_only=True)
    try:
        found = {q.query: (round(q.share, 3), q.named_by) for q in top_queries(db)}
    finally:
        db.close()
    # One COMMIT, its waits tied (WALSync, WALWrite, CPU): named after the first of them.
    assert found == {
        "COMMIT": (round(3 / 7, 3), "commit"),
        "SELECT * FROM t WHERE id = ?": (round(2 / 7, 3), "text"),
        "LOCK TABLE t IN EXCLUSIVE MODE": (round(1 / 7, 3), "text"),
        NO_QUERY_ID: (round(1 / 7, 3), None),
    }, found
    # The account's name of a commit's wait, and of a wait that is no commit's.
    assert unnamed_statement("IO:WALSync") == "COMMIT (flushing its WAL)"
    assert unnamed_statement("Lock:tuple") == NO_QUERY_ID
