"""Parallel workers are part of their leader's statement, whichever sampler sees them: named
'parallel worker' as pg_stat_activity names them (not by their backend type's number, which
every background worker shares: the logical replication launcher's too), and carrying their
leader's query_id while their own is not set yet (issue 41: a run with an index dropped read
'logical replication launcher: 2.40 at work' and 17% of its time as '(no query id)')."""

from __future__ import annotations

import os
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pytest

from pgscope import tables
from pgscope.analyze.account import Node, build
from pgscope.analyze.statements import Statements
from pgscope.analyze.waits import SESSIONS
from pgscope.collect.sampling import activity, activitymem, shmem
from pgscope.proc import server_account
from pgscope.target.embedded import EmbeddedCluster
from pgscope.target.pgbin import PgBinaries
from tests.cli import pgscope
from tests.poll import wait_until
from tests.servers import SMALL_SERVER

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="reading another process's memory needs root"
)

# -- classify: a worker's leader and statement, from the rows of a flush ---------------------


def _classify(
    rows: list[tuple[int, int, int, int, int, int]],
) -> list[tuple[int, int]]:
    """(sample, pid, backend type number, query_id, leader read, leader named) per row ->
    (leader, query_id) per row."""
    sample_no, pid, btype, query_id, leader, named = (np.array(c) for c in zip(*rows, strict=True))
    got_leader, got_query = activitymem.classify(
        sample_no.astype(np.int64),
        pid.astype(np.int32),
        btype.astype(np.int32),
        query_id.astype(np.int64),
        leader.astype(np.int32),
        named.astype(np.int32),
    )
    return list(zip(got_leader.tolist(), got_query.tolist(), strict=True))


def test_a_starting_worker_takes_its_leaders_query_id_in_the_same_sample() -> None:
    # Leader 100 runs query 7 then query 9; worker 200 has not reported one (0) at samples 1
    # and 2, has at 3. A process that leads no one keeps its own (0: none).
    assert _classify(
        [
            (1, 100, 3, 7, 0, 0),
            (1, 200, 4, 0, 100, 0),
            (2, 100, 3, 9, 0, 0),
            (2, 200, 4, 0, 100, 0),
            (3, 200, 4, 9, 100, 0),
            (3, 300, 3, 0, 0, 0),
        ]
    ) == [(0, 7), (100, 7), (0, 9), (100, 9), (100, 9), (0, 0)]


def test_a_worker_with_no_status_slot_yet_is_its_pids_later_self() -> None:
    """Before it joins its leader's lock group a worker has a PGPROC but no status slot
    (type -1) and no leader: the leader its pid shows later in the flush is its leader."""
    assert _classify(
        [
            (1, 100, 3, 7, 0, 0),
            (1, 200, -1, 0, 0, 0),
            (2, 100, 3, 7, 0, 0),
            (2, 200, 4, 0, 100, 0),
            (2, 400, -1, 0, 0, 0),  # a process starting, never seen as anyone's worker
        ]
    ) == [(0, 7), (100, 7), (0, 7), (100, 7), (0, 0)]


def test_the_leader_pg_stat_activity_named_serves_where_memory_gave_none() -> None:
    """Where the leader field was not found (Layout.leader_offset None), pg_stat_activity's
    leader_pid for the pid; its own pid (a leader, as PostgreSQL 13 shows one) is no leader."""
    assert _classify([(1, 100, 3, 7, 0, 100), (1, 200, 4, 0, 0, 100), (1, 300, 4, 5, 0, 100)]) == [
        (0, 7),
        (100, 7),
        (100, 5),
    ]


# -- the SQL sampler's write: a worker's statement where the server gives it none ----------


def _process(*fields: object) -> str:
    """One process as BATCH_SQL sends it: pid, type, state, wait type, wait, query_id, datid,
    usesysid, application, command, leader (None as the empty text concat makes of NULL)."""
    return "\x1f".join("" if f is None else str(f) for f in fields)


def test_the_sql_samplers_write_gives_a_starting_worker_its_leaders_statement(
    tmp_path: Path,
) -> None:
    """In one sample: leader 100 running query 7 (the server computing ids) and its worker 200
    not started yet (no query_id, no state); in another, with no query ids, leader 300 running
    a statement whose text the sampler kept and its worker 400. The samples without workers
    are written as before (WRITE_SQL)."""
    db = duckdb.connect(str(tmp_path / "store.duckdb"))
    db.execute("\n".join(t.ddl() for t in tables.written_by("activity")))
    samples = [
        "\x1e".join(
            [
                _process(100, "client backend", "active", None, None, 7, 5, 10, "app"),
                _process(200, "parallel worker", None, None, None, None, 5, 10, "app", None, 100),
            ]
        ),
        "\x1e".join(
            [
                _process(
                    300,
                    "client backend",
                    "active",
                    "IPC",
                    "BgWorkerStartup",
                    None,
                    5,
                    10,
                    "app",
                    "select count(*) from t",
                ),
                _process(
                    400, "parallel worker", "active", None, None, None, 5, 10, "app", None, 300
                ),
            ]
        ),
        None,
    ]
    assert any(activity.WORKER in p for p in samples if p)
    db.execute(
        activity.WRITE_LED_SQL,
        {
            "ts_us": [1, 2, 3],
            "sample_no": [1, 2, 3],
            "processes": samples,
            "db_oids": [5],
            "db_names": ["postgres"],
            "role_oids": [10],
            "role_names": ["postgres"],
            "own": 999,
            "application": "pgscope-sampler",
        },
    )
    rows = db.execute(
        "SELECT sample_no, pid, backend_type, state, query_id, datname, command "
        "FROM activity_samples ORDER BY 1, 2"
    ).fetchall()
    assert rows == [
        (1, 100, "client backend", "active", 7, "postgres", None),
        (1, 200, "parallel worker", None, 7, "postgres", None),
        (2, 300, "client backend", "active", None, "postgres", "select count(*) from t"),
        (2, 400, "parallel worker", "active", None, "postgres", "select count(*) from t"),
        (3, 999, "client backend", "active", None, None, None),
    ]


# -- the leader field, found in a proc array of our making -----------------------------------

STRIDE, COUNT, BASE, PID_AT = 128, 6, 0x7F0000400000, 8
HEADS = (40, 56, 88)  # list heads pointing at themselves; the last is lockGroupMembers


def _procs(pids: list[int], leaders: dict[int, int]) -> bytes:
    region = bytearray(STRIDE * COUNT)
    for i, pid in enumerate(pids):
        slot = BASE + i * STRIDE
        struct.pack_into("i", region, i * STRIDE + PID_AT, pid)
        for head in HEADS:
            struct.pack_into("QQ", region, i * STRIDE + head, slot + head, slot + head)
        if i in leaders:
            struct.pack_into("Q", region, i * STRIDE + HEADS[-1] - 8, BASE + leaders[i] * STRIDE)
    return bytes(region)


def test_the_leader_field_is_before_the_last_list_head_pointing_at_itself() -> None:
    procs = shmem.Array(BASE, COUNT, STRIDE, PID_AT)
    # Slot 1 (ours) idle; slot 2 leads slot 3 (its own field names itself); 4, 5 free.
    region = _procs([0, 11, 12, 13, 0, 0], {2: 2, 3: 2})
    assert shmem._leader_offset(region, procs, 1) == HEADS[-1] - 8
    # What would be read there names no slot's start: not the field.
    wrong = bytearray(region)
    struct.pack_into("Q", wrong, 3 * STRIDE + HEADS[-1] - 8, BASE + 5)
    assert shmem._leader_offset(bytes(wrong), procs, 1) is None


# -- on a real server: a forced parallel plan in a loop ----------------------------------------

QUERY = "select count(*) from t where v = 1"
PARALLEL = (
    "SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; "
    "SET min_parallel_table_scan_size = 0; SET max_parallel_workers_per_gather = 2"
)


@pytest.fixture
def parallel_load(cluster: EmbeddedCluster) -> Iterator[EmbeddedCluster]:
    """Two sessions running QUERY, a parallel plan with two workers, until the test ends."""
    with cluster.connect() as conn:
        conn.execute("CREATE TABLE t AS SELECT g % 100 AS v FROM generate_series(1, 200000) g")
        conn.execute("ANALYZE t")
    stop = threading.Event()
    runs = [0, 0]

    def run(n: int) -> None:
        with cluster.conn.connect(application_name="parallel-load") as session:
            session.execute(PARALLEL)
            plan = "\n".join(r[0] for r in session.execute(f"EXPLAIN {QUERY}"))
            assert "Workers Planned: 2" in plan, plan
            while not stop.is_set():
                session.execute(QUERY)
                runs[n] += 1

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in range(2)]
    for thread in threads:
        thread.start()
    wait_until(lambda: min(runs) > 0, "both sessions running the parallel query")
    try:
        yield cluster
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)


def _observed(cluster: EmbeddedCluster, tmp_path: Path, sampler: str) -> Path:
    results = tmp_path / sampler
    result = pgscope(
        *("observe", "--data-dir", str(cluster.data_dir), "--duration", "3"),
        *("--window", "1", "--sampler", sampler, "--results-dir", str(results)),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    [run_dir] = results.iterdir()
    return run_dir / "run.duckdb"


def _statements(root: Node) -> dict[str, int]:
    """Samples per statement node of an account, over all its waits."""
    out: dict[str, int] = {}
    for path in root.walk():
        if path[-1].kind == "statement":
            out[path[-1].name] = out.get(path[-1].name, 0) + path[-1].samples
    return out


@pytest.mark.server
@needs_root
@pytest.mark.parametrize("sampler", ["memory", "sql"])
def test_parallel_workers_are_counted_in_their_leaders_statement(
    parallel_load: EmbeddedCluster, tmp_path: Path, sampler: str
) -> None:
    with parallel_load.connect() as conn:
        launcher = {
            pid
            for (pid,) in conn.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE backend_type = 'logical replication launcher'"
            )
        }
    store = _observed(parallel_load, tmp_path, sampler)
    db = duckdb.connect(str(store), read_only=True)
    try:
        [(query_id,)] = db.execute(
            "SELECT query_id FROM activity_queries WHERE query ILIKE '%from t where v%'"
        ).fetchall()
        by_type = dict(
            db.execute(
                "SELECT coalesce(backend_type, '(none)'), count(*) FROM activity_samples "
                "WHERE application_name IS DISTINCT FROM 'pgscope-sampler' GROUP BY ALL"
            ).fetchall()
        )
        # Left unnamed: only processes not in the status array (memory only: a worker that
        # has not joined its leader yet, which pg_stat_activity does not list either).
        unnamed_types = db.execute(
            "SELECT count(*) FROM activity_samples WHERE backend_type IS NULL "
            "AND (state IS NOT NULL OR query_id IS NOT NULL OR datname IS NOT NULL)"
        ).fetchone()
        workers = dict(
            db.execute(
                "SELECT coalesce(query_id, 0), count(*) FROM activity_samples "
                "WHERE backend_type = 'parallel worker' GROUP BY ALL"
            ).fetchall()
        )
        # No worker named as another background worker (the launcher's number is theirs).
        types = dict(
            db.execute(
                "SELECT backend_type, list(DISTINCT pid) FROM activity_samples "
                "WHERE backend_type NOT IN ('client backend') GROUP BY ALL"
            ).fetchall()
        )
        in_query = db.execute(
            f"SELECT count(*) FROM activity_samples WHERE {SESSIONS} AND query_id = ?",
            [query_id],
        ).fetchone()
        texts = dict(db.execute("SELECT query_id, query FROM activity_queries").fetchall())
        account = build(db, None, Statements(), texts, "whole", None, None)
    finally:
        db.close()
    print(sampler, by_type, workers, account.samples)
    assert workers.keys() == {query_id} and workers[query_id] > 20, workers
    others = {p for kind, pids in types.items() if kind != "parallel worker" for p in pids}
    assert not others & set(types["parallel worker"]), types
    assert set(types.get("logical replication launcher", [])) <= launcher, (types, launcher)
    assert unnamed_types == (0,), by_type
    statements = _statements(account.root)
    mine = next(n for name, n in statements.items() if name.startswith(f"query {query_id}:"))
    assert mine == in_query[0] and mine > workers[query_id], statements
    unnamed = sum(n for name, n in statements.items() if not name.startswith("query "))
    assert unnamed <= 0.05 * account.samples, statements


@pytest.mark.server
@needs_root
def test_the_leader_field_names_each_workers_leader_on_every_version(
    pg_version: PgBinaries, tmp_path: Path
) -> None:
    """On 15, 16, 17 and 18 the field found is PGPROC.lockGroupLeader: what the sampler reads
    of the workers of a session running a parallel plan names that session, and of no other
    process anyone."""
    with (
        EmbeddedCluster(
            pg_version, server_account(None), tmp_path / "server.log", SMALL_SERVER
        ) as cluster,
        cluster.connect() as session,
    ):
        session.execute("CREATE TABLE t AS SELECT g % 100 AS v FROM generate_series(1, 200000) g")
        session.execute("ANALYZE t")
        assert cluster.postmaster_pid is not None
        layout = shmem.calibrate(session, cluster.postmaster_pid)
        assert layout.leader_offset is not None
        stop = threading.Event()
        with cluster.conn.connect(application_name="parallel-load") as loader:
            loader.execute(PARALLEL)

            def run() -> None:
                while not stop.is_set():
                    loader.execute(QUERY)

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            helper = activitymem.Helper(layout, 100)
            started = time.monotonic()
            try:
                batches = list(helper.batches(lambda: time.monotonic() - started > 1))
            finally:
                stop.set()
                thread.join(timeout=30)
            leader = loader.info.backend_pid
    leaders = Counter(np.concatenate([b.leader for b in batches]).tolist())
    assert leaders[leader] >= 5 and leaders.keys() == {0, leader}, leaders
