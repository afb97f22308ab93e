"""What the usdt collector's tables say: pure functions of a run store (docs/collector-usdt.md).

Latency events (LWLock waits and holds, lock waits, smgr reads and writes, dirty WAL buffer
writes) are summed per (event, object, mode) with their log2 histograms, over a whole run,
a time window or each step's measured window; counters become totals and rates over the
seconds the programs covered; checkpoints come back whole, phases and flush histogram.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb

from pgscope.duck import table_exists

TABLES = ("usdt_seconds", "usdt_latency", "usdt_latency_hist", "usdt_counters")


def has_usdt(db: duckdb.DuckDBPyConnection) -> bool:
    return table_exists(db, "usdt_seconds")


def _window(start_us: int | None, end_us: int | None, column: str = "second_us") -> str:
    """A WHERE fragment for [start_us, end_us) on a table's second."""
    parts = ["TRUE"]
    if start_us is not None:
        parts.append(f"{column} >= {int(start_us)}")
    if end_us is not None:
        parts.append(f"{column} < {int(end_us)}")
    return " AND ".join(parts)


@dataclass(frozen=True)
class Bucket:
    lo_ns: int  # [lo_ns, hi_ns)
    hi_ns: int
    count: int

    def to_json(self) -> dict[str, int]:
        return {"lo_ns": self.lo_ns, "hi_ns": self.hi_ns, "count": self.count}


@dataclass(frozen=True)
class LatencySummary:
    """One kind of event (an LWLock tranche and mode, a lock type and mode, an I/O op)."""

    event: str
    object: str | None
    mode: str | None
    count: int
    total_ns: int
    buckets: tuple[Bucket, ...]

    @property
    def mean_ns(self) -> float | None:
        return self.total_ns / self.count if self.count else None

    @property
    def hist_count(self) -> int:
        return sum(b.count for b in self.buckets)

    def quantile_bucket(self, q: float) -> Bucket | None:
        """The histogram bucket holding quantile q: the answer lies in [lo_ns, hi_ns)."""
        target = q * self.hist_count
        seen = 0
        for bucket in self.buckets:
            seen += bucket.count
            if seen >= target and bucket.count:
                return bucket
        return None

    def to_json(self) -> dict[str, Any]:
        p50, p99 = self.quantile_bucket(0.5), self.quantile_bucket(0.99)
        return {
            "event": self.event,
            "object": self.object,
            "mode": self.mode,
            "count": self.count,
            "total_ns": self.total_ns,
            "mean_ns": self.mean_ns,
            "p50_bucket": p50.to_json() if p50 else None,
            "p99_bucket": p99.to_json() if p99 else None,
            "histogram": [b.to_json() for b in self.buckets],
        }


def latency(
    db: duckdb.DuckDBPyConnection,
    event: str | None = None,
    start_us: int | None = None,
    end_us: int | None = None,
) -> list[LatencySummary]:
    """Per (event, object, mode): count, total time and histogram, most total time first."""
    where = _window(start_us, end_us)
    params: list[Any] = []
    if event is not None:
        where += " AND event = ?"
        params.append(event)
    totals = db.execute(
        f"SELECT event, object, mode, sum(count)::BIGINT, sum(total_ns)::BIGINT "
        f"FROM usdt_latency WHERE {where} GROUP BY ALL ORDER BY 5 DESC, 1, 2, 3",
        params,
    ).fetchall()
    hist: dict[tuple[str, str | None, str | None], list[Bucket]] = {}
    for ev, obj, mode, lo, hi, count in db.execute(
        f"SELECT event, object, mode, lo_ns, hi_ns, sum(count)::BIGINT "
        f"FROM usdt_latency_hist WHERE {where} GROUP BY ALL ORDER BY 1, 2, 3, 4",
        params,
    ).fetchall():
        hist.setdefault((ev, obj, mode), []).append(Bucket(lo, hi, count))
    return [
        LatencySummary(ev, obj, mode, count, total, tuple(hist.get((ev, obj, mode), [])))
        for ev, obj, mode, count, total in totals
    ]


def average_waiting(
    db: duckdb.DuckDBPyConnection, event: str, start_us: int, end_us: int
) -> dict[tuple[str | None, str | None], float]:
    """Little's law: the time spent in `event` per second is the average number of
    processes in it, per (object, mode); what a wait sampler estimates as the AAS of the
    same wait event (Lock/transactionid is lock_wait/transactionid). Over the whole seconds
    inside [start_us, end_us): an event counts in the second it ended, so a window of a few
    seconds is exact up to the waits crossing its edges."""
    first = -(-start_us // 1_000_000) * 1_000_000
    last = end_us // 1_000_000 * 1_000_000
    if last <= first:
        return {}
    span_ns = (last - first) * 1000
    return {(s.object, s.mode): s.total_ns / span_ns for s in latency(db, event, first, last)}


def covered_seconds(
    db: duckdb.DuckDBPyConnection,
    program: str,
    start_us: int | None = None,
    end_us: int | None = None,
) -> float:
    """How many seconds `program` was tracing within the window (for rates)."""
    row = db.execute(
        f"SELECT sum(end_us - start_us) FROM usdt_seconds WHERE program = ? AND "
        f"{_window(start_us, end_us)}",
        [program],
    ).fetchone()
    return float(row[0]) / 1e6 if row and row[0] else 0.0


def counters(
    db: duckdb.DuckDBPyConnection, start_us: int | None = None, end_us: int | None = None
) -> dict[str, int]:
    return {
        name: int(total)
        for name, total in db.execute(
            f"SELECT counter, sum(value) FROM usdt_counters WHERE {_window(start_us, end_us)} "
            f"GROUP BY 1 ORDER BY 1"
        ).fetchall()
    }


def per_second(
    db: duckdb.DuckDBPyConnection,
    event: str,
    object_: str | None = None,
    mode: str | None = None,
) -> list[tuple[int, int, int]]:
    """(second_us, count, total_ns) of one event (optionally one object and mode), each
    second the program covered, zeros included: a timeline to set beside tps."""
    program = {
        "lwlock_wait": "lwlock",
        "lwlock_hold": "lwlock_hold",
        "lock_wait": "locks",
    }.get(event, "io")
    filters, params = ["event = ?"], [event]
    if object_ is not None:
        filters.append("object = ?")
        params.append(object_)
    if mode is not None:
        filters.append("mode = ?")
        params.append(mode)
    rows = db.execute(
        f"SELECT s.second_us, coalesce(sum(l.count), 0)::BIGINT, "
        f"coalesce(sum(l.total_ns), 0)::BIGINT FROM usdt_seconds s "
        f"LEFT JOIN (SELECT * FROM usdt_latency WHERE {' AND '.join(filters)}) l "
        f"USING (second_us) WHERE s.program = ? GROUP BY 1 ORDER BY 1",
        [*params, program],
    ).fetchall()
    return [(int(s), int(c), int(t)) for s, c, t in rows]


@dataclass(frozen=True)
class StepLatency:
    step_id: int
    variant: str
    clients: int
    tps: float | None
    start_us: int
    end_us: int
    events: list[LatencySummary]

    def to_json(self) -> dict[str, Any]:
        return {
            "step_id": self.step_id,
            "variant": self.variant,
            "clients": self.clients,
            "tps": self.tps,
            "start_us": self.start_us,
            "end_us": self.end_us,
            "events": [e.to_json() for e in self.events],
        }


def by_step(db: duckdb.DuckDBPyConnection, event: str | None = None) -> list[StepLatency]:
    """Each step's latency summaries over its measured window (the whole step when it has
    none): a second belongs to the step when it starts inside the window."""
    steps = db.execute(
        "SELECT step_id, variant, clients, tps, coalesce(window_start_us, started_us), "
        "coalesce(window_end_us, ended_us) FROM steps WHERE started_us IS NOT NULL "
        "ORDER BY step_id"
    ).fetchall()
    out = []
    for step_id, variant, clients, tps, start, end in steps:
        if start is None or end is None:
            continue
        out.append(
            StepLatency(step_id, variant, clients, tps, start, end, latency(db, event, start, end))
        )
    return out


@dataclass(frozen=True)
class Phase:
    name: str
    start_us: int
    end_us: int
    duration_ns: int

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.name,
            "start_us": self.start_us,
            "end_us": self.end_us,
            "duration_ns": self.duration_ns,
        }


@dataclass(frozen=True)
class Checkpoint:
    start_us: int
    end_us: int | None
    status: str
    flags_text: str
    total_ns: int | None
    buffers_total: int | None
    buffers_to_write: int | None
    buffers_written: int | None
    flushes: int
    flush_ns: int
    phases: list[Phase] = field(default_factory=list)
    flush_buckets: list[Bucket] = field(default_factory=list)

    @property
    def phases_ns(self) -> int:
        return sum(p.duration_ns for p in self.phases)

    @property
    def unaccounted_ns(self) -> int | None:
        """Time inside the checkpoint that no measured phase covers."""
        return None if self.total_ns is None else self.total_ns - self.phases_ns

    def phase(self, name: str) -> Phase | None:
        return next((p for p in self.phases if p.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "start_us": self.start_us,
            "end_us": self.end_us,
            "status": self.status,
            "flags": self.flags_text,
            "total_ns": self.total_ns,
            "phases_ns": self.phases_ns,
            "unaccounted_ns": self.unaccounted_ns,
            "buffers_total": self.buffers_total,
            "buffers_to_write": self.buffers_to_write,
            "buffers_written": self.buffers_written,
            "flushes": self.flushes,
            "flush_ns": self.flush_ns,
            "phases": [p.to_json() for p in self.phases],
            "flush_histogram": [b.to_json() for b in self.flush_buckets],
        }


def checkpoints(
    db: duckdb.DuckDBPyConnection, start_us: int | None = None, end_us: int | None = None
) -> list[Checkpoint]:
    """Every checkpoint traced (in the window, by start), with phases and flush histogram."""
    where = _window(start_us, end_us, "start_us")
    phases: dict[int, list[Phase]] = {}
    for ckpt, name, start, end, ns in db.execute(
        "SELECT checkpoint_start_us, phase, start_us, end_us, duration_ns "
        "FROM usdt_checkpoint_phases ORDER BY checkpoint_start_us, seq"
    ).fetchall():
        phases.setdefault(ckpt, []).append(Phase(name, start, end, ns))
    buckets: dict[int, list[Bucket]] = {}
    for ckpt, lo, hi, count in db.execute(
        "SELECT checkpoint_start_us, lo_ns, hi_ns, count FROM usdt_checkpoint_flush_hist "
        "ORDER BY checkpoint_start_us, lo_ns"
    ).fetchall():
        buckets.setdefault(ckpt, []).append(Bucket(lo, hi, count))
    return [
        Checkpoint(
            start_us=row[0],
            end_us=row[1],
            status=row[2],
            flags_text=row[3] or "",
            total_ns=row[4],
            buffers_total=row[5],
            buffers_to_write=row[6],
            buffers_written=row[7],
            flushes=row[8] or 0,
            flush_ns=row[9] or 0,
            phases=phases.get(row[0], []),
            flush_buckets=buckets.get(row[0], []),
        )
        for row in db.execute(
            f"SELECT start_us, end_us, status, flags_text, total_ns, buffers_total, "
            f"buffers_to_write, buffers_written, flushes, flush_ns FROM usdt_checkpoints "
            f"WHERE {where} ORDER BY start_us"
        ).fetchall()
    ]


@dataclass(frozen=True)
class TraceSummary:
    """What one program recorded over a whole store: `pgscope trace`'s result."""

    program: str
    covered_s: float
    latency: list[LatencySummary]
    counters: dict[str, int]
    checkpoints: list[Checkpoint]

    def rate(self, counter: str) -> float | None:
        """Per second of tracing."""
        if counter not in self.counters or not self.covered_s:
            return None
        return self.counters[counter] / self.covered_s

    @property
    def buffer_hit_ratio(self) -> float | None:
        """Accesses not read through smgr: shared buffer hits (and relation extensions)."""
        accesses = self.counters.get("buffer_accesses")
        if not accesses:
            return None
        reads = sum(s.count for s in self.latency if s.event == "smgr_read")
        return 1 - reads / accesses

    def to_json(self) -> dict[str, Any]:
        return {
            "program": self.program,
            "covered_s": self.covered_s,
            "buffer_hit_ratio": self.buffer_hit_ratio,
            "latency": [s.to_json() for s in self.latency],
            "counters": self.counters,
            "rates_per_s": {name: self.rate(name) for name in self.counters},
            "checkpoints": [c.to_json() for c in self.checkpoints],
        }


PROGRAM_EVENTS = {
    "lwlock": ("lwlock_wait", "lwlock_hold"),
    "locks": ("lock_wait",),
    "checkpoint": (),
    "io": ("smgr_read", "smgr_write", "wal_dirty_write"),
}
PROGRAM_COUNTERS = {
    "lwlock": (),
    "locks": ("deadlocks",),
    "checkpoint": ("checkpoint_buffers_written",),
    "io": ("buffer_accesses", "wal_inserts", "xact_start", "xact_commit", "xact_abort"),
}


def trace_summary(db: duckdb.DuckDBPyConnection, program: str) -> TraceSummary:
    if not has_usdt(db):
        return TraceSummary(program, 0.0, [], {}, [])
    events = PROGRAM_EVENTS[program]
    found = [s for s in latency(db) if s.event in events]
    wanted = PROGRAM_COUNTERS[program]
    totals = {name: value for name, value in counters(db).items() if name in wanted}
    totals.update({name: 0 for name in wanted if name not in totals})
    return TraceSummary(
        program,
        covered_seconds(db, program),
        found,
        totals,
        checkpoints(db) if program == "checkpoint" else [],
    )
