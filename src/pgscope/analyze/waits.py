"""Where active time goes: wait profiles from the `activity` (and `pgws`) samples.

Definitions, applied the same way everywhere:
- a sample row counts as **active** (the workload's active time) when a client backend is in
  state `active`, or a parallel worker it started is at work; the instruments are left out:
  pgscope's own sessions and pg_wait_sampling's collector. The server's own processes
  (checkpointer, background writer, walwriter, autovacuum, walsenders, ...) are what the
  server does beside the workload, never its active time nor its AAS (issue 30: the
  checkpointer's pacing sleep, Timeout:CheckpointWriteDelay, read as 87% of a run's active
  time): they are the **background** (`background()`), each kind of process with how many
  were at work on average and on what, and a checkpoint in progress is an event of the
  timeline (`checkpoint_spans()`). `analyze/account.py` counts the same sessions;
- an active row with no wait event is **CPU** (running or runnable: the server cannot tell);
- a **profile** gives each (wait_event_type, wait_event) its share of active rows; shares sum
  to 1; CPU appears as ("CPU", "CPU");
- **AAS** (average active sessions) of a class over a second = its active rows in that second
  divided by the samples taken in that second.
Pure functions of the store: nothing here talks to a server.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import duckdb

from pgscope.analyze.queryid import QueryId
from pgscope.analyze.queryid import as_json as query_id_json
from pgscope.duck import table_exists

INSTRUMENTS = (
    "coalesce(application_name, '') NOT LIKE 'pgscope%' "
    "AND backend_type IS DISTINCT FROM 'pg_wait_sampling collector'"
)
# Whose time is the workload's: client sessions running a statement, and the parallel
# workers they started (the account's active time is the same: analyze/account.py). A
# session waiting to read its client's next message is idle whatever its state says: the
# state is read from a snapshot taken before the wait is (pg_stat_activity reads the wait
# live), so a session that has just finished a statement reads 'active' in ClientRead, and on
# a busy host such tears were most of the 'active' time (77% in a CPU-bound select-only run).
SESSIONS = (
    f"{INSTRUMENTS} AND coalesce(wait_event, '') <> 'ClientRead' "
    "AND ((backend_type = 'client backend' AND state = 'active') "
    "OR (backend_type = 'parallel worker' AND coalesce(state, 'active') <> 'idle'))"
)
ACTIVE = SESSIONS
# The server's own processes at work: neither a client session nor a parallel worker, and
# not in their idle main-loop waits (class Activity, or Extension for an extension's worker
# sleeping on its own latch). What the server does beside the workload.
BACKGROUND = (
    f"{INSTRUMENTS} AND backend_type NOT IN ('client backend', 'parallel worker') "
    "AND coalesce(wait_event_type, '') NOT IN ('Activity', 'Extension')"
)
# A checkpoint in progress, as the checkpointer's samples show it: the checkpointer out of
# its idle wait (CheckpointerMain) for this many samples in a row at least (absorbing fsync
# requests between checkpoints takes it out for an instant, a sample at most), samples that
# many seconds apart at most still one checkpoint.
CHECKPOINT_MIN_SAMPLES = 3
CHECKPOINT_GAP_S = 2.0
CLIENTS = "backend_type = 'client backend' AND coalesce(application_name, '') NOT LIKE 'pgscope%'"
# Activity rows inside the steps' measured windows, each with its step's id, variant,
# clients and offered rate (NULL: closed loop). Not a range join, whose cost grows with rows
# x steps (an hour's observation: 18 M rows x 360 windows took minutes), nor an ASOF join,
# which sorts every row (4.5 GB for those 18 M): each step is listed once per second it
# covers (a few thousand rows), the samples meet it on their second (a hash join that
# streams), and the window's bounds decide at the edges: half-open, [start, end), so that
# windows sharing an edge count a sample there once.
IN_WINDOWS = (
    "(SELECT s.step_id, s.variant, s.clients, s.rate, a.* FROM activity_samples a "
    "JOIN (SELECT step_id, variant, clients, rate, window_start_us, window_end_us, "
    "unnest(range(window_start_us // 1000000, window_end_us // 1000000 + 1)) AS second "
    "FROM steps WHERE window_start_us IS NOT NULL AND window_end_us IS NOT NULL) s "
    "ON a.ts_us // 1000000 = s.second "
    "WHERE a.ts_us >= s.window_start_us AND a.ts_us < s.window_end_us)"
)
WAIT_TYPE = "coalesce(wait_event_type, 'CPU')"


def renamed_waits() -> dict[str, dict[str, str]]:
    """Wait events a newer PostgreSQL renamed: {type: {its name: the name the rules use}}."""
    text = resources.files("pgscope.analyze").joinpath("wait_names.toml").read_text()
    return {kind: dict(names) for kind, names in tomllib.loads(text).items()}


def _wait_event_sql() -> str:
    """The sampled wait event under the name the rules use, whatever the server's version."""
    whens = [
        f"WHEN wait_event_type = '{kind}' AND wait_event = '{new}' THEN '{old}'"
        for kind, names in renamed_waits().items()
        for new, old in names.items()
    ]
    return f"coalesce(CASE {' '.join(whens)} ELSE wait_event END, 'CPU')"


WAIT_EVENT = _wait_event_sql()


def has_samples(db: duckdb.DuckDBPyConnection) -> bool:
    return table_exists(db, "activity_samples")


@dataclass(frozen=True)
class ProfileEntry:
    wait_event_type: str
    wait_event: str
    samples: int
    share: float

    def to_json(self) -> dict[str, Any]:
        return {
            "wait_event_type": self.wait_event_type,
            "wait_event": self.wait_event,
            "samples": self.samples,
            "share": self.share,
        }

    @property
    def label(self) -> str:
        return (
            "CPU"
            if self.wait_event_type == "CPU"
            else (f"{self.wait_event_type}:{self.wait_event}")
        )


@dataclass(frozen=True)
class Profile:
    entries: list[ProfileEntry]  # best first; shares sum to 1 (or the list is empty)
    active_rows: int
    samples: int  # sampling instants in the window
    seconds: float
    states: dict[str, float] = field(default_factory=dict)  # client backends' state shares

    @property
    def achieved_hz(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def aas(self) -> float:
        return self.active_rows / self.samples if self.samples else 0.0

    def share(self, wait_event_type: str, wait_event: str | None = None) -> float:
        return sum(
            e.share
            for e in self.entries
            if e.wait_event_type == wait_event_type
            and (wait_event is None or e.wait_event == wait_event)
        )

    def class_shares(self) -> dict[str, float]:
        shares: dict[str, float] = {}
        for entry in self.entries:
            shares[entry.wait_event_type] = shares.get(entry.wait_event_type, 0.0) + entry.share
        return dict(sorted(shares.items(), key=lambda kv: -kv[1]))

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": [e.to_json() for e in self.entries],
            "samples": self.samples,
            "active_rows": self.active_rows,
            "aas": self.aas,
            "achieved_hz": self.achieved_hz,
            "seconds": self.seconds,
            "states": self.states,
        }


def _window(start_us: int | None, end_us: int | None) -> tuple[str, list[Any]]:
    clauses, params = [], []
    if start_us is not None:
        clauses.append("ts_us >= ?")
        params.append(start_us)
    if end_us is not None:
        clauses.append("ts_us <= ?")
        params.append(end_us)
    return (" AND ".join(clauses) or "TRUE"), params


def profile(
    db: duckdb.DuckDBPyConnection, start_us: int | None = None, end_us: int | None = None
) -> Profile:
    """The wait profile of active time in [start_us, end_us] (the whole record by default)."""
    where, params = _window(start_us, end_us)
    rows = db.execute(
        f"SELECT {WAIT_TYPE}, {WAIT_EVENT}, count(*) AS n FROM activity_samples "
        f"WHERE {where} AND {ACTIVE} GROUP BY ALL ORDER BY n DESC, 1, 2",
        params,
    ).fetchall()
    span = db.execute(
        f"SELECT count(DISTINCT sample_no), min(ts_us), max(ts_us) FROM activity_samples "
        f"WHERE {where}",
        params,
    ).fetchone()
    states = db.execute(
        f"SELECT coalesce(state, 'unknown'), count(*) FROM activity_samples "
        f"WHERE {where} AND {CLIENTS} GROUP BY ALL",
        params,
    ).fetchall()
    total = sum(n for _, _, n in rows)
    samples = int(span[0]) if span else 0
    seconds = (span[2] - span[1]) / 1e6 if span and span[1] is not None else 0.0
    if samples > 1 and seconds > 0:
        seconds *= samples / (samples - 1)  # n samples span n-1 intervals
    client_rows = sum(n for _, n in states)
    return Profile(
        [ProfileEntry(t, e, n, n / total) for t, e, n in rows],
        total,
        samples,
        seconds,
        {s: n / client_rows for s, n in sorted(states, key=lambda r: -r[1])},
    )


@dataclass(frozen=True)
class StepProfile:
    step_id: int
    variant: str
    clients: int
    repeat: int
    profile: Profile


def profiles_by_step(db: duckdb.DuckDBPyConnection) -> list[StepProfile]:
    """One profile per finished step, over its measured window (warm-up excluded)."""
    steps = db.execute(
        "SELECT step_id, variant, clients, repeat, window_start_us, window_end_us FROM steps "
        "WHERE window_start_us IS NOT NULL ORDER BY step_id"
    ).fetchall()
    return [
        StepProfile(sid, variant, clients, repeat, profile(db, start, end))
        for sid, variant, clients, repeat, start, end in steps
    ]


@dataclass(frozen=True)
class ConcurrencyProfile:
    """The profile versus concurrency: per (variant, clients), all repeats pooled; an
    open-loop cell's (variant, clients, rate) apart from the closed-loop one."""

    variant: str
    clients: int
    profile: Profile
    rate: float | None = None  # the offered rate of an open-loop cell


Cell = tuple[str, int, float | None]  # (variant, clients, rate)


def profiles_by_clients(db: duckdb.DuckDBPyConnection) -> list[ConcurrencyProfile]:
    rows = db.execute(
        f"SELECT variant, clients, rate, {WAIT_TYPE}, {WAIT_EVENT}, count(*) AS n "
        f"FROM {IN_WINDOWS} "
        # Ties broken by name: the same run gives the same document.
        f"WHERE {ACTIVE} GROUP BY ALL ORDER BY variant, clients, rate NULLS FIRST, n DESC, 4, 5"
    ).fetchall()
    instants: dict[Cell, int] = {
        (v, c, r): int(n)
        for v, c, r, n in db.execute(
            f"SELECT variant, clients, rate, count(DISTINCT sample_no) FROM {IN_WINDOWS} "
            f"GROUP BY ALL"
        ).fetchall()
    }
    seconds_by: dict[Cell, float] = {
        (v, c, r): float(secs)
        for v, c, r, secs in db.execute(
            # A step cut short (a full disk, a crash) may have a start and no end.
            "SELECT variant, clients, rate, sum(window_end_us - window_start_us) / 1e6 "
            "FROM steps WHERE window_start_us IS NOT NULL AND window_end_us IS NOT NULL "
            "GROUP BY ALL"
        ).fetchall()
    }
    states: dict[Cell, dict[str, int]] = {}
    for variant, clients, rate, state, n in db.execute(
        f"SELECT variant, clients, rate, coalesce(state, 'unknown'), count(*) "
        f"FROM {IN_WINDOWS} WHERE {CLIENTS} GROUP BY ALL"
    ).fetchall():
        states.setdefault((variant, clients, rate), {})[str(state)] = int(n)
    grouped: dict[Cell, list[tuple[str, str, int]]] = {}
    for variant, clients, rate, wtype, event, n in rows:
        grouped.setdefault((variant, clients, rate), []).append((wtype, event, n))
    out = []
    # Every sampled cell, also one whose sessions were never active (a think-time bound
    # load): its states are the evidence, and its profile is empty.
    for key in [*grouped, *(k for k in instants if k not in grouped)]:
        entries = grouped.get(key, [])
        total = sum(n for *_, n in entries)
        counts = states.get(key, {})
        client_rows = sum(counts.values()) or 1
        out.append(
            ConcurrencyProfile(
                key[0],
                key[1],
                Profile(
                    [ProfileEntry(t, e, n, n / total) for t, e, n in entries],
                    total,
                    instants.get(key, 0),
                    seconds_by.get(key, 0.0),
                    {s: n / client_rows for s, n in sorted(counts.items(), key=lambda r: -r[1])},
                ),
                key[2],
            )
        )
    order = {
        v: i
        for i, (v,) in enumerate(
            db.execute(
                "SELECT variant FROM steps GROUP BY variant ORDER BY min(step_id)"
            ).fetchall()
        )
    }
    return sorted(
        out, key=lambda p: (order.get(p.variant, 0), p.rate is not None, p.rate or 0, p.clients)
    )


def aas_timeline(db: duckdb.DuckDBPyConnection) -> list[tuple[int, str, float]]:
    """(second_us, wait class, AAS) for every second with samples."""
    return [
        (int(s), str(c), float(a))
        for s, c, a in db.execute(
            f"WITH per AS (SELECT ts_us // 1000000 * 1000000 AS sec, count(DISTINCT sample_no) "
            f"AS instants FROM activity_samples GROUP BY sec) "
            f"SELECT a.ts_us // 1000000 * 1000000 AS sec, {WAIT_TYPE} AS cls, "
            f"count(*) / any_value(per.instants) FROM activity_samples a "
            f"JOIN per ON per.sec = a.ts_us // 1000000 * 1000000 "
            f"WHERE {ACTIVE} GROUP BY ALL ORDER BY 1, 2"
        ).fetchall()
    ]


@dataclass(frozen=True)
class BackgroundProcess:
    """One kind of the server's own processes (checkpointer, walwriter, autovacuum worker,
    ...) beside the workload: how many were at work on average, and on what."""

    backend_type: str
    busy: float  # processes of this kind at work, on average over the sampling instants
    waits: list[tuple[str, float]]  # its most common waits ("CPU" too), share of its rows

    def to_json(self) -> dict[str, Any]:
        return {
            "backend_type": self.backend_type,
            "busy": self.busy,
            "waits": [{"wait": w, "share": share} for w, share in self.waits],
        }


def background(db: duckdb.DuckDBPyConnection, limit: int = 3) -> list[BackgroundProcess]:
    """What the server's own processes did: over the steps' measured windows (or the whole
    record where there are none), each kind at work, busiest first."""
    source = IN_WINDOWS if _has_windows(db) else "activity_samples"
    row = db.execute(f"SELECT count(DISTINCT sample_no) FROM {source}").fetchone()
    instants = int(row[0]) if row and row[0] else 0
    if not instants:
        return []
    rows = db.execute(
        f"SELECT backend_type, {WAIT_TYPE} || ':' || {WAIT_EVENT} AS w, count(*) AS n "
        f"FROM {source} WHERE {BACKGROUND} GROUP BY ALL ORDER BY 1, n DESC, w"
    ).fetchall()
    by_type: dict[str, list[tuple[str, int]]] = {}
    for backend_type, wait, n in rows:
        by_type.setdefault(str(backend_type), []).append((str(wait).replace("CPU:CPU", "CPU"), n))
    out = []
    for backend_type, waits in by_type.items():
        total = sum(n for _, n in waits)
        out.append(
            BackgroundProcess(
                backend_type, total / instants, [(w, n / total) for w, n in waits[:limit]]
            )
        )
    return sorted(out, key=lambda b: (-b.busy, b.backend_type))


@dataclass(frozen=True)
class CheckpointSpan:
    """A checkpoint in progress: from the server log's start and end where the run has them
    (clusters pgscope starts log them), else from the checkpointer's samples."""

    start_us: int
    end_us: int
    source: str  # "server log" or "activity"
    detail: str  # the log's reason and figures, or what the checkpointer waited on most

    def to_json(self) -> dict[str, Any]:
        return {
            "start_us": self.start_us,
            "end_us": self.end_us,
            "seconds": (self.end_us - self.start_us) / 1e6,
            "source": self.source,
            "detail": self.detail,
        }


def checkpoint_spans(db: duckdb.DuckDBPyConnection) -> list[CheckpointSpan]:
    """Each checkpoint in progress during the record, in time order."""
    logged = _logged_checkpoints(db)
    if logged:
        return logged
    if not has_samples(db):
        return []
    rows = db.execute(
        f"SELECT ts_us, {WAIT_TYPE} || ':' || {WAIT_EVENT} FROM activity_samples "
        f"WHERE backend_type = 'checkpointer' AND {BACKGROUND} ORDER BY ts_us"
    ).fetchall()
    spans: list[list[tuple[int, str]]] = []
    for ts, wait in rows:
        if spans and ts - spans[-1][-1][0] <= CHECKPOINT_GAP_S * 1e6:
            spans[-1].append((int(ts), str(wait)))
        else:
            spans.append([(int(ts), str(wait))])
    out = []
    for span in spans:
        if len(span) < CHECKPOINT_MIN_SAMPLES:
            continue
        waits: dict[str, int] = {}
        for _, wait in span:
            waits[wait] = waits.get(wait, 0) + 1
        top = max(sorted(waits), key=lambda w: waits[w])
        detail = (
            f"the checkpointer at work, most often {top.replace('CPU:CPU', 'CPU')} "
            f"({waits[top] / len(span):.0%} of its samples)"
        )
        out.append(CheckpointSpan(span[0][0], span[-1][0], "activity", detail))
    return out


def _logged_checkpoints(db: duckdb.DuckDBPyConnection) -> list[CheckpointSpan]:
    """Checkpoints the server logged: each start with the end that follows it (one still
    running when the record ends: to its last event)."""
    if not table_exists(db, "events"):
        return []
    rows = db.execute(
        "SELECT ts_us, kind, detail FROM events WHERE kind IN ('checkpoint-start', "
        "'checkpoint-done') ORDER BY ts_us"
    ).fetchall()
    out, start = [], None
    for ts, kind, detail in rows:
        if kind == "checkpoint-start":
            start = (int(ts), str(detail))
        elif start is not None:
            out.append(
                CheckpointSpan(start[0], int(ts), "server log", f"{start[1]}; {detail}".strip())
            )
            start = None
    if start is not None:
        last = (
            db.execute("SELECT max(ts_us) FROM activity_samples").fetchone()
            if has_samples(db)
            else None
        )
        if last and last[0] and last[0] > start[0]:
            out.append(CheckpointSpan(start[0], int(last[0]), "server log", start[1]))
    return out


def covered(spans: list[CheckpointSpan], start_us: int, end_us: int) -> float:
    """The share of [start_us, end_us) a checkpoint was in progress."""
    if end_us <= start_us:
        return 0.0
    inside = sum(max(0, min(end_us, s.end_us) - max(start_us, s.start_us)) for s in spans)
    return min(1.0, inside / (end_us - start_us))


# -------------------------------------------------------------------------------------------
# Time without a query id, named for what it is: one place for the top queries and the
# account (analyze/account.py) alike.

# Waits a commit makes (its WAL written and flushed, a synchronous standby's answer): a session
# sampled in one of them without a query id is committing (COMMIT, END, or the commit at the
# end of a statement sent with the extended protocol, which PostgreSQL 15-17 runs with no id).
COMMIT_WAITS = {
    "IO:WALSync": "flushing its WAL",
    "IO:WALWrite": "writing its WAL",
    "LWLock:WALWrite": "waiting for the WAL write lock",
    "LWLock:WALInsert": "inserting its WAL",
    "IPC:SyncRep": "waiting for the synchronous standby",
    "IO:WALInitSync": "flushing a new WAL segment",
    "IO:WALInitWrite": "writing a new WAL segment",
}
COMMIT = "COMMIT"
NO_QUERY_ID = "(no query id: a utility statement, or a commit's own work)"
# A sample without a query id, grouped as what it was (NULL: nothing tells): COMMIT for a
# commit's text (COMMIT, END) or a commit's wait; else its statement's text where the SQL
# sampler read it, spaces folded and constants made `?` (the same statement with other values
# is one).
_FOLDED = "trim(regexp_replace(command, '\\s+', ' ', 'g'))"
# Quoted strings, then numbers that are no parameter's ($1) or identifier's (t2) part.
_STRINGS = "'(?:[^']|'')*'".replace("'", "''")
_NUMBERS = r"(^|[^$\w.])[0-9]+(?:\.[0-9]+)?\b"
_CONSTANTS = (
    f"regexp_replace(regexp_replace({_FOLDED}, '{_STRINGS}', '?', 'g'), '{_NUMBERS}', '\\1?', 'g')"
)
UNNAMED = (
    "CASE WHEN query_id IS NOT NULL THEN NULL "
    f"WHEN upper(rtrim(split_part({_FOLDED}, ' ', 1), ';')) IN ('COMMIT', 'END') "
    f"THEN '{COMMIT}' "
    f"WHEN {_FOLDED} <> '' THEN {_CONSTANTS} "
    f"WHEN {WAIT_TYPE} || ':' || {WAIT_EVENT} IN {tuple(COMMIT_WAITS)} THEN '{COMMIT}' END"
)


def unnamed_statement(event: str | None = None, text: str | None = None) -> str:
    """What time sampled without a query id was, in words: a commit (from its text, or from
    the wait it was in: "COMMIT (flushing its WAL)"), the statement's own text where the
    sampler read it, else that nothing tells."""
    if text == COMMIT or (text is None and event in COMMIT_WAITS):
        doing = COMMIT_WAITS.get(event or "")
        return f"{COMMIT} ({doing})" if doing else COMMIT
    if text:
        return text
    return NO_QUERY_ID


@dataclass(frozen=True)
class QueryProfile:
    query_id: QueryId | None
    query: str | None  # its text; without a query id, what it was (`unnamed_statement`)
    share: float  # of all active rows in the window
    top_wait: str
    top_wait_share: float  # within this query's active rows
    # Without a query id: what named it ("commit": its text or its waits; "text": the
    # statement's text as the sampler read it); None: a query id, or nothing tells.
    named_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "query_id": query_id_json(self.query_id),
            "query": self.query,
            "share": self.share,
            "top_wait": self.top_wait,
            "top_wait_share": self.top_wait_share,
            "named_by": self.named_by,
        }


def top_queries(
    db: duckdb.DuckDBPyConnection,
    limit: int = 10,
    start_us: int | None = None,
    end_us: int | None = None,
) -> list[QueryProfile]:
    where, params = _window(start_us, end_us)
    source = "activity_samples"
    if start_us is None and end_us is None and _has_windows(db):
        # A run's queries are its steps' workload: in their measured windows, not pgbench's
        # own start-up statements (the count(*) that finds the scale), the warm-up, or what
        # ran between steps.
        source = IN_WINDOWS
    rows = db.execute(
        f"WITH act AS (SELECT query_id, {UNNAMED} AS unnamed, "
        f"{WAIT_TYPE} || ':' || {WAIT_EVENT} AS w FROM {source} WHERE {where} AND {ACTIVE}), "
        f"per_q AS (SELECT query_id, unnamed, count(*) AS n FROM act "
        f"GROUP BY query_id, unnamed), "
        f"per_qw AS (SELECT query_id, unnamed, w, count(*) AS n, row_number() OVER "
        f"(PARTITION BY query_id, unnamed ORDER BY count(*) DESC, w) AS r FROM act "
        f"GROUP BY query_id, unnamed, w) "
        f"SELECT per_q.query_id, per_q.unnamed, q.query, per_q.n / sum(per_q.n) OVER (), "
        f"per_qw.w, per_qw.n / per_q.n FROM per_q JOIN per_qw ON per_qw.query_id IS NOT "
        f"DISTINCT FROM per_q.query_id AND per_qw.unnamed IS NOT DISTINCT FROM per_q.unnamed "
        f"AND per_qw.r = 1 "
        f"LEFT JOIN activity_queries q ON q.query_id = per_q.query_id "
        f"ORDER BY 4 DESC, 1 NULLS LAST, 2 NULLS LAST, 3 NULLS LAST LIMIT ?",
        [*params, limit],
    ).fetchall()
    out = []
    for qid, unnamed, text, share, w, ws in rows:
        wait = str(w).replace("CPU:CPU", "CPU")
        named_by = None
        if qid is None:
            text = unnamed_statement(wait, unnamed)
            named_by = "commit" if unnamed == COMMIT else "text" if unnamed else None
        out.append(QueryProfile(qid, text, float(share), wait, float(ws), named_by))
    return out


def _has_windows(db: duckdb.DuckDBPyConnection) -> bool:
    row = db.execute(
        "SELECT count(*) FROM steps WHERE window_start_us IS NOT NULL AND window_end_us IS NOT NULL"
    ).fetchone()
    return bool(row and row[0])


@dataclass(frozen=True)
class SamplerRate:
    target_hz: float
    achieved_hz: float
    lag_mean_ms: float
    lag_max_ms: float
    query_mean_ms: float


def sampler_rate(db: duckdb.DuckDBPyConnection) -> SamplerRate | None:
    row = db.execute(
        "SELECT max(target_hz), avg(samples) FILTER (WHERE samples > 0), "
        "sum(lag_mean_ms * samples) / sum(samples), max(lag_max_ms), "
        "sum(query_mean_ms * samples) / sum(samples) FROM activity_rate "
        # The first and last seconds are partial.
        "WHERE second_us > (SELECT min(second_us) FROM activity_rate) "
        "AND second_us < (SELECT max(second_us) FROM activity_rate)"
    ).fetchone()
    if row is None or row[1] is None:
        return None
    return SamplerRate(*(float(v) for v in row))


# -------------------------------------------------------------------------------------------
# Comparison with pg_wait_sampling


@dataclass(frozen=True)
class SourceComparison:
    """Both sources' distributions of client-backend wait events (waits only: Debian's
    pg_wait_sampling has no CPU bucket), and their total-variation distance."""

    pgscope: dict[str, float]
    pg_wait_sampling: dict[str, float]
    pgscope_rows: int
    pgws_rows: int
    tvd: float

    def to_json(self) -> dict[str, Any]:
        return {
            "pgscope": self.pgscope,
            "pg_wait_sampling": self.pg_wait_sampling,
            "pgscope_rows": self.pgscope_rows,
            "pg_wait_sampling_rows": self.pgws_rows,
            "total_variation_distance": self.tvd,
            "scope": "wait events of client backends (no CPU bucket)",
        }


def tvd(p: dict[str, float], q: dict[str, float]) -> float:
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in p.keys() | q.keys())


def compare_with_pgws(
    db: duckdb.DuckDBPyConnection, start_us: int | None = None, end_us: int | None = None
) -> SourceComparison | None:
    """pgscope's and pg_wait_sampling's client-backend wait distributions over one window.

    pg_wait_sampling rows carry only a pid: they are kept when the pid was a client backend
    (not pgscope's own) in pgscope's samples of the same window.
    """
    if not table_exists(db, "pgws_history"):
        return None
    where, params = _window(start_us, end_us)
    ours = db.execute(
        f"SELECT wait_event_type || ':' || wait_event, count(*) FROM activity_samples "
        f"WHERE {where} AND {CLIENTS} AND wait_event_type IS NOT NULL GROUP BY ALL",
        params,
    ).fetchall()
    theirs = db.execute(
        f"SELECT event_type || ':' || event, count(*) FROM pgws_history WHERE {where} "
        f"AND pid IN (SELECT pid FROM activity_samples WHERE {where} AND {CLIENTS}) "
        f"GROUP BY ALL",
        [*params, *params],
    ).fetchall()
    n_ours, n_theirs = sum(n for _, n in ours), sum(n for _, n in theirs)
    if not n_ours or not n_theirs:
        return None
    p = {k: n / n_ours for k, n in sorted(ours, key=lambda r: -r[1])}
    q = {k: n / n_theirs for k, n in sorted(theirs, key=lambda r: -r[1])}
    return SourceComparison(p, q, n_ours, n_theirs, tvd(p, q))


@dataclass
class WaitAnalysis:
    """Everything the renderers show about waits, computed once from the store."""

    overall: Profile
    by_clients: list[ConcurrencyProfile]
    queries: list[QueryProfile]
    rate: SamplerRate | None
    versus_pgws: SourceComparison | None
    # Beside the workload: what the server's own processes did, and its checkpoints.
    background: list[BackgroundProcess] = field(default_factory=list)
    checkpoints: list[CheckpointSpan] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.overall.to_json(),
            "background": [b.to_json() for b in self.background],
            "checkpoints": [c.to_json() for c in self.checkpoints],
            "by_clients": [
                {"variant": c.variant, "clients": c.clients, **c.profile.to_json()}
                for c in self.by_clients
            ],
            "top_queries": [q.to_json() for q in self.queries],
            "sampler": None
            if self.rate is None
            else {
                "target_hz": self.rate.target_hz,
                "achieved_hz": self.rate.achieved_hz,
                "lag_mean_ms": self.rate.lag_mean_ms,
                "lag_max_ms": self.rate.lag_max_ms,
                "query_mean_ms": self.rate.query_mean_ms,
            },
            "pg_wait_sampling": None if self.versus_pgws is None else self.versus_pgws.to_json(),
        }


def analyse(
    db: duckdb.DuckDBPyConnection, start_us: int | None = None, end_us: int | None = None
) -> WaitAnalysis | None:
    if not has_samples(db):
        return None
    whole = start_us is None and end_us is None
    return WaitAnalysis(
        profile(db, start_us, end_us),
        profiles_by_clients(db),
        top_queries(db, 10, start_us, end_us),
        sampler_rate(db),
        compare_with_pgws(db, start_us, end_us),
        background(db) if whole else [],
        checkpoint_spans(db) if whole else [],
    )


def backend_cpu_aas(db: duckdb.DuckDBPyConnection, backend_type: str) -> dict[Cell, float]:
    """Per (variant, clients, rate): average number of `backend_type` processes on CPU (e.g.
    how busy the walsenders are), over the steps' measured windows."""
    if not has_samples(db):
        return {}
    rows = db.execute(
        "SELECT variant, clients, rate, count(*) FILTER (WHERE backend_type = ? AND "
        "wait_event_type IS NULL AND state IS DISTINCT FROM 'idle') / "
        f"count(DISTINCT sample_no) FROM {IN_WINDOWS} GROUP BY ALL",
        [backend_type],
    ).fetchall()
    return {(str(v), int(c), r): float(a) for v, c, r, a in rows}
