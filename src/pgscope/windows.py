"""An observation's windows: the steps of a run whose load pgscope did not drive.

`pgscope observe` cuts its time into windows (default 10 s). Each window is a row of `steps`
(variant `observed`), so the whole analysis (cells, USL, facts, rules, report) reads an
observation as it reads a sweep. While observing, the collectors are stepped at each window's
edges (pgstats and pg_stat_statements read there); at the end `close_windows` fills each
window's figures in, in the store, with one SQL statement per table:

- `tps`: commits per second, from pg_stat_database.xact_commit at the window's edges, summed
  over the databases (pgscope's own sessions commit too: about 3 a second);
- `clients`: the window's concurrency rounded, its exact value in `windows.concurrency`: per
  client session that was not idle at least once in the window, the share of the window's
  activity samples it appears in, summed (pgscope's own sessions left out). A pgbench with 4
  clients reads 4; a window across a change from 2 to 4 clients reads their time-weighted mean;
- per second, commits per second into `timeline` (the report's timeline view).

A window in which no client session was active is `idle`: it is kept, and no cell counts it.
A window whose sessions came or went (`steady` false) mixes two loads: it is `mixed`, out of
the cells and the USL fit, when at least half the active windows are steady.
"""

from __future__ import annotations

from pgscope.duck import table_exists
from pgscope.store import RunStore

VARIANT = "observed"
# A window whose sessions came or went mixes two loads (say 2 clients, then 4); and a
# session that exits flushes its pending commit counts (up to a second's) into the window it
# leaves, so even a session leaving at the window's last moment makes it mixed: steady means
# every session active in it is in every one of its samples.
STEADY_SLACK = 0.001


# Each database's counter at each snapshot, summed over databases per snapshot time.
_COUNTER = """
SELECT ts_us, step_id, mark, sum(value) AS value FROM pgstats_counters
WHERE source = 'pg_stat_database' AND counter = '{counter}' GROUP BY ALL
"""

_EDGES = f"""
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
WHERE s.variant = '{VARIANT}' GROUP BY s.step_id
"""

# Each window once per second it covers: the samples meet it on their second (a hash join
# that streams 18 M rows; a range join costs rows x windows), its bounds decide at the edges.
_IN_WINDOW = (
    "JOIN (SELECT step_id, window_start_us AS lo, window_end_us AS hi, "
    "unnest(range(window_start_us // 1000000, window_end_us // 1000000 + 1)) AS second "
    f"FROM steps WHERE variant = '{VARIANT}' AND window_start_us IS NOT NULL "
    "AND window_end_us IS NOT NULL) w "
    "ON a.ts_us // 1000000 = w.second AND a.ts_us BETWEEN w.lo AND w.hi"
)

_CONCURRENCY = f"""
WITH samples AS (
    SELECT w.step_id, count(DISTINCT a.sample_no) AS n
    FROM activity_samples a {_IN_WINDOW} GROUP BY ALL
), present AS (
    SELECT w.step_id, a.pid, count(DISTINCT a.sample_no) AS seen
    FROM activity_samples a {_IN_WINDOW}
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


def close_windows(store: RunStore) -> None:
    """Fill every window's figures in from what the collectors recorded (see the module)."""
    db = store.db
    store.create_tables("observe")
    db.execute(
        f"INSERT OR REPLACE INTO windows (step_id, seconds) "
        f"SELECT step_id, (coalesce(ended_us, started_us) - started_us) / 1e6 FROM steps "
        f"WHERE variant = '{VARIANT}'"
    )
    db.execute(
        f"UPDATE steps SET window_start_us = started_us, "
        f"window_end_us = coalesce(ended_us, started_us) WHERE variant = '{VARIANT}'"
    )
    if table_exists(db, "pgstats_counters"):
        # The edges' snapshots bound the window exactly: the commits are counted between them.
        db.execute(
            f"UPDATE steps SET window_start_us = coalesce(e.start_us, steps.window_start_us), "
            f"window_end_us = coalesce(e.end_us, steps.window_end_us), "
            f"xacts = e.commits::BIGINT, "
            f"tps = e.commits / nullif((e.end_us - e.start_us) / 1e6, 0) "
            f"FROM ({_EDGES}) e WHERE steps.step_id = e.step_id"
        )
        db.execute(
            f"UPDATE windows SET commits = e.commits, rollbacks = e.rollbacks, "
            f"seconds = (e.end_us - e.start_us) / 1e6 "
            f"FROM ({_EDGES}) e WHERE windows.step_id = e.step_id AND e.end_us IS NOT NULL"
        )
        _per_second(store)
    if table_exists(db, "activity_samples"):
        db.execute(
            f"UPDATE windows SET concurrency = c.concurrency, sessions = c.sessions, "
            f"steady = c.concurrency >= c.sessions - {STEADY_SLACK} "
            f"FROM ({_CONCURRENCY}) c WHERE windows.step_id = c.step_id"
        )
    db.execute(
        "UPDATE steps SET clients = coalesce(round(w.concurrency), 0)::INTEGER, "
        "status = CASE WHEN steps.status IN ('ok', 'running') AND w.concurrency >= 0.5 "
        "AND steps.tps IS NOT NULL THEN 'ok' WHEN steps.status IN ('ok', 'running') "
        "THEN 'idle' ELSE steps.status END "
        "FROM windows w WHERE steps.step_id = w.step_id"
    )
    # Mixed windows leave the cells only where most windows are steady: on a server whose
    # sessions churn (a connection per request) every window is mixed, and all count.
    db.execute(
        "UPDATE steps SET status = 'mixed' FROM windows w WHERE steps.step_id = w.step_id "
        "AND steps.status = 'ok' AND NOT w.steady AND (SELECT count(*) FILTER (w2.steady) "
        ">= count(*) / 2 FROM windows w2 JOIN steps s2 USING (step_id) "
        "WHERE s2.status = 'ok')"
    )


def _per_second(store: RunStore) -> None:
    """Commits per second between consecutive snapshots, into `timeline`, each second in the
    window it ends in."""
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
        WHERE s.variant = '{VARIANT}' AND c.dt >= 0.2 AND c.d >= 0
        ORDER BY c.ts_us
        """
    )
