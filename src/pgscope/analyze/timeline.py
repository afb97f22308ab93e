"""Events on the timeline: what an action (a CHECKPOINT, say) does to throughput.

For each step with an action, or a checkpoint the server started by itself (from its log):
the throughput before it (median of the per-second tps over the 10 s before, warm-up
excluded), the dip after it (the lowest mean of 3 consecutive seconds within 10 s, as a
share of that), how long throughput took to come back to 90% of it, and, where the `pgstats`
collector ran, WAL bytes and full-page images per second before and after. Pure functions of
the store.

Why 3 seconds: a dip that matters lasts (the field case's recovered over 5-10 s), while a
shared host stalls now and then for a single second (seen here: one second at a third of the
tps, the next above it, nothing before or after). And the lowest of noisy values is always
below their median, event or not. So each dip carries its noise, three robust standard
deviations (1.4826 x the median absolute deviation) of the seconds before, scaled to a 3-second
mean (/ sqrt 3), and the part of the dip beyond it; the diagnosis judges that part, not the
raw depth.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import duckdb

from pgscope.analyze.pgstats import rates
from pgscope.duck import table_exists

BEFORE_S = 10.0
AFTER_S = 10.0  # the field case's dips recovered within 5-10 s; later lows are other drift
RECOVERED = 0.9
NOISE_SIGMAS = 3.0
DIP_WINDOW = 3  # seconds averaged for the low point


@dataclass(frozen=True)
class Dip:
    step_id: int
    variant: str
    clients: int
    action: str
    action_us: int
    tps_before: float
    tps_lowest: float  # the lowest mean of DIP_WINDOW consecutive seconds after the action
    lowest_after_s: float  # seconds from the action to the end of that window
    recovered_after_s: float | None  # to 90% of tps_before; None: not within the step
    fpi_per_s_before: float | None
    fpi_per_s_after: float | None
    wal_bytes_per_s_before: float | None
    wal_bytes_per_s_after: float | None
    noise_pct: float  # how low a 3-second mean falls by chance: 3 robust sigmas before, in %

    @property
    def depth_pct(self) -> float:
        return (1 - self.tps_lowest / self.tps_before) * 100 if self.tps_before else 0.0

    @property
    def excess_pct(self) -> float:
        """The part of the dip beyond the seconds-to-second noise before it."""
        return max(0.0, self.depth_pct - self.noise_pct)


def noise_pct(seconds: list[float]) -> float:
    """Three robust standard deviations of a DIP_WINDOW-second mean of tps, as % of the
    median second: robust, so one odd second (the tail of an earlier event) does not widen it."""
    median = statistics.median(seconds)
    if median <= 0:
        return 0.0
    mad = statistics.median(abs(v - median) for v in seconds)
    return NOISE_SIGMAS * 1.4826 * mad / math.sqrt(DIP_WINDOW) / median * 100


def lowest_window(seconds: list[tuple[int, float]]) -> tuple[int, float]:
    """(end time, mean) of the DIP_WINDOW consecutive seconds with the lowest mean (of all of
    them when there are fewer)."""
    width = min(DIP_WINDOW, len(seconds))
    windows = [
        (seconds[i + width - 1][0], statistics.fmean(v for _, v in seconds[i : i + width]))
        for i in range(len(seconds) - width + 1)
    ]
    return min(windows, key=lambda w: w[1])


def _mean_in(series: list[tuple[int, float]], start: int, end: int) -> float | None:
    values = [v for t, v in series if start < t <= end]
    return statistics.fmean(values) if values else None


def dips(db: duckdb.DuckDBPyConnection) -> list[Dip]:
    # Actions, and checkpoints the server started by itself (time or WAL volume): an
    # immediate checkpoint is pgscope's own (before each step) or an action's, already listed.
    actions = db.execute(
        "SELECT e.step_id, e.ts_us, CASE e.kind WHEN 'action' THEN e.detail "
        "ELSE 'checkpoint (' || split_part(e.detail, ' ', 1) || ')' END, "
        "s.variant, s.clients, s.started_us, s.warmup_s "
        "FROM events e JOIN steps s USING (step_id) WHERE (e.kind = 'action' "
        "AND e.detail NOT LIKE '%not run%') OR (e.kind = 'checkpoint-start' "
        "AND e.detail NOT LIKE '%immediate%' AND e.detail NOT LIKE '%shutdown%' "
        "AND e.detail NOT LIKE '%end-of-recovery%') ORDER BY e.ts_us"
    ).fetchall()
    if not actions:
        return []
    have_counters = table_exists(db, "pgstats_counters")
    fpi = rates(db, "pg_stat_wal", "wal_fpi") if have_counters else []
    wal = rates(db, "pg_stat_wal", "wal_bytes") if have_counters else []
    out = []
    for step_id, action_us, detail, variant, clients, started_us, warmup_s in actions:
        seconds = db.execute(
            "SELECT ts_us, sum(tps) FROM timeline WHERE step_id = ? GROUP BY ts_us ORDER BY ts_us",
            [step_id],
        ).fetchall()
        steady_from = started_us + (warmup_s or 0) * 1e6
        before = [
            tps
            for ts, tps in seconds
            if max(steady_from, action_us - BEFORE_S * 1e6) < ts <= action_us
        ]
        after = [(ts, tps) for ts, tps in seconds if action_us < ts <= action_us + AFTER_S * 1e6]
        if len(before) < 3 or not after:
            continue  # too little steady state before the action to judge a dip
        reference = statistics.median(before)
        low_ts, low = lowest_window(after)
        recovered = next(
            (ts for ts, tps in seconds if ts > low_ts and tps >= RECOVERED * reference), None
        )
        window = int(5e6)
        out.append(
            Dip(
                int(step_id),
                str(variant),
                int(clients),
                str(detail).split(" at ")[0],
                int(action_us),
                reference,
                low,
                (low_ts - action_us) / 1e6,
                (recovered - action_us) / 1e6 if recovered is not None else None,
                _mean_in(fpi, action_us - window, action_us),
                _mean_in(fpi, action_us, action_us + window),
                _mean_in(wal, action_us - window, action_us),
                _mean_in(wal, action_us, action_us + window),
                noise_pct(before),
            )
        )
    return out


@dataclass(frozen=True)
class Series:
    """The run on one time axis (seconds since the run started), for the timeline view."""

    t0_us: int
    steps: list[tuple[int, str, int, float, float]]  # step_id, variant, clients, start s, end s
    tps: list[tuple[float, float]]  # (s, tps summed over instances)
    p95_ms: list[tuple[float, float]]  # (s, p95 latency of the transactions ending then)
    aas: dict[str, list[tuple[float, float]]]  # wait class -> (s, average active sessions)
    markers: list[tuple[float, str, str]]  # (s, kind, label): checkpoints, actions, restarts,
    # pgscope's own CHECKPOINT before each step (kind pgscope-checkpoint)
    # What the server was doing beside the workload, over a stretch of time: (start s, end s,
    # kind, label); a checkpoint in progress (kind "checkpoint"), from the server log or the
    # checkpointer's samples (waits.checkpoint_spans).
    spans: list[tuple[float, float, str, str]] = field(default_factory=list)


def series(db: duckdb.DuckDBPyConnection) -> Series:
    from pgscope.analyze.waits import aas_timeline, checkpoint_spans, has_samples

    run = db.execute("SELECT started_us FROM run").fetchone()
    t0 = int(run[0]) if run and run[0] else 0

    def s(ts: int) -> float:
        return (ts - t0) / 1e6

    steps = [
        (int(i), str(v), int(c), s(a), s(b))
        for i, v, c, a, b in db.execute(
            "SELECT step_id, variant, clients, started_us, coalesce(ended_us, started_us) "
            "FROM steps WHERE started_us IS NOT NULL ORDER BY step_id"
        ).fetchall()
    ]
    tps = [
        (s(t), float(v))
        for t, v in db.execute(
            "SELECT ts_us, sum(tps) FROM timeline GROUP BY ts_us ORDER BY ts_us"
        ).fetchall()
    ]
    p95 = [
        (s(t), float(v))
        for t, v in db.execute(
            "SELECT second_us + 500000, max(p95_ms) FROM latency_seconds WHERE p95_ms IS NOT NULL "
            "AND second_us IS NOT NULL "
            "GROUP BY second_us ORDER BY second_us"
        ).fetchall()
    ]
    aas: dict[str, list[tuple[float, float]]] = {}
    if has_samples(db):
        for ts, cls, value in aas_timeline(db):
            aas.setdefault(cls, []).append((s(ts + 500_000), value))
    markers = [
        (s(t), str(kind), str(detail))
        for t, kind, detail in db.execute(
            # The server log's immediate/shutdown checkpoints are pgscope's own between steps
            # (each marked by its own `pgscope-checkpoint` event, as pgscope's) or an action's
            # (marked as the action): drawn again they would bury the timed ones.
            "SELECT ts_us, kind, detail FROM events WHERE kind IN ('checkpoint-start', 'action', "
            "'pgscope-checkpoint', 'restart', 'pin', 'instance') AND NOT "
            "(kind = 'checkpoint-start' AND (detail LIKE '%immediate%' OR detail LIKE "
            "'%shutdown%')) ORDER BY ts_us"
        ).fetchall()
    ]
    spans = [
        (
            s(c.start_us),
            s(c.end_us),
            "checkpoint",
            f"checkpoint in progress, {(c.end_us - c.start_us) / 1e6:,.1f} s ({c.source}: "
            f"{c.detail})",
        )
        for c in checkpoint_spans(db)
    ]
    return Series(t0, steps, tps, p95, aas, markers, spans)
