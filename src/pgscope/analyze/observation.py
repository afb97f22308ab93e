"""An observation (`pgscope observe`) window by window: what each window's sessions did, which
window stands out and why, how far its concurrency ranged, and which layers were seen.

The windows are the run's steps (variant `observed`, filled in by `windows.py` at the end of
the observation): the cells, the USL fit and the findings come from the usual analyses. This
section adds what only an observation has: per window its commits/s, concurrency, AAS by wait
class, top wait and top query (each computed in DuckDB over all windows at once), the windows
that differ sharply from the others, and each layer's state with what it would need.

An **outlier** is an active window whose commits/s is further from the median window's than
both 3 robust standard deviations (1.4826 x the median absolute deviation) and 25% of the
median: a stall, a checkpoint, a lock pile-up, a burst. Its explanation names what else
differed in it: concurrency, the top wait, a checkpoint that began in it.
The **worst** window is the active window with the fewest commits per second per session.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Any

import duckdb

from pgscope.analyze.waits import (
    ACTIVE,
    IN_WINDOWS,
    UNNAMED,
    WAIT_EVENT,
    WAIT_TYPE,
    Profile,
    checkpoint_spans,
    covered,
    profile,
    unnamed_statement,
)
from pgscope.duck import table_exists

VARIANT = "observed"
# A window the observation could not close (windows.py): its steps row says why.
CUT = "cut"
OUTLIER_SIGMAS = 3.0
OUTLIER_SHARE = 0.25
MIN_WINDOWS_FOR_OUTLIERS = 4
# A USL fit needs three concurrency levels; below a twofold range its peak is extrapolation.
MIN_LEVELS = 3
MIN_RANGE_RATIO = 2.0

# Each layer: (name, collectors, what it needs where it is missing).
LAYERS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "wait sampling",
        ("activity",),
        "GRANT pg_monitor (or pg_read_all_stats): without it other sessions' waits read NULL",
    ),
    ("cumulative statistics", ("pgstats",), "SELECT on pg_stat_database/wal/bgwriter"),
    (
        "statements and tables",
        ("statements",),
        "CREATE EXTENSION pg_stat_statements (with it in shared_preload_libraries) for "
        "statements; pg_monitor for their text",
    ),
    ("relation locks held", ("pglocks",), "GRANT pg_monitor (pg_locks with pg_stat_activity)"),
    (
        "errors the server logged",
        ("serverlog",),
        "the server on this host (--data-dir), its log a file pgscope may read (as root or the "
        "server's owner): the logging collector's, or where its standard error goes",
    ),
    (
        "host CPU",
        ("host",),
        "the server on this host: run pgscope there (as root or the server's owner to find "
        "its processes), or give --data-dir",
    ),
    (
        "kernel tracing",
        ("usdt",),
        "--trace, as root on the server's host, with bpftrace and a PostgreSQL built with "
        "--enable-dtrace",
    ),
    ("CPU profile", ("perf",), "--profile, as root on the server's host, with perf"),
)


@dataclass(frozen=True)
class Window:
    step_id: int
    start_us: int | None
    end_us: int | None
    seconds: float | None
    status: str  # "ok" (sessions were active), "idle", "mixed", "short", or "cut"
    tps: float | None  # commits per second (pg_stat_database, every database)
    commits: float | None
    rollbacks: float | None
    concurrency: float | None  # client sessions present, time-weighted (windows.py)
    sessions: int | None  # distinct client sessions active in it
    aas: float | None  # average active sessions, all classes
    aas_by_class: dict[str, float] = field(default_factory=dict)
    top_wait: str | None = None  # "Lock:transactionid", "CPU"
    top_wait_share: float | None = None  # of the window's active time
    top_query: str | None = None
    top_query_share: float | None = None
    checkpoints: float | None = None  # checkpoints begun (pg_stat_bgwriter)
    outlier: str | None = None  # why it stands out, or None
    # The share of the window a checkpoint was in progress (the checkpointer's samples, or
    # the server log): what the server was doing beside the workload.
    checkpointing: float | None = None


@dataclass(frozen=True)
class Layer:
    name: str
    collectors: list[str]
    status: str  # "seen", "unavailable", "failed", "not asked"
    detail: str | None  # why not, and what it needs; or what it cost
    cost: str | None = None


@dataclass(frozen=True)
class Observation:
    window_s: float | None
    windows: list[Window]
    concurrency_low: float | None
    concurrency_high: float | None
    levels: int  # distinct rounded concurrency levels among active windows
    scalability_note: str
    worst_window: int | None  # step id
    outliers: list[int]
    layers: list[Layer]
    own_cpu_share: float | None  # pgscope and its tracers, of the host's CPU (host collector)
    # The worst window's wait profile, for the rules to judge it as they judge the whole.
    worst_profile: Profile | None = None
    # Where the sessions' active time was, per database (the samples), busiest first; and
    # the databases whose statements (and, the first, tables) were read.
    databases: list[tuple[str, float]] = field(default_factory=list)
    statements_read_in: list[str] = field(default_factory=list)


def is_observation(db: duckdb.DuckDBPyConnection) -> bool:
    return table_exists(db, "windows")


def read(db: duckdb.DuckDBPyConnection, collectors: list[dict[str, Any]]) -> Observation | None:
    """The observation's section; None for a run that is not one."""
    if not is_observation(db):
        return None
    # A window never closed (`running` in a killed observation's store) is `cut`; it has no
    # measured bounds, and shows where it began and ended.
    rows = db.execute(
        "SELECT s.step_id, coalesce(s.window_start_us, s.started_us), "
        "coalesce(s.window_end_us, s.ended_us), w.seconds, "
        f"CASE WHEN s.status = 'running' THEN '{CUT}' ELSE s.status END, s.tps, "
        "w.commits, w.rollbacks, w.concurrency, w.sessions, s.duration_s FROM steps s "
        f"LEFT JOIN windows w USING (step_id) WHERE s.variant = '{VARIANT}' ORDER BY s.step_id"
    ).fetchall()
    activity = _activity(db)
    aas, waits, queries = activity.aas, activity.waits, activity.queries
    databases, read_in = _databases(db), _statements_read_in(db)
    checkpoints = _checkpoints(db)
    spans = checkpoint_spans(db)
    windows = []
    for sid, lo, hi, seconds, status, tps, commits, rollbacks, conc, sessions, _ in rows:
        by_class = aas.get(sid, {})
        wait = waits.get(sid)
        query = queries.get(sid)
        windows.append(
            Window(
                int(sid), lo, hi, seconds, str(status), tps, commits, rollbacks, conc,
                sessions, sum(by_class.values()) if by_class else None, by_class,
                str(wait[0]).replace("CPU:CPU", "CPU") if wait else None,
                wait[1] if wait else None,
                query[0] if query else None,
                query[1] if query else None,
                checkpoints.get(sid),
                None,
                covered(spans, lo, hi) if lo is not None and hi is not None and activity.aas
                else None,
            )
        )  # fmt: skip
    windows = _mark_outliers(windows)
    active = [w for w in windows if w.status == "ok" and w.concurrency is not None]
    low = min((w.concurrency for w in active if w.concurrency is not None), default=None)
    high = max((w.concurrency for w in active if w.concurrency is not None), default=None)
    levels = len({round(w.concurrency) for w in active if w.concurrency is not None})
    worst = min(
        (w for w in active if w.tps is not None and w.concurrency),
        key=lambda w: (w.tps or 0.0) / (w.concurrency or 1.0),
        default=None,
    )
    worst_profile = (  # its samples as the windows count them: [start, end)
        profile(db, worst.start_us, worst.end_us - 1)
        if worst is not None
        and worst.start_us is not None
        and worst.end_us is not None
        and activity.aas
        else None
    )
    return Observation(
        float(rows[0][10]) if rows and rows[0][10] else None,
        windows,
        low,
        high,
        levels,
        scalability_note(low, high, levels, len(active)),
        worst.step_id if worst else None,
        [w.step_id for w in windows if w.outlier],
        layers(collectors, _statements_absent(db), _costs(db), databases, read_in),
        _own_cpu(db),
        worst_profile,
        databases,
        read_in,
    )


def scalability_note(low: float | None, high: float | None, levels: int, windows: int) -> str:
    """What the observed USL fit can say, given the concurrency the windows saw."""
    if low is None or high is None or not windows:
        return "no window had active sessions: no scalability curve"
    seen = f"concurrency ranged {low:.1f}-{high:.1f} sessions over {windows} active windows"
    if levels < MIN_LEVELS:
        return (
            f"{seen} ({levels} level{'s' if levels != 1 else ''}): too narrow for a USL fit, "
            f"which needs {MIN_LEVELS} distinct levels; the curve needs a period whose load "
            f"varies, or a `pgscope run` sweep"
        )
    if high < MIN_RANGE_RATIO * max(low, 1.0):
        return (
            f"{seen}: a USL fit over less than a {MIN_RANGE_RATIO:g}x range; its peak (N*) "
            f"is an extrapolation, read it as a trend"
        )
    return f"{seen}: the USL fit is over the windows, each window one observation"


def layers(
    collectors: list[dict[str, Any]],
    statements_absent: bool,
    costs: dict[str, str],
    databases: list[tuple[str, float]] | None = None,
    read_in: list[str] | None = None,
) -> list[Layer]:
    by_name = {c["name"]: c for c in collectors}
    out = []
    for name, names, needs in LAYERS:
        cost = next((costs[n] for n in names if n in costs), None)
        rows = [by_name[n] for n in names if n in by_name]
        if not rows:
            out.append(Layer(name, list(names), "not asked", needs))
            continue
        row = rows[0]
        if not row.get("available"):
            out.append(Layer(name, list(names), "unavailable", f"{row.get('reason')}"))
        elif row.get("status") == "failed":
            out.append(Layer(name, list(names), "failed", f"{row.get('error')}"))
        elif name == "statements and tables":
            out.append(_statements_layer(name, list(names), statements_absent, databases, read_in))
        else:
            out.append(Layer(name, list(names), "seen", None, cost))
    return out


def _statements_layer(
    name: str,
    collectors: list[str],
    absent: bool,
    databases: list[tuple[str, float]] | None,
    read_in: list[str] | None,
) -> Layer:
    """The statements layer, naming the database it read: partial where pg_stat_statements
    was not there, or where the samples put the sessions' active time in a database it did
    not read (issue 30: observe --data-dir read `postgres` while the load ran in `sbtest`)."""
    where = f"database {', '.join(read_in)}" if read_in else "the connection's database"
    shares = dict(databases or [])
    missed = [(d, share) for d, share in (databases or []) if read_in and d not in read_in]
    if absent:
        detail = (
            f"table statistics only: pg_stat_statements is not installed in {where} (CREATE "
            f"EXTENSION pg_stat_statements there, with it in shared_preload_libraries)"
        )
        return Layer(name, collectors, "partial", detail)
    if missed and missed[0][1] >= 0.5:
        busiest, share = missed[0]
        return Layer(
            name,
            collectors,
            "partial",
            f"read in {where}, while {share:.0%} of the sessions' active time was in database "
            f"{busiest}, which was not read (no session was busy there when it was chosen)",
        )
    read_share = sum(shares.get(d, 0.0) for d in read_in or [])
    held = f", which held {read_share:.0%} of the sessions' active time" if shares else ""
    return Layer(name, collectors, "seen", f"read in {where}{held}")


def _databases(db: duckdb.DuckDBPyConnection) -> list[tuple[str, float]]:
    """Each database's share of the sessions' active time in the windows, busiest first."""
    if not table_exists(db, "activity_samples"):
        return []
    rows = db.execute(
        f"SELECT coalesce(datname, '?'), count(*) FROM {IN_WINDOWS} "
        f"WHERE variant = '{VARIANT}' AND {ACTIVE} GROUP BY ALL ORDER BY 2 DESC, 1"
    ).fetchall()
    total = sum(int(n) for _, n in rows)
    return [(str(d), int(n) / total) for d, n in rows] if total else []


def _statements_read_in(db: duckdb.DuckDBPyConnection) -> list[str]:
    """The databases the statements collector last said it read (observe: where the load
    was), or none where it did not say."""
    row = db.execute(
        "SELECT detail FROM events WHERE kind = 'statements-database' ORDER BY ts_us DESC LIMIT 1"
    ).fetchone()
    if not row:
        return []
    try:
        return [str(d) for d in json.loads(str(row[0])).get("read", [])]
    except (ValueError, AttributeError):
        return []


@dataclass(frozen=True)
class _Activity:
    """Per window: AAS by class, the top wait and the top query, with their shares."""

    aas: dict[int, dict[str, float]]
    waits: dict[int, tuple[str, float]]
    queries: dict[int, tuple[str, float]]


def _activity(db: duckdb.DuckDBPyConnection) -> _Activity:
    """One pass over the samples in the windows, grouped in DuckDB to (window, wait, query)
    counts; the few thousand groups are then summed here."""
    if not table_exists(db, "activity_samples"):
        return _Activity({}, {}, {})
    samples = dict(
        db.execute(
            f"SELECT step_id, count(DISTINCT sample_no) FROM {IN_WINDOWS} "
            f"WHERE variant = '{VARIANT}' GROUP BY ALL"
        ).fetchall()
    )
    groups = db.execute(
        f"SELECT step_id, {WAIT_TYPE}, {WAIT_TYPE} || ':' || {WAIT_EVENT}, query_id, "
        f"{UNNAMED}, count(*) FROM {IN_WINDOWS} WHERE variant = '{VARIANT}' AND {ACTIVE} "
        f"GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    by_class: dict[int, dict[str, int]] = {}
    by_wait: dict[int, dict[str, int]] = {}
    # A query id, or what time without one was (waits.UNNAMED: COMMIT, its text).
    by_query: dict[int, dict[int | str | None, int]] = {}
    for sid, cls, wait, query_id, unnamed, k in groups:
        statement = query_id if query_id is not None else unnamed
        for table, key in ((by_class, cls), (by_wait, wait), (by_query, statement)):
            counts = table.setdefault(int(sid), {})
            counts[key] = counts.get(key, 0) + int(k)
    aas = {
        sid: {c: k / samples[sid] for c, k in sorted(counts.items(), key=lambda r: -r[1])}
        for sid, counts in by_class.items()
        if samples.get(sid)
    }
    waits = {sid: _leader(counts) for sid, counts in by_wait.items()}
    leaders = {sid: _leader(counts) for sid, counts in by_query.items()}
    ids = [q for q, _ in leaders.values() if isinstance(q, int)]
    texts: dict[int, str] = {}
    if ids and table_exists(db, "activity_queries"):
        texts = dict(
            db.execute(
                "SELECT query_id, left(query, 200) FROM activity_queries "
                "WHERE query_id IN (SELECT unnest(?))",
                [ids],
            ).fetchall()
        )
    queries = {
        sid: (
            texts.get(q) or f"(query id {q})"
            if isinstance(q, int)
            else unnamed_statement(None, str(q)),
            share,
        )
        for sid, (q, share) in leaders.items()
        if q is not None
    }
    return _Activity(aas, {s: (str(w), v) for s, (w, v) in waits.items()}, queries)


def _leader(counts: dict[Any, int]) -> tuple[Any, float]:
    """The key with the most rows (ties: the first in sort order) and its share."""
    key = min(counts, key=lambda k: (-counts[k], k is None, str(k)))
    return key, counts[key] / sum(counts.values())


def _checkpoints(db: duckdb.DuckDBPyConnection) -> dict[int, float]:
    """Checkpoints begun in each window: the checkpointer's counters at its edges (named as
    PostgreSQL 15-16 and 17+ name them)."""
    if not table_exists(db, "pgstats_counters"):
        return {}
    rows = db.execute(
        "SELECT step_id, sum(CASE WHEN mark = 'end' THEN value ELSE -value END) "
        "FROM pgstats_counters WHERE step_id IS NOT NULL AND counter IN "
        "('checkpoints_timed', 'checkpoints_req', 'num_timed', 'num_requested') "
        f"AND step_id IN (SELECT step_id FROM steps WHERE variant = '{VARIANT}') GROUP BY ALL"
    ).fetchall()
    return {int(s): float(v) for s, v in rows if v is not None}


def _statements_absent(db: duckdb.DuckDBPyConnection) -> bool:
    row = db.execute(
        "SELECT count(*) FROM (SELECT detail FROM events WHERE kind = 'statements' "
        "ORDER BY ts_us DESC LIMIT 1) WHERE detail = 'pg_stat_statements absent'"
    ).fetchone()
    return bool(row and row[0])


def _costs(db: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """What each opt-in layer costs, as `observe` recorded it: collector -> one line; for
    the wait sampler, which source ran and what its reader cost (collect/sampling/activity.py)."""
    rows = db.execute("SELECT detail FROM events WHERE kind = 'cost'").fetchall()
    costs = {str(d).split(": ", 1)[0]: str(d).split(": ", 1)[1] for (d,) in rows if ": " in str(d)}
    sampler = db.execute(
        "SELECT detail FROM events WHERE kind IN ('activity-source', 'activity-cost') "
        "ORDER BY ts_us"
    ).fetchall()
    if sampler:
        costs["activity"] = "; ".join(str(d) for (d,) in sampler)
    return costs


def _own_cpu(db: duckdb.DuckDBPyConnection) -> float | None:
    if not table_exists(db, "host_cpu"):
        return None
    row = db.execute("SELECT avg(own_share) FROM host_cpu").fetchone()
    return float(row[0]) if row and row[0] is not None else None


def _mark_outliers(windows: list[Window]) -> list[Window]:
    import dataclasses

    active = [w for w in windows if w.status == "ok" and w.tps is not None]
    if len(active) < MIN_WINDOWS_FOR_OUTLIERS:
        return windows
    tps = [w.tps or 0.0 for w in active]
    median = statistics.median(tps)
    mad = statistics.median(abs(v - median) for v in tps)
    allowed = max(OUTLIER_SIGMAS * 1.4826 * mad, OUTLIER_SHARE * median)
    typical_wait = statistics.mode([w.top_wait for w in active if w.top_wait] or [None])
    concurrency = statistics.median([w.concurrency or 0.0 for w in active])
    out = []
    for w in windows:
        if w in active and abs((w.tps or 0.0) - median) > allowed:
            w = dataclasses.replace(w, outlier=_why(w, median, typical_wait, concurrency))
        out.append(w)
    return out


def _why(w: Window, median: float, typical_wait: str | None, concurrency: float) -> str:
    tps = w.tps or 0.0
    change = (tps - median) / median * 100 if median else 0.0
    parts = [f"{abs(change):.0f}% {'below' if change < 0 else 'above'} the median window's "
             f"{median:,.0f} commits/s"]  # fmt: skip
    if w.checkpoints:
        parts.append("a checkpoint began in it")
    elif w.checkpointing:
        parts.append(f"a checkpoint was in progress ({w.checkpointing:.0%} of it)")
    if w.top_wait and w.top_wait != typical_wait:
        share = f" ({100 * w.top_wait_share:.0f}% of active time)" if w.top_wait_share else ""
        parts.append(f"its top wait was {w.top_wait}{share}, elsewhere {typical_wait}")
    if (
        w.concurrency is not None
        and concurrency
        and abs(w.concurrency - concurrency) > max(1.0, 0.25 * concurrency)
    ):
        parts.append(f"{w.concurrency:.1f} sessions against {concurrency:.1f} typically")
    return "; ".join(parts)
