"""Rates and per-step totals from the `pgstats` snapshots (cumulative counters).

A rate is the difference between consecutive snapshots divided by the time between them; a
counter that went down (a stats reset, a restart between variants) yields no rate for that
interval. Pure functions of the store.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from pgscope.duck import table_exists


def rates(
    db: duckdb.DuckDBPyConnection, source: str, counter: str, obj: str | None = None
) -> list[tuple[int, float]]:
    """(ts_us, per-second rate) between consecutive snapshots of one counter. For
    pg_stat_database without `obj`, the sum over databases. A snapshot at an edge two windows
    of an observation share is stored once for each (same time, same values): counted once."""
    rows = db.execute(
        "WITH c AS (SELECT ts_us, sum(value) AS v FROM (SELECT DISTINCT ts_us, object, value "
        "FROM pgstats_counters WHERE source = ? AND counter = ? AND (? IS NULL OR object = ?)) "
        "GROUP BY ts_us), "
        "d AS (SELECT ts_us, v - lag(v) OVER w AS dv, "
        "(ts_us - lag(ts_us) OVER w) / 1e6 AS dt FROM c WINDOW w AS (ORDER BY ts_us)) "
        "SELECT ts_us, dv / dt FROM d WHERE dt > 0 AND dv >= 0 ORDER BY ts_us",
        [source, counter, obj, obj],
    ).fetchall()
    return [(int(t), float(r)) for t, r in rows]


@dataclass(frozen=True)
class StepStats:
    """Counter totals over one step's load (from just before to just after), and per
    transaction."""

    step_id: int
    variant: str
    clients: int
    xacts: int
    seconds: float  # between the two boundary snapshots
    wal_bytes: float
    wal_fpi: float
    wal_records: float
    checkpoints: float
    buffers_backend: float
    commits: float
    rows_inserted: float
    log_bytes: float | None  # None: no server log directory to measure
    # Sessions started, and the time sessions that ended had lasted (pg_stat_database,
    # PostgreSQL 14+; None before)
    sessions: float | None = None
    session_ms: float | None = None
    # The WAL's writes and fsyncs (pg_stat_wal before 18, pg_stat_io from 18), and the
    # checkpoints' time writing and syncing (ms) and buffers written (pg_stat_bgwriter before
    # 17, pg_stat_checkpointer from 17)
    wal_writes: float | None = None
    wal_syncs: float | None = None
    checkpoint_write_ms: float | None = None
    checkpoint_sync_ms: float | None = None
    checkpoint_buffers: float | None = None
    # Transaction ids the server assigned, to every session (pg_current_snapshot's xmax)
    xids: float | None = None
    # Times a session found the WAL buffers full and wrote WAL out itself (pg_stat_wal, 14+)
    wal_buffers_full: float | None = None

    @property
    def wal_bytes_per_xact(self) -> float | None:
        return self.wal_bytes / self.xacts if self.xacts else None

    @property
    def fpi_per_xact(self) -> float | None:
        return self.wal_fpi / self.xacts if self.xacts else None

    @property
    def rows_per_commit(self) -> float | None:
        return self.rows_inserted / self.commits if self.commits else None

    @property
    def wal_syncs_per_xact(self) -> float | None:
        return self.wal_syncs / self.xacts if self.wal_syncs is not None and self.xacts else None

    @property
    def wal_buffers_full_per_xact(self) -> float | None:
        if self.wal_buffers_full is None or not self.xacts:
            return None
        return self.wal_buffers_full / self.xacts

    @property
    def sessions_per_xact(self) -> float | None:
        return self.sessions / self.xacts if self.sessions is not None and self.xacts else None

    @property
    def mean_session_ms(self) -> float | None:
        if not self.sessions or self.session_ms is None:
            return None
        return self.session_ms / self.sessions

    @property
    def log_bytes_per_s(self) -> float | None:
        if self.log_bytes is None or self.seconds <= 0:
            return None
        return self.log_bytes / self.seconds


# A step counter -> where each PostgreSQL version keeps it: (view, object, its columns
# summed), oldest first; a step takes the first that has snapshots. The same meaning across
# versions: 17 moved the checkpoint counters to pg_stat_checkpointer and the backends' own
# buffer writes to pg_stat_io only (16+ has both); 18 moved WAL writes and fsyncs from
# pg_stat_wal to pg_stat_io (collect/statistics/pgstats.py sums the rows these come from).
Place = tuple[str, str | None, tuple[str, ...]]
STEP_COUNTERS: dict[str, tuple[Place, ...]] = {
    "wal_bytes": (("pg_stat_wal", None, ("wal_bytes",)),),
    "wal_fpi": (("pg_stat_wal", None, ("wal_fpi",)),),
    "wal_records": (("pg_stat_wal", None, ("wal_records",)),),
    "checkpoints": (
        ("pg_stat_bgwriter", None, ("checkpoints_req", "checkpoints_timed")),
        ("pg_stat_checkpointer", None, ("num_requested", "num_timed")),
    ),
    "buffers_backend": (
        ("pg_stat_bgwriter", None, ("buffers_backend",)),
        ("pg_stat_io", "backends", ("writes",)),
    ),
    "commits": (("pg_stat_database", None, ("xact_commit",)),),
    "rows_inserted": (("pg_stat_database", None, ("tup_inserted",)),),
    "log_bytes": (("pg_ls_logdir", None, ("bytes",)),),
    "sessions": (("pg_stat_database", None, ("sessions",)),),
    "session_ms": (("pg_stat_database", None, ("session_time",)),),
    "wal_writes": (("pg_stat_wal", None, ("wal_write",)), ("pg_stat_io", "wal", ("writes",))),
    "wal_syncs": (("pg_stat_wal", None, ("wal_sync",)), ("pg_stat_io", "wal", ("fsyncs",))),
    "checkpoint_write_ms": (
        ("pg_stat_bgwriter", None, ("checkpoint_write_time",)),
        ("pg_stat_checkpointer", None, ("write_time",)),
    ),
    "checkpoint_sync_ms": (
        ("pg_stat_bgwriter", None, ("checkpoint_sync_time",)),
        ("pg_stat_checkpointer", None, ("sync_time",)),
    ),
    "checkpoint_buffers": (
        ("pg_stat_bgwriter", None, ("buffers_checkpoint",)),
        ("pg_stat_checkpointer", None, ("buffers_written",)),
    ),
    "xids": (("pg_current_snapshot", None, ("xmax",)),),
    "wal_buffers_full": (("pg_stat_wal", None, ("wal_buffers_full",)),),
}
# Measured only where the server writes a log directory; since PostgreSQL 14; or read by no
# store written before these were mapped.
OPTIONAL = {
    "log_bytes",
    "sessions",
    "session_ms",
    "wal_writes",
    "wal_syncs",
    "checkpoint_write_ms",
    "checkpoint_sync_ms",
    "checkpoint_buffers",
    "xids",
    "wal_buffers_full",
}


def _step_total(
    db: duckdb.DuckDBPyConnection, step_id: int, places: tuple[Place, ...]
) -> float | None:
    """A counter's growth over one step, from the first place that has both its snapshots."""
    for source, obj, counters in places:
        row = db.execute(
            "SELECT sum(value) FILTER (WHERE mark = 'end') - "
            "sum(value) FILTER (WHERE mark = 'start') FROM pgstats_counters "
            "WHERE step_id = ? AND source = ? AND (? IS NULL OR object = ?) "
            "AND list_contains(?, counter)",
            [step_id, source, obj, obj, list(counters)],
        ).fetchone()
        if row and row[0] is not None:
            return float(row[0])
    return None


def per_step(db: duckdb.DuckDBPyConnection) -> list[StepStats]:
    """For each step: the counters' growth between the snapshots taken just before its load
    and just after, per transaction over the whole step (warm-up included on both sides)."""
    if not table_exists(db, "pgstats_counters"):
        return []
    out = []
    steps = db.execute(
        "SELECT s.step_id, s.variant, s.clients, sum(l.xacts), "
        "(SELECT (max(ts_us) - min(ts_us)) / 1e6 FROM pgstats_counters c "
        " WHERE c.step_id = s.step_id) "
        "FROM steps s JOIN latency_seconds l USING (step_id) GROUP BY ALL ORDER BY s.step_id"
    ).fetchall()
    for step_id, variant, clients, xacts, seconds in steps:
        values = {key: _step_total(db, step_id, places) for key, places in STEP_COUNTERS.items()}
        required = {k: v for k, v in values.items() if k not in OPTIONAL and v is not None}
        if len(required) < len(STEP_COUNTERS) - len(OPTIONAL):
            continue  # no boundary snapshots for this step (it failed, or an older store)
        out.append(
            StepStats(
                int(step_id),
                str(variant),
                int(clients),
                int(xacts or 0),
                float(seconds or 0.0),
                **required,
                **{key: values[key] for key in OPTIONAL},  # type: ignore[arg-type]
            )
        )
    return out


# Above this many transaction ids a second, a load on a user's server is said to have taken
# many: a read-only load takes none of its own, and each id brings the server's
# anti-wraparound vacuum nearer (measured: `SELECT txid_current()` as a pg_monitor role takes
# ~33,000 a second per client).
MANY_XIDS_PER_S = 1000.0


@dataclass(frozen=True)
class XidUse:
    """Transaction ids the server assigned while the load ran (the steps, from just before
    each to just after), to every session on it: the load's and any other's."""

    assigned: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.assigned / self.seconds if self.seconds > 0 else 0.0

    @property
    def many(self) -> bool:
        return self.per_second > MANY_XIDS_PER_S

    def describe(self) -> str:
        return (
            f"transaction ids assigned during the load: {self.assigned:,} "
            f"({self.per_second:,.0f} per second, by every session on the server)"
        )

    def warning(self) -> str | None:
        if not self.many:
            return None
        return (
            f"the server assigned {self.assigned:,} transaction ids while the load ran "
            f"({self.per_second:,.0f} per second): a read-only load takes none unless its SQL "
            f"asks for one (txid_current(), pg_current_xact_id()), so other sessions' writes "
            f"or the scripts did; each brings the server's anti-wraparound vacuum nearer"
        )


def xid_use(counters: list[StepStats]) -> XidUse | None:
    """The transaction ids assigned over the steps that measured them, or None (no pgstats
    snapshots, or a store from before they were read)."""
    measured = [c for c in counters if c.xids is not None]
    if not measured:
        return None
    return XidUse(int(sum(c.xids or 0.0 for c in measured)), sum(c.seconds for c in measured))
