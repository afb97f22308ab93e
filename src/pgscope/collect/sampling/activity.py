"""Wait-event sampling from outside: what every server process is doing, many times a second.

How: one statement per second takes a whole second of samples inside the server, each one a
fresh read of the backend status array (`pg_stat_get_activity`, what `pg_stat_activity` shows)
after sleeping until its scheduled time, and comes back as one row per sample: its processes
as one text, split into rows by DuckDB when written (every `flush_s`). A round trip per sample
would cost five times as much CPU, a row per process twice as much of ours (measured:
docs/benchmarks.md).

What it records (tables below): every process at every sample (pid, backend type, state, wait
event, query_id, database, user, application) but background processes in their idle
main-loop waits and pgscope's own sessions, which no analysis counts (an empty sample keeps a
row of the sampler's own, so every instant is counted); the blockers of sessions waiting on
heavyweight locks (at most once a second: `pg_blocking_pids` takes the lock manager's locks),
the text of each query_id the first time it is seen, and per second its own achieved rate,
lag and read time, so a user sees the real resolution. Sample times are the server's clock
mapped onto this host's clock (the clock pgbench and every other table use).

What it costs: ~0.1 ms of server CPU per sample under load, mostly waking up and copying the
status array, and ~0.03-0.05 ms of ours (~0.8% of one core at 50 Hz); docs/benchmarks.md has
the measured figures. Its own session shows as active (Timeout:PgSleep) on the server and
holds a snapshot for a second at a time. If reading the status array gets slow (a server in
trouble), it halves its rate and says so rather than add load.

Needs no extension. On a server it does not own it needs `pg_monitor` (or
`pg_read_all_stats`): without it, other sessions' wait events read as NULL.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from typing import Any, Literal

import psycopg
from pydantic import BaseModel, ConfigDict, Field

from pgscope.collect.base import (
    Availability,
    CollectorContext,
    CollectorEnv,
    CollectorError,
    StepInfo,
)
from pgscope.collect.polling import PollingCollector
from pgscope.collect.sampling import shmem
from pgscope.collect.sampling.samplecost import cost_line
from pgscope.collect.statistics.statements import masked
from pgscope.errors import TargetError
from pgscope.store import now_us
from pgscope.target.conn import ConnParams

APPLICATION = "pgscope-sampler"


# One statement = `n` samples, `interval` seconds apart, one result row per sample. Details
# that matter, each checked against EXPLAIN and against a session whose state alternates:
# - the status array is cached per transaction: pg_stat_clear_snapshot() before each read;
# - the reads must be re-executed per sample: the function's argument refers to s.n (a
#   function scan whose arguments did not change rewinds its materialised result), and
#   OFFSET 0 keeps the planner from pulling the sleep's subquery up and out of the loop;
# - sleeps aim at statement start + (n-1) * interval, so lateness does not accumulate;
# - a sample's processes come as one text (fields split by \x1f, processes by \x1e: none of
#   them can hold either, application_name being printable ASCII), which DuckDB splits when
#   the rows are written: no per-process row in the protocol, no per-process Python object
#   (measured: docs/benchmarks.md). Times are float8 (date_part), not numeric (extract);
# - left out on the server: background processes in their idle main-loop waits (classes
#   Activity and Extension) and pgscope's own sessions, which no analysis counts (waits.py
#   ACTIVE, CLIENTS); a sample left with no process still gets its row (`rows` NULL), written
#   as one row of the sampler itself, so that every sampling instant stays counted;
# - a query's text comes the first time its query_id is seen, as "id\x1ftext";
# - a parallel worker's leader comes last (leader_pid): a worker starting has no query_id
#   yet (it reports its leader's once it runs), and its time is its leader's statement's;
# - the last column counts the databases and roles we have no name for (computed once per
#   statement): the names are read again before the samples naming them are written.
BATCH_SQL = """
SELECT s.n,
       (date_part('epoch', p.t0) * 1000000)::bigint,
       (date_part('epoch', p.t0 - statement_timestamp()) * 1000000)::bigint
           - (%(interval)s * 1000000 * (s.n - 1))::bigint,
       (date_part('epoch', a.t1 - p.t0) * 1000000)::bigint,
       a.rows,
       a.texts,
       (SELECT count(*) FROM pg_database WHERE oid::bigint <> ALL(%(databases)s::bigint[]))
           + (SELECT count(*) FROM pg_roles WHERE oid::bigint <> ALL(%(roles)s::bigint[]))
FROM generate_series(1, %(n)s) AS s(n)
CROSS JOIN LATERAL (
    SELECT pg_sleep(greatest(0, %(interval)s * (s.n - 1)
                    - date_part('epoch', clock_timestamp() - statement_timestamp()))),
           pg_stat_clear_snapshot(),
           clock_timestamp() AS t0
    OFFSET 0) AS p
CROSS JOIN LATERAL (
    SELECT string_agg(concat(g.pid, E'\\x1f', g.backend_type, E'\\x1f', g.state, E'\\x1f',
                             g.wait_event_type, E'\\x1f', g.wait_event, E'\\x1f', g.query_id,
                             E'\\x1f', g.datid, E'\\x1f', g.usesysid, E'\\x1f',
                             g.application_name, E'\\x1f',
                             CASE WHEN g.query_id IS NULL AND g.state = 'active'
                                  AND g.backend_type = 'client backend'
                             THEN translate(left(
                                 -- a password named in it is never read out (MASK)
                                 coalesce(substring(g.query FROM '(?i)^.*?password'), g.query),
                                 200), E'\\x1e\\x1f', '  ') END,
                             E'\\x1f', g.leader_pid),
                      E'\\x1e') AS rows,
           array_agg(g.query_id || E'\\x1f' || g.query)
               FILTER (WHERE g.query_id <> ALL(%(known)s::bigint[])
                       AND g.query_id IS NOT NULL) AS texts,
           clock_timestamp() AS t1
    FROM pg_stat_get_activity(CASE WHEN s.n > 0 THEN NULL::int END) AS g
    WHERE g.pid <> pg_backend_pid()
      AND (g.backend_type = 'client backend' OR g.wait_event_type IS NULL
           OR g.wait_event_type NOT IN ('Activity', 'Extension'))
      AND coalesce(g.application_name, '') NOT LIKE 'pgscope%%') AS a
"""
# The samples taken in (given as lists: a registered table costs more per write), split into
# the table's rows, database and role oids named; a sample with no process is one row of the
# sampler's own (pid $own).
WRITE_SQL = """
INSERT INTO activity_samples
WITH samples AS (
    SELECT unnest($ts_us) AS ts_us, unnest($sample_no) AS sample_no,
           unnest($processes) AS processes)
SELECT ts_us, sample_no, f[1]::INTEGER, f[2], nullif(f[3], ''), nullif(f[4], ''),
       nullif(f[5], ''), nullif(f[6], '')::BIGINT,
       $db_names[list_position($db_oids, nullif(f[7], '')::BIGINT)],
       $role_names[list_position($role_oids, nullif(f[8], '')::BIGINT)], f[9], nullif(f[10], '')
FROM (SELECT ts_us, sample_no,
             string_split(unnest(string_split(processes, chr(30))), chr(31)) AS f
      FROM samples WHERE processes IS NOT NULL)
UNION ALL
SELECT ts_us, sample_no, $own, 'client backend', 'active', NULL, NULL, NULL, NULL, NULL,
       $application, NULL
FROM samples WHERE processes IS NULL
"""
# The same, for samples with parallel workers in them: a worker without a query_id (starting)
# takes its leader's in the same sample (and its statement's text, where the server computes
# no query id), so that the account counts its time in its leader's statement. A join, which
# samples without workers do without.
WRITE_LED_SQL = """
INSERT INTO activity_samples
WITH samples AS (
    SELECT unnest($ts_us) AS ts_us, unnest($sample_no) AS sample_no,
           unnest($processes) AS processes),
rows AS (
    SELECT ts_us, sample_no, f[1]::INTEGER AS pid, f[2] AS backend_type,
           nullif(f[3], '') AS state, nullif(f[4], '') AS wait_event_type,
           nullif(f[5], '') AS wait_event, nullif(f[6], '')::BIGINT AS query_id,
           nullif(f[7], '')::BIGINT AS datid, nullif(f[8], '')::BIGINT AS usesysid,
           f[9] AS application_name, nullif(f[10], '') AS command,
           nullif(f[11], '')::INTEGER AS leader
    FROM (SELECT ts_us, sample_no,
                 string_split(unnest(string_split(processes, chr(30))), chr(31)) AS f
          FROM samples WHERE processes IS NOT NULL))
SELECT r.ts_us, r.sample_no, r.pid, r.backend_type, r.state, r.wait_event_type, r.wait_event,
       coalesce(r.query_id, l.query_id), $db_names[list_position($db_oids, r.datid)],
       $role_names[list_position($role_oids, r.usesysid)], r.application_name,
       coalesce(r.command, l.command)
FROM rows r LEFT JOIN rows l ON l.sample_no = r.sample_no AND l.pid = r.leader
UNION ALL
SELECT ts_us, sample_no, $own, 'client backend', 'active', NULL, NULL, NULL, NULL, NULL,
       $application, NULL
FROM samples WHERE processes IS NULL
"""
WORKER = "\x1fparallel worker\x1f"  # a parallel worker, in a sample's text
RATE_SQL = (
    "INSERT INTO activity_rate SELECT unnest($second_us), unnest($target_hz), "
    "unnest($samples), unnest($lag_mean_ms), unnest($lag_max_ms), unnest($query_mean_ms), "
    "unnest($query_max_ms)"
)
# Each session waiting on a heavyweight lock, each session blocking it, the lock it waits
# for (the relation, where the lock is on one) and what its blocker was doing: its state, how
# long it has been in its transaction and in that state, its last statement. A lock's holder
# that sits idle in its transaction is a cause of its own, which the waiter's wait does not say.
BLOCKERS_SQL = """
SELECT w.pid, b.pid, l.locktype, l.relation::regclass::text, l.mode, b.state,
       extract(epoch FROM clock_timestamp() - b.xact_start),
       extract(epoch FROM clock_timestamp() - b.state_change),
       b.query_id, left(b.query, 500), b.application_name
FROM pg_stat_activity w
CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS blocking(pid)
JOIN pg_stat_activity b ON b.pid = blocking.pid
LEFT JOIN LATERAL (SELECT locktype, relation, mode FROM pg_locks
                   WHERE pid = w.pid AND NOT granted LIMIT 1) l ON true
WHERE w.wait_event_type = 'Lock' AND w.pid <> pg_backend_pid()
"""
BLOCKER_COLUMNS = (
    "pid",
    "blocked_by",
    "locktype",
    "relation",
    "mode",
    "blocker_state",
    "blocker_xact_s",
    "blocker_state_s",
    "blocker_query_id",
    "blocker_query",
    "blocker_application",
)
RIGHTS_SQL = (
    "SELECT rolsuper OR pg_has_role(current_user, 'pg_read_all_stats', 'USAGE'), current_user "
    "FROM pg_roles WHERE rolname = current_user"
)
NAMES_SQL = (
    "SELECT 'd', oid, datname FROM pg_database UNION ALL SELECT 'u', oid, rolname FROM pg_roles"
)
CLOCK_SQL = "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
# Blockers are read after a batch (a second of samples by default) that saw a lock wait, at
# most about once a second. Not exactly one: a batch can end a few ms short of a second after
# the last reading, and a guard of 1.0 s skipped every other batch (a reading every 2 s).
BLOCKERS_EVERY_S = 0.9
LOCK_WAIT = "\x1fLock\x1f"  # a process waiting on a heavyweight lock, in a sample's text

RATE_COLUMNS = (
    "second_us",
    "target_hz",
    "samples",
    "lag_mean_ms",
    "lag_max_ms",
    "query_mean_ms",
    "query_max_ms",
)


class ActivityOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hz: float = Field(50.0, gt=0, le=1000, description="samples per second")
    source: Literal["sql", "memory", "auto"] = Field(
        "sql",
        description="sql: ask the server (pg_stat_get_activity; any server, pg_monitor); "
        "memory: read its shared memory (root, server on this host; no server CPU per "
        "sample: collect/sampling/shmem.py); auto: memory where it can, else sql",
    )
    batch_s: float = Field(1.0, gt=0, le=10, description="seconds of samples per statement")
    flush_s: float = Field(
        10.0,
        gt=0,
        le=60,
        description="how often rows are written to the store: each write costs ~3-9 ms of "
        "CPU whatever its size, so rarer writes cost less; a SIGKILL loses at most this much "
        "(a normal stop or Ctrl-C writes everything); `--live` writes every second",
    )
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
        description="halve the rate when even the fastest read of the status array in a "
        "batch takes more than this share of the interval, two batches in a row",
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


class ActivityCollector(PollingCollector):
    name = "activity"
    summary = "wait-event samples of every session from pg_stat_activity, no extension"
    cost = cost_line()
    default_in_runs = True
    Options = ActivityOptions
    application_name = APPLICATION

    options: ActivityOptions

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        if env.conn is None:  # an embedded cluster: we are its superuser
            return Availability.yes()
        return check_rights(env.conn)

    def opened(self) -> None:
        super().opened()
        self.layout = self._memory_layout()
        # The postmaster whose memory the sampler reads now (set by it, after a restart too).
        self.sampling_postmaster = self.layout.postmaster if self.layout is not None else None
        self.sampling_again = threading.Event()

    def target_restarted(self) -> None:
        """From memory: back once the sampler has found the new server's layout, so that the
        next step is sampled from its start (finding it takes 1-2 s; a step began 40 ms after
        a restart and lost 1.7 of its 3 s). Through SQL the session reconnects by itself."""
        if self.layout is None:
            return
        deadline = time.monotonic() + self.reconnect_s
        while time.monotonic() < deadline and self.thread.is_alive() and not self.error:
            postmaster = self.ctx.postmaster_pid()
            if postmaster is None or self.sampling_postmaster == postmaster:
                return
            self.sampling_again.wait(0.05)
            self.sampling_again.clear()

    def _memory_layout(self) -> shmem.Layout | None:
        """How to read the server's shared memory, when the source says to and it can;
        None: sample through SQL. Recorded as an event either way, for the report."""
        source = self.options.source
        if source == "sql":
            return None
        layout = None
        try:
            layout = self._calibrate()
        except shmem.ShmemError as exc:
            if source == "memory":
                raise CollectorError(f"cannot sample from shared memory: {exc}") from None
            why = str(exc)
        message = (
            f"sampling from the server's shared memory (postmaster {layout.postmaster}); "
            f"wait numbers named from {layout.wait_names_source}"
            if layout is not None
            else f"sampling through SQL: {why}"
        )
        self.store.add_event("activity-source", message)
        return layout

    def _calibrate(self) -> shmem.Layout:
        """The layout of the server's arrays, checked to be readable here, and the sampler
        built: ShmemError says why not."""
        from pgscope.collect.sampling.activitymem import helper_binary

        postmaster = self.ctx.postmaster_pid()
        if postmaster is None:
            raise shmem.ShmemError("the server is not on this host")
        if not self.ctx.env.is_root:
            raise shmem.ShmemError("reading another process's memory needs root")
        layout = shmem.calibrate(self.session, postmaster)
        shmem.Reader(layout).close()  # can it be mapped, too
        helper_binary()
        return layout

    def prepare(self, ctx: CollectorContext) -> None:
        ctx.store.create_tables(self.name)
        self.reconnect_s = self.options.reconnect_s
        self.samples = 0
        self.target_hz = self.options.hz
        self.slow_seconds = 0
        self.known_queries: set[int] = set()
        self.names: dict[tuple[str, int], str] = {}
        self.clock_offset_us = 0
        self.own_pid = 0
        # Per sample taken in and not yet written: (host time, sample number, its processes).
        self.pending_samples: list[tuple[int, int, str | None]] = []
        self.pending_rate: list[tuple[Any, ...]] = []
        self.open_seconds: dict[int, dict[int, tuple[float, float]]] = {}
        self.last_flush = time.monotonic()
        # A step's end asks for its samples to be written now (an observation closes its
        # windows once they are), not at the next `flush_s`.
        self.flush_asked = threading.Event()
        # The last sample taken in, and the last one written: everything up to it is stored.
        self.taken_until_us = self.written_until_us = now_us()

    def step_finished(self, step: StepInfo) -> None:
        self.flush_asked.set()

    def written_until(self) -> int | None:
        if not self.thread.is_alive():
            return None  # nothing more will come
        return self.written_until_us

    def flush_due(self) -> bool:
        return (
            self.flush_asked.is_set() or time.monotonic() - self.last_flush >= self.options.flush_s
        )

    def connect(self) -> psycopg.Connection[Any]:
        session = self.ctx.conn.connect(application_name=self.application_name)
        session.execute(f"SET statement_timeout = '{int(self.options.batch_s * 1000) + 5000}ms'")
        self.clock_offset_us = self._clock_offset(session)
        self._load_names(session)
        self.own_pid = session.info.backend_pid
        return session

    @staticmethod
    def _clock_offset(session: psycopg.Connection[Any]) -> int:
        """Host clock minus server clock, from the fastest of a few round trips."""
        best: tuple[int, int] | None = None
        for _ in range(5):
            before = now_us()
            row = session.execute(CLOCK_SQL).fetchone()
            after = now_us()
            if row is not None and (best is None or after - before < best[0]):
                best = (after - before, (before + after) // 2 - int(row[0]))
        return best[1] if best else 0

    def _load_names(self, session: psycopg.Connection[Any]) -> None:
        for kind, oid, name in session.execute(NAMES_SQL).fetchall():
            self.names[(kind, int(oid))] = name

    def run_loop(self) -> None:
        if self.layout is not None:
            self._sample_memory(self.layout)
            return
        try:
            self._sample_until_stopped()
        finally:
            for second in sorted(self.open_seconds):
                self._close_second(second, self.open_seconds.pop(second))
            self._flush()

    def _sample_memory(self, layout: shmem.Layout) -> None:
        from pgscope.collect.sampling.activitymem import MemorySampler

        sampler = MemorySampler(self, layout, self._calibrate)
        try:
            sampler.run()
        except shmem.ShmemError as exc:
            self.error = f"{exc} after {self.samples} samples"
        finally:
            sampler.close_seconds()
            sampler.flush()
            sampler.rename()
            sampler.close()
            if self.samples:
                self.store.add_event(
                    "activity-cost",
                    f"the shared-memory sampler used {sampler.helper_cpu_ns / 1e6:.0f} ms of "
                    f"CPU for {self.samples} samples "
                    f"({sampler.helper_cpu_ns / 1e3 / self.samples:.1f} us each)",
                )

    def _sample_until_stopped(self) -> None:
        cursor = self.session.cursor(binary=True)
        last_blockers = 0.0
        while not self.stop_event.is_set():
            n = max(1, round(self.target_hz * self.options.batch_s))
            params = {
                "n": n,
                "interval": 1.0 / self.target_hz,
                "known": sorted(self.known_queries),
                "databases": [oid for kind, oid in self.names if kind == "d"],
                "roles": [oid for kind, oid in self.names if kind == "u"],
            }
            try:
                cursor.execute(BATCH_SQL, params, prepare=True)
                rows = cursor.fetchall()
            except psycopg.OperationalError as exc:
                if not self.reconnect(exc, f"{self.samples} samples"):
                    return
                cursor = self.session.cursor(binary=True)
                continue
            self._keep(rows)
            if self.flush_due():
                self._flush()
            if (
                self.options.blockers
                and time.monotonic() - last_blockers >= BLOCKERS_EVERY_S
                and any(row[4] is not None and LOCK_WAIT in row[4] for row in rows)
            ):
                last_blockers = time.monotonic()
                self._record_blockers()

    def _keep(self, rows: list[tuple[Any, ...]]) -> None:
        """Take in one batch, a row per sample: its processes (written by _flush, which
        splits them), its lag and read time (per second, in the rate rows), the texts of
        queries seen for the first time (written now: they are rare)."""
        if not rows:
            return
        offset, base = self.clock_offset_us, self.samples
        per_second = self.open_seconds
        pending = self.pending_samples
        texts: dict[int, str] = {}
        if rows[0][6]:
            # A database or role created while sampling; unnamed until the next batch if
            # this fails (a connection lost shows in the next batch, which reconnects).
            with contextlib.suppress(psycopg.Error):
                self._load_names(self.session)
        for n, ts, lag_us, read_us, processes, new_texts, _ in rows:
            ts_us = ts + offset
            pending.append((ts_us, base + n, processes))
            per_second.setdefault(ts_us // 1_000_000 * 1_000_000, {})[base + n] = (
                lag_us / 1000,
                read_us / 1000,
            )
            for entry in new_texts or ():
                query_id, _, text = entry.partition("\x1f")
                texts.setdefault(int(query_id), text)
        self.samples = base + max(r[0] for r in rows)
        self.taken_until_us = max(self.taken_until_us, max(r[1] for r in rows) + offset)
        # A batch rarely starts on a second boundary: a second stays open until a later
        # sample has moved past it, so its rate row counts the samples of both batches.
        latest = max(per_second)
        for second in sorted(per_second):
            if second < latest:
                self._close_second(second, per_second.pop(second))
        if texts:
            texts = {q: masked(t) or "" for q, t in texts.items()}
            self.known_queries.update(texts)
            self.store.db.execute(
                "INSERT OR IGNORE INTO activity_queries SELECT unnest(?), unnest(?), ?",
                [list(texts), list(texts.values()), rows[0][1] + offset],
            )
        self._maybe_back_off(min(r[3] for r in rows) / 1000)

    def _close_second(self, second: int, by_sample: dict[int, tuple[float, float]]) -> None:
        lags = [lag for lag, _ in by_sample.values()]
        reads = [read for _, read in by_sample.values()]
        self.pending_rate.append(
            (
                second,
                self.target_hz,
                len(by_sample),
                statistics.fmean(lags),
                max(lags),
                statistics.fmean(reads),
                max(reads),
            )
        )

    def _flush(self) -> None:
        """Write what was taken in, one statement per table: the samples split into rows by
        DuckDB, the rate rows."""
        self.flush_asked.clear()
        taken = self.taken_until_us
        if self.pending_samples:
            ts_us, sample_no, processes = zip(*self.pending_samples, strict=True)
            led = any(p is not None and WORKER in p for p in processes)
            self.store.db.execute(
                WRITE_LED_SQL if led else WRITE_SQL,
                {
                    "ts_us": list(ts_us),
                    "sample_no": list(sample_no),
                    "processes": list(processes),
                    **self._name_lists(),
                    "own": self.own_pid,
                    "application": self.application_name,
                },
            )
            self.pending_samples.clear()
        if self.pending_rate:
            columns = zip(*self.pending_rate, strict=True)
            self.store.db.execute(
                RATE_SQL,
                {name: list(values) for name, values in zip(RATE_COLUMNS, columns, strict=True)},
            )
            self.pending_rate.clear()
        self.last_flush = time.monotonic()
        self.written_until_us = taken

    def _name_lists(self) -> dict[str, list[Any]]:
        """The names known, as the lists WRITE_SQL looks oids up in."""
        lists: dict[str, list[Any]] = {
            "db_oids": [],
            "db_names": [],
            "role_oids": [],
            "role_names": [],
        }
        for (kind, oid), name in self.names.items():
            prefix = "db" if kind == "d" else "role"
            lists[f"{prefix}_oids"].append(oid)
            lists[f"{prefix}_names"].append(name)
        return lists

    def _maybe_back_off(self, fastest_read_ms: float) -> None:
        """Halve the rate after two batches in which even the fastest read of the status
        array took more than `backoff_share` of the interval: a server in trouble, which
        sampling as often would only load further. Lateness and the median are no signal:
        on a saturated CPU the sampler's own session is preempted, which slows some reads and
        delays wake-ups, but rarely the fastest of a batch."""
        interval_ms = 1000.0 / self.target_hz
        slow = fastest_read_ms > self.options.backoff_share * interval_ms
        self.slow_seconds = self.slow_seconds + 1 if slow else 0
        if self.slow_seconds >= 2 and self.target_hz > 1:
            self.slow_seconds = 0
            self.target_hz = max(1.0, self.target_hz / 2)
            message = (
                f"reading the status array takes {fastest_read_ms:.2f} ms at best: lowering "
                f"the rate to {self.target_hz:g} Hz to spare the server"
            )
            self.store.add_event("activity-backoff", message)
            self.ctx.say(f"collector activity: {message}")

    def _record_blockers(self) -> None:
        try:
            rows = self.session.execute(BLOCKERS_SQL).fetchall()
        except psycopg.Error:
            return  # best effort: the next batch tries again
        if rows:
            self.store.append(
                "activity_blockers",
                {
                    "ts_us": [now_us()] * len(rows),
                    **{name: [row[i] for row in rows] for i, name in enumerate(BLOCKER_COLUMNS)},
                },
            )
