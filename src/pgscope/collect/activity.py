"""Wait-event sampling from outside: `pg_stat_activity` polled at a fixed rate.

What it records (tables below): every server process at every sample (pid, backend type,
state, wait event, query_id, database, user, application), the blockers of sessions waiting on
heavyweight locks (at most once a second: `pg_blocking_pids` takes the lock manager's locks),
the text of each query_id the first time it is seen, and per second its own achieved rate,
lag and query time, so a user sees the real resolution.

What it costs: one connection and one prepared query per sample (~0.2 ms of server CPU plus
our own parsing); docs/benchmarks.md has the measured throughput cost per rate. If its query
gets slow (a server in trouble), it halves its rate and says so rather than add load.

Needs no extension. On a server it does not own it needs `pg_monitor` (or
`pg_read_all_stats`): without it, other sessions' wait events read as NULL.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from pydantic import BaseModel, ConfigDict, Field

from pgscope.collect.base import Availability, CollectorContext, CollectorEnv
from pgscope.collect.polling import PollingCollector
from pgscope.errors import TargetError
from pgscope.store import now_us
from pgscope.target.conn import ConnParams

APPLICATION = "pgscope-sampler"

SCHEMA = """
CREATE TABLE IF NOT EXISTS activity_samples (
    ts_us BIGINT NOT NULL,        -- midpoint of the sampling query
    sample_no BIGINT NOT NULL,    -- 1, 2, ... per run
    pid INTEGER,
    backend_type VARCHAR,
    state VARCHAR,                -- active, idle, idle in transaction, ... (NULL: background)
    wait_event_type VARCHAR,      -- NULL while on CPU (or runnable)
    wait_event VARCHAR,
    query_id BIGINT,
    datname VARCHAR,
    usename VARCHAR,
    application_name VARCHAR
);
CREATE TABLE IF NOT EXISTS activity_blockers (
    ts_us BIGINT NOT NULL, pid INTEGER NOT NULL, blocked_by INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS activity_queries (
    query_id BIGINT PRIMARY KEY, query VARCHAR, first_seen_us BIGINT
);
CREATE TABLE IF NOT EXISTS activity_rate (
    second_us BIGINT NOT NULL,    -- start of the second
    target_hz DOUBLE,             -- the rate aimed at (lowered by back-off)
    samples INTEGER,              -- samples taken in the second (= achieved rate)
    lag_mean_ms DOUBLE,           -- how late samples started, vs their schedule
    lag_max_ms DOUBLE,
    query_mean_ms DOUBLE,         -- the sampling query's own duration
    query_max_ms DOUBLE
);
"""

# The text comes along only for a query_id not seen before (the array parameter): a later
# lookup would miss fast statements, and sending every text every time would cost.
SAMPLE_SQL = (
    "SELECT pid, backend_type, state, wait_event_type, wait_event, query_id, datname, "
    "usename, application_name, CASE WHEN query_id <> ALL(%s::bigint[]) THEN query END "
    "FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
)
BLOCKERS_SQL = (
    "SELECT pid, unnest(pg_blocking_pids(pid)) FROM pg_stat_activity "
    "WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
)
RIGHTS_SQL = (
    "SELECT rolsuper OR pg_has_role(current_user, 'pg_read_all_stats', 'USAGE'), current_user "
    "FROM pg_roles WHERE rolname = current_user"
)
SAMPLE_COLUMNS = (
    "pid",
    "backend_type",
    "state",
    "wait_event_type",
    "wait_event",
    "query_id",
    "datname",
    "usename",
    "application_name",
)


class ActivityOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hz: float = Field(50.0, gt=0, le=1000, description="samples per second")
    blockers: bool = Field(True, description="record pg_blocking_pids for Lock waits (≤ 1 Hz)")
    reconnect_s: float = Field(
        30.0,
        ge=0,
        description="how long to keep trying after the connection drops "
        "(a restart between variants); 0: give up at once",
    )
    backoff_share: float = Field(
        0.25,
        gt=0,
        le=1,
        description="halve the rate when the median sampling query takes "
        "more than this share of the interval",
    )


def check_rights(conn: ConnParams) -> Availability:
    """Can this role see every session's wait events?"""
    try:
        with conn.connect(application_name=APPLICATION) as session:
            row = session.execute(RIGHTS_SQL).fetchone()
    except TargetError as exc:
        return Availability.no(str(exc))
    if row is None or not row[0]:
        role = row[1] if row else "this role"
        return Availability.no(
            f"role {role} cannot see other sessions' wait events; fix: GRANT pg_monitor TO "
            f"{role} (or pg_read_all_stats)"
        )
    return Availability.yes()


@dataclass
class _Second:
    """Accumulates one second of samples before it is written."""

    start_us: int
    rows: dict[str, list[Any]] = field(
        default_factory=lambda: {c: [] for c in ("ts_us", "sample_no", *SAMPLE_COLUMNS)}
    )
    lags_ms: list[float] = field(default_factory=list)
    query_ms: list[float] = field(default_factory=list)


class ActivityCollector(PollingCollector):
    name = "activity"
    summary = "wait-event samples of every session from pg_stat_activity, no extension"
    cost = "one prepared query per sample; see docs/benchmarks.md for tps cost per rate"
    default_in_runs = True
    Options = ActivityOptions
    application_name = APPLICATION

    options: ActivityOptions

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        if env.conn is None:  # an embedded cluster: we are its superuser
            return Availability.yes()
        return check_rights(env.conn)

    def prepare(self, ctx: CollectorContext) -> None:
        ctx.store.ensure_schema(SCHEMA)
        self.reconnect_s = self.options.reconnect_s
        self.samples = 0
        self.target_hz = self.options.hz
        self.slow_seconds = 0
        self.known_queries: set[int] = set()
        self.known_list: list[int] = []  # the same ids, as the query's array parameter

    def run_loop(self) -> None:
        second = _Second(now_us() // 1_000_000 * 1_000_000)
        next_at = time.monotonic()
        last_blockers = 0.0
        try:
            while not self.stop_event.is_set():
                interval = 1.0 / self.target_hz
                lag_ms = max(0.0, (time.monotonic() - next_at) * 1000)
                t0 = time.time_ns()
                try:
                    rows = self.session.execute(
                        SAMPLE_SQL, (self.known_list,), prepare=True, binary=True
                    ).fetchall()
                except psycopg.OperationalError as exc:
                    if not self.reconnect(exc, f"{self.samples} samples"):
                        return
                    next_at = time.monotonic()
                    continue
                t1 = time.time_ns()
                ts_us = (t0 + t1) // 2000
                if ts_us - second.start_us >= 1_000_000:
                    self._flush(second)
                    second = _Second(ts_us // 1_000_000 * 1_000_000)
                self.samples += 1
                self._keep(second, ts_us, rows, lag_ms, (t1 - t0) / 1e6)
                if (
                    self.options.blockers
                    and time.monotonic() - last_blockers >= 1.0
                    and any(r[3] == "Lock" for r in rows)
                ):
                    last_blockers = time.monotonic()
                    self._record_blockers(ts_us)
                next_at += interval
                pause = next_at - time.monotonic()
                if pause > 0:
                    self.stop_event.wait(pause)
                elif pause < -interval:  # far behind: skip missed slots, the lag records it
                    next_at = time.monotonic()
        finally:
            self._flush(second)

    def _keep(
        self,
        second: _Second,
        ts_us: int,
        rows: list[tuple[Any, ...]],
        lag_ms: float,
        query_ms: float,
    ) -> None:
        cols = second.rows
        texts: dict[int, str] = {}
        for row in rows:
            cols["ts_us"].append(ts_us)
            cols["sample_no"].append(self.samples)
            for name, value in zip(SAMPLE_COLUMNS, row, strict=False):
                cols[name].append(value)
            query_id, text = row[5], row[9]
            if query_id is not None and text is not None and query_id not in self.known_queries:
                texts[query_id] = text
        second.lags_ms.append(lag_ms)
        second.query_ms.append(query_ms)
        if texts:
            self.known_queries.update(texts)
            self.known_list = sorted(self.known_queries)
            self.store.db.execute(
                "INSERT OR IGNORE INTO activity_queries SELECT unnest(?), unnest(?), ?",
                [list(texts), list(texts.values()), ts_us],
            )

    def _flush(self, second: _Second) -> None:
        if not second.query_ms:
            return
        self.store.append("activity_samples", second.rows)
        lags, queries = second.lags_ms, second.query_ms
        self.store.append(
            "activity_rate",
            {
                "second_us": [second.start_us],
                "target_hz": [self.target_hz],
                "samples": [len(queries)],
                "lag_mean_ms": [sum(lags) / len(lags)],
                "lag_max_ms": [max(lags)],
                "query_mean_ms": [sum(queries) / len(queries)],
                "query_max_ms": [max(queries)],
            },
        )
        if len(queries) >= 3:  # a partial first second says little
            self._maybe_back_off(sorted(queries)[len(queries) // 2])

    def _maybe_back_off(self, median_query_ms: float) -> None:
        """Halve the rate after two consecutive seconds whose median sampling query took more
        than `backoff_share` of the interval: one slow second is noise (or the first,
        preparing execution), two are a server in trouble."""
        interval_ms = 1000.0 / self.target_hz
        slow = median_query_ms > self.options.backoff_share * interval_ms
        self.slow_seconds = self.slow_seconds + 1 if slow else 0
        if self.slow_seconds >= 2 and self.target_hz > 1:
            self.slow_seconds = 0
            self.target_hz = max(1.0, self.target_hz / 2)
            message = (
                f"sampling query takes {median_query_ms:.1f} ms (median): lowering the "
                f"rate to {self.target_hz:g} Hz to spare the server"
            )
            self.store.add_event("activity-backoff", message)
            self.ctx.say(f"collector activity: {message}")

    def _record_blockers(self, ts_us: int) -> None:
        try:
            pairs = self.session.execute(BLOCKERS_SQL).fetchall()
        except psycopg.Error:
            return  # best effort: the next second tries again
        if pairs:
            self.store.append(
                "activity_blockers",
                {
                    "ts_us": [ts_us] * len(pairs),
                    "pid": [p for p, _ in pairs],
                    "blocked_by": [b for _, b in pairs],
                },
            )
