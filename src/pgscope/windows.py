"""An observation's windows: the steps of a run whose load pgscope did not drive.

`pgscope observe` cuts its time into windows (default 10 s). Each window is a row of `steps`
(variant `observed`), so the whole analysis (cells, USL, facts, rules, report) reads an
observation as it reads a sweep. Consecutive windows share their edge: one instant ends a
window and begins the next, and the collectors read the server there once for both (session.py
`Windows`). Each window is closed as soon as what covers it is in the store (its samples are
written within a second or two of its end): `close_windows` fills its figures in, with one SQL
statement per table, restricted to the windows it is given:

- `tps`: commits per second, from pg_stat_database.xact_commit at the window's edges, summed
  over the databases (pgscope's own sessions commit too: about 3 a second);
- `clients`: the window's concurrency rounded, its exact value in `windows.concurrency`: per
  client session that was not idle at least once in the window, the share of the window's
  activity samples it appears in, summed (pgscope's own sessions left out). A pgbench with 4
  clients reads 4; a window across a change from 2 to 4 clients reads their time-weighted mean;
- per second, commits per second into `timeline` (the report's timeline view).

A window in which no client session was active is `idle`: it is kept, and no cell counts it.
A window shorter than half its planned length (the last one of an observation stopped early)
is `short`: kept with its figures, and neither a cell, an outlier nor the worst window. A
window whose sessions came or went (`steady` false) mixes two loads: it is `mixed`, out of the
cells and the USL fit, when at least half the active windows are steady (decided again over
every closed window each time one closes). A window the observation could not close (the
server lost, the results disk full, pgscope killed) has no figures: `cut` (session.py), or
still `running` in the store of a killed observation, which the analysis reads as `cut`.
"""

from __future__ import annotations

from collections.abc import Sequence

from pgscope.duck import table_exists
from pgscope.store import RunStore

VARIANT = "observed"
# A window whose sessions came or went mixes two loads (say 2 clients, then 4); and a
# session that exits flushes its pending commit counts (up to a second's) into the window it
# leaves, so even a session leaving at the window's last moment makes it mixed: steady means
# every session active in it is in every one of its samples.
STEADY_SLACK = 0.001
# A window under this share of its planned length (`steps.duration_s`) is `short`: the last
# one of an observation stopped early. Its commits/s over a few seconds is no window's peer
# (issue 30: a 3.8-s last window of 10-s ones became the worst).
SHORT_SHARE = 0.5
# What the observation could not close: no figures, and no analysis counts it.
CUT = "cut"


# Each database's counter at each snapshot, summed over databases per snapshot time.
_COUNTER = """
SELECT ts_us, step_id, mark, sum(value) AS value FROM pgstats_counters
WHERE source = 'pg_stat_database' AND counter = '{counter}' GROUP BY ALL
"""


def _where(only: Sequence[int] | None, alias: str = "") -> str:
    """The condition choosing the windows `only` (every window when None) in `steps`, its
    columns qualified by `alias` where the query joins steps to tables with the same names."""
    at = f"{alias}." if alias else ""
    chosen = f"{at}variant = '{VARIANT}'"
    if only is not None:
        chosen += f" AND {at}step_id IN ({', '.join(str(int(i)) for i in only) or 'NULL'})"
    return chosen


def _edges(only: Sequence[int] | None) -> str:
    """Per window chosen: its edges' snapshot times, the commits and rollbacks between them."""
    return f"""
WITH c AS ({_COUNTER.format(counter="xact_commit")}),
     r AS ({_COUNTER.format(counter="xact_rollback")})
SELECT s.step_id,
       max(CASE WHEN c.mark = 'start' THEN c.ts_us END) AS start_us,
       max(CASE WHEN c.mark = 'end' THEN c.ts_us END) AS end_us,
       max(CASE WHEN c.mark = 'end' THEN c.value END)
           - max(CASE WHEN c.mark = 'start' THEN c.value END) AS commits,
       max(CASE WHEN r.mark = 'end' THEN r.value END)
           - max(CASE WHEN r.mark = 'start' THEN r.value END) AS rollbacks
FROM steps s
LEFT JOIN c ON c.step_id = s.step_id
LEFT JOIN r ON r.step_id = s.step_id AND r.mark = c.mark
WHERE {_where(only, "s")} GROUP BY s.step_id
"""


def _in_window(only: Sequence[int] | None) -> str:
    """Each window chosen once per second it covers: the samples meet it on their second (a
    hash join that streams 18 M rows; a range join costs rows x windows), its bounds decide at
    the edges (half-open, as analyze/waits.py IN_WINDOWS: a sample on the edge two windows
    share is the next one's). DuckDB filters the samples' scan by the seconds the join can
    meet, so closing one window reads about that window's samples (measured: 0.02 s for a
    window of a store of 3 M samples, the same as with explicit bounds)."""
    return (
        "JOIN (SELECT step_id, window_start_us AS lo, window_end_us AS hi, "
        "unnest(range(window_start_us // 1000000, window_end_us // 1000000 + 1)) AS second "
        f"FROM steps WHERE {_where(only)} AND window_start_us IS NOT NULL "
        "AND window_end_us IS NOT NULL) w "
        "ON a.ts_us // 1000000 = w.second AND a.ts_us >= w.lo AND a.ts_us < w.hi"
    )


def _concurrency(only: Sequence[int] | None) -> str:
    joined = _in_window(only)
    return f"""
WITH samples AS (
    SELECT w.step_id, count(DISTINCT a.sample_no) AS n
    FROM activity_samples a {joined} GROUP BY ALL
), present AS (
    SELECT w.step_id, a.pid, count(DISTINCT a.sample_no) AS seen
    FROM activity_samples a {joined}
    WHERE a.backend_type = 'client backend'
      AND coalesce(a.application_name, '') NOT LIKE 'pgscope%'
    GROUP BY ALL
    HAVING bool_or(a.state IS NOT NULL AND a.state <> 'idle')
)
SELECT samples.step_id, coalesce(sum(present.seen / samples.n), 0) AS concurrency,
       count(present.pid) AS sessions
FROM samples LEFT JOIN present USING (step_id) GROUP BY samples.step_id
"""


def open_windows(store: RunStore) -> None:
    store.create_tables("observe")


def close_windows(store: RunStore, only: Sequence[int] | None = None) -> None:
    """Fill in the figures of the windows `only` (every window when None) from what the
    collectors recorded (see the module). The one definition of a window's figures: `observe`
    closes each window with it as it ends; closing a window again gives the same figures."""
    db = store.db
    store.create_tables("observe")
    if only is not None and not only:
        return
    chosen = _where(only)
    db.execute(
        f"INSERT OR REPLACE INTO windows (step_id, seconds) "
        f"SELECT step_id, (coalesce(ended_us, started_us) - started_us) / 1e6 FROM steps "
        f"WHERE {chosen}"
    )
    db.execute(
        f"UPDATE steps SET window_start_us = started_us, "
        f"window_end_us = coalesce(ended_us, started_us) WHERE {chosen}"
    )
    if table_exists(db, "pgstats_counters"):
        # The edges' snapshots bound the window exactly: the commits are counted between them.
        edges = _edges(only)
        db.execute(
            f"UPDATE steps SET window_start_us = coalesce(e.start_us, steps.window_start_us), "
            f"window_end_us = coalesce(e.end_us, steps.window_end_us), "
            f"xacts = e.commits::BIGINT, "
            f"tps = e.commits / nullif((e.end_us - e.start_us) / 1e6, 0) "
            f"FROM ({edges}) e WHERE steps.step_id = e.step_id"
        )
        db.execute(
            f"UPDATE windows SET commits = e.commits, rollbacks = e.rollbacks, "
            f"seconds = (e.end_us - e.start_us) / 1e6 "
            f"FROM ({edges}) e WHERE windows.step_id = e.step_id AND e.end_us IS NOT NULL"
        )
        _per_second(store, only)
    if table_exists(db, "activity_samples"):
        db.execute(
            f"UPDATE windows SET concurrency = c.concurrency, sessions = c.sessions, "
            f"steady = c.concurrency >= c.sessions - {STEADY_SLACK} "
            f"FROM ({_concurrency(only)}) c "
            f"WHERE windows.step_id = c.step_id"
        )
    db.execute(
        "UPDATE steps SET clients = coalesce(round(w.concurrency), 0)::INTEGER, "
        "status = CASE WHEN steps.status NOT IN ('ok', 'running', 'idle', 'short', 'mixed') "
        "THEN steps.status "
        f"WHEN w.seconds < {SHORT_SHARE} * steps.duration_s THEN 'short' "
        "WHEN w.concurrency >= 0.5 AND steps.tps IS NOT NULL THEN 'ok' ELSE 'idle' END "
        f"FROM windows w WHERE steps.step_id = w.step_id AND {_where(only, 'steps')}"
    )
    # Mixed windows leave the cells only where most windows are steady: on a server whose
    # sessions churn (a connection per request) every window is mixed, and all count. Decided
    # over every window closed so far, so a window closed later can change an earlier one's.
    db.execute(
        "UPDATE steps SET status = CASE WHEN NOT w.steady AND (SELECT count(*) FILTER "
        "(w2.steady) >= count(*) / 2 FROM windows w2 JOIN steps s2 USING (step_id) "
        "WHERE s2.status IN ('ok', 'mixed')) THEN 'mixed' ELSE 'ok' END "
        "FROM windows w WHERE steps.step_id = w.step_id AND steps.status IN ('ok', 'mixed')"
    )


def _per_second(store: RunStore, only: Sequence[int] | None) -> None:
    """Commits per second between consecutive snapshots, into `timeline`, each second in the
    window it ends in (the chosen windows' seconds replaced)."""
    store.db.execute(
        f"DELETE FROM timeline WHERE step_id IN (SELECT step_id FROM steps WHERE {_where(only)})"
    )
    store.db.execute(
        f"""
        INSERT INTO timeline (step_id, ts_us, tps)
        WITH c AS (
            SELECT ts_us, value - lag(value) OVER (ORDER BY ts_us) AS d,
                   (ts_us - lag(ts_us) OVER (ORDER BY ts_us)) / 1e6 AS dt
            FROM ({_COUNTER.format(counter="xact_commit")})
        )
        SELECT s.step_id, c.ts_us, c.d / c.dt FROM c
        JOIN steps s ON c.ts_us > s.window_start_us AND c.ts_us <= s.window_end_us
        WHERE {_where(only, "s")} AND c.dt >= 0.2 AND c.d >= 0
        ORDER BY c.ts_us
        """
    )
