"""Relation locks the workload's sessions hold, sampled sparingly from `pg_locks`: do its
transactions lock more relations than the fast-path slots hold?

Why: a backend takes its weak relation locks (AccessShare, RowShare, RowExclusive on
non-shared relations: what reads and row writes take) in 16 slots of its own
(FP_LOCK_SLOTS_PER_BACKEND in PostgreSQL 15-17), touching nothing shared. Beyond 16 relations
a transaction's locks go to the shared lock table, whose 16 partitions are LWLocks (tranche
LockManager), taken on every lock and release. A query on a partitioned table that does not
prune locks every partition and, as it opens them, their indexes.

What it records, every `interval_s` (1 s): per workload session (client backends of the
target database, pgscope's own sessions left out) and per table it holds locks in, the
relations it has locked there (the table, or a partitioned table's whole tree: partitions
and their indexes, counted once each), the lock entries taken by fast path and those in the
shared table, and the tree's partition count; per reading, how long it took and how many
sessions held relation locks. The table is named by its partition tree's root, so a query
that locks 128 partitions shows as one partitioned table with 128 partitions.

What it costs: reading `pg_locks` takes each backend's fast-path lock in turn, then all 16
lock-table partition locks while it copies the shared table: it briefly holds up the very
locks it counts, hence once a second. Measured on the development VM (2 vCPUs, PostgreSQL
15; `bench/bench_pglocks.py`, docs/benchmarks.md): 0.07 ms of server CPU a reading with no
locks held; 2.3 ms with 8 sessions holding 129 relation locks each (1,032 entries), of which
reading pg_locks itself (`SELECT count(*) FROM pg_locks`, the part that holds the lock
manager's locks) is 0.6 ms; 9.1 ms with 32 such sessions (4,128 entries, 2.1 ms). At 1 Hz
that is 0.2-0.9% of one core.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from pydantic import BaseModel, ConfigDict, Field

from pgscope.collect.base import Availability, CollectorContext, CollectorEnv
from pgscope.collect.polling import PollingCollector
from pgscope.errors import TargetError
from pgscope.store import now_us

APPLICATION = "pgscope-pglocks"


# Locks on indexes count under their table, and partitions under their tree's root. Catalogs
# a session is reading count under themselves (they are released at once, rarely seen).
HELD_SQL = """
WITH held AS MATERIALIZED (
    SELECT l.pid, l.relation, l.fastpath
    FROM pg_locks l
    JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'relation' AND l.granted
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND a.backend_type = 'client backend'
      AND coalesce(a.application_name, '') NOT LIKE 'pgscope%'
), roots AS MATERIALIZED (  -- once per relation: a partition's root is a catalog search
    SELECT r.relation, coalesce(pg_partition_root(t.oid), t.oid) AS root
    FROM (SELECT DISTINCT relation FROM held) r
    LEFT JOIN pg_index i ON i.indexrelid = r.relation
    JOIN pg_class t ON t.oid = coalesce(i.indrelid, r.relation)
), per_root AS (
    SELECT o.root, h.pid, count(DISTINCT h.relation) AS relations,
           count(*) FILTER (WHERE h.fastpath) AS fastpath,
           count(*) FILTER (WHERE NOT h.fastpath) AS shared
    FROM held h JOIN roots o USING (relation) GROUP BY o.root, h.pid
), trees AS (
    SELECT root, CASE WHEN c.relkind = 'p'
                      THEN (SELECT count(*) FROM pg_partition_tree(root) WHERE isleaf)
                      ELSE 0 END AS partitions,
           CASE WHEN n.nspname = 'public' THEN c.relname
                ELSE n.nspname || '.' || c.relname END AS relname
    FROM (SELECT DISTINCT root FROM per_root) r
    JOIN pg_class c ON c.oid = r.root
    JOIN pg_namespace n ON n.oid = c.relnamespace
)
SELECT p.pid, t.relname, t.partitions, p.relations, p.fastpath, p.shared
FROM per_root p JOIN trees t USING (root)
"""

HELD_COLUMNS = ("ts_us", "pid", "relname", "partitions", "relations", "fastpath", "shared")
READING_COLUMNS = ("ts_us", "read_ms", "sessions", "locks")


class PglocksOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    interval_s: float = Field(
        1.0,
        ge=0.2,
        le=60,
        description="seconds between readings of pg_locks (each takes the lock manager's "
        "partition locks: keep it sparing)",
    )
    flush_s: float = Field(3.0, gt=0, le=60, description="how often rows are written")
    reconnect_s: float = Field(30.0, ge=0)


class PglocksCollector(PollingCollector):
    name = "pglocks"
    summary = "relation locks per session from pg_locks, fast-path or not, once a second"
    cost = "one read of pg_locks a second: 0.07 ms of server CPU idle, 2.3 ms with 1,000 locks"
    default_in_runs = True
    Options = PglocksOptions
    application_name = APPLICATION

    options: PglocksOptions

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        if env.conn is None:  # an embedded cluster: we are its superuser
            return Availability.yes()
        try:
            with env.conn.connect(application_name=APPLICATION) as session:
                session.execute(HELD_SQL).fetchall()
                row = session.execute(
                    "SELECT rolsuper OR pg_has_role(current_user, 'pg_read_all_stats', "
                    "'USAGE') FROM pg_roles WHERE rolname = current_user"
                ).fetchone()
        except TargetError as exc:
            return Availability.no(str(exc))
        except psycopg.Error as exc:
            return Availability.no(f"cannot read pg_locks: {exc.diag.message_primary or exc}")
        if not row or not row[0]:
            # Without it pg_stat_activity hides other roles' sessions: their locks vanish.
            return Availability.no(
                "this role cannot see other sessions in pg_stat_activity; fix: GRANT "
                "pg_monitor (or pg_read_all_stats) to it"
            )
        return Availability.yes()

    def connect(self) -> psycopg.Connection[Any]:
        session = super().connect()
        # The views' row estimates are guesses (1 row): with nested loops a reading of 1,040
        # locks took 14 ms of server CPU, with hash joins 2.3.
        session.execute("SET enable_nestloop = off")
        return session

    def prepare(self, ctx: CollectorContext) -> None:
        ctx.store.create_tables(self.name)
        self.reconnect_s = self.options.reconnect_s
        self.readings = 0
        self.pending_held: list[tuple[Any, ...]] = []
        self.pending_readings: list[tuple[Any, ...]] = []

    def run_loop(self) -> None:
        next_at = time.monotonic()
        last_flush = next_at
        try:
            while not self.stop_event.wait(max(0.0, next_at - time.monotonic())):
                next_at += self.options.interval_s
                try:
                    self._read()
                except psycopg.OperationalError as exc:
                    if not self.reconnect(exc, f"{self.readings} readings"):
                        return
                    next_at = time.monotonic()
                if time.monotonic() - last_flush >= self.options.flush_s:
                    self._flush()
                    last_flush = time.monotonic()
        finally:
            self._flush()

    def _read(self) -> None:
        ts_us = now_us()
        began = time.perf_counter()
        rows = self.session.execute(HELD_SQL, prepare=True).fetchall()
        read_ms = (time.perf_counter() - began) * 1000
        self.readings += 1
        self.pending_held += [(ts_us, *r) for r in rows]
        self.pending_readings.append(
            (ts_us, read_ms, len({r[0] for r in rows}), sum(int(r[4]) + int(r[5]) for r in rows))
        )

    def _flush(self) -> None:
        for table, columns, pending in (
            ("pglocks_held", HELD_COLUMNS, self.pending_held),
            ("pglocks_readings", READING_COLUMNS, self.pending_readings),
        ):
            if pending:
                rows = zip(*pending, strict=True)
                self.store.append(table, dict(zip(columns, rows, strict=True)))
                pending.clear()
