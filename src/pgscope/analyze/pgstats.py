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
    pg_stat_database without `obj`, the sum over databases."""
    rows = db.execute(
        "WITH c AS (SELECT ts_us, sum(value) AS v FROM pgstats_counters "
        "WHERE source = ? AND counter = ? AND (? IS NULL OR object = ?) GROUP BY ts_us), "
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


_STEP_COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "wal_bytes": ("pg_stat_wal", ("wal_bytes",)),
    "wal_fpi": ("pg_stat_wal", ("wal_fpi",)),
    "wal_records": ("pg_stat_wal", ("wal_records",)),
    "checkpoints": ("pg_stat_bgwriter", ("checkpoints_req", "checkpoints_timed")),
    "buffers_backend": ("pg_stat_bgwriter", ("buffers_backend",)),
    "commits": ("pg_stat_database", ("xact_commit",)),
    "rows_inserted": ("pg_stat_database", ("tup_inserted",)),
    "log_bytes": ("pg_ls_logdir", ("bytes",)),
    "sessions": ("pg_stat_database", ("sessions",)),
    "session_ms": ("pg_stat_database", ("session_time",)),
}
# Measured only where the server writes a log directory; since PostgreSQL 14.
OPTIONAL = {"log_bytes", "sessions", "session_ms"}


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
        values: dict[str, float | None] = {}
        for key, (source, counters) in _STEP_COUNTERS.items():
            row = db.execute(
                "SELECT sum(value) FILTER (WHERE mark = 'end') - "
                "sum(value) FILTER (WHERE mark = 'start') FROM pgstats_counters "
                "WHERE step_id = ? AND source = ? AND list_contains(?, counter)",
                [step_id, source, list(counters)],
            ).fetchone()
            values[key] = float(row[0]) if row and row[0] is not None else None
        required = {k: v for k, v in values.items() if k not in OPTIONAL and v is not None}
        if len(required) < len(_STEP_COUNTERS) - len(OPTIONAL):
            continue  # no boundary snapshots for this step (it failed, or an older store)
        out.append(
            StepStats(
                int(step_id),
                str(variant),
                int(clients),
                int(xacts or 0),
                float(seconds or 0.0),
                log_bytes=values["log_bytes"],
                sessions=values["sessions"],
                session_ms=values["session_ms"],
                **required,
            )
        )
    return out
