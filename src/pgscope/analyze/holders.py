"""Who held the lock each waiting session waited for, and what it did while it held it: the
heads of the wait chains in each reading of the blockers (activity_blockers, at most one a
second), weighted by the holder's own samples (activity_samples, 50 a second).

The holder is the head of the chain: a session that blocks a waiter while it waits itself
(for a row's lock, the session holding the tuple lock waits for the row's transaction) is a
link, not the cause, so each waiter is followed, within one reading, to the sessions that
block it and wait for nothing. A wait that is a cycle (a deadlock, until the server breaks
it) has no head and is left out.

What the holder did while it held the lock is read from its own samples, not from the one
instant of the reading: from its last wait for a lock in its transaction to the reading (and
at most the second before it, which a reading stands for), the share of its samples idle in
the transaction. A holder read at the instant it commits after
idling 50 ms was idle, for its waiters, nearly all the time they waited. The seconds in its
state stay the reading's: they say how long an idle stretch lasts, which 20-ms samples
cannot.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import duckdb

from pgscope.analyze.waits import WAIT_EVENT, WAIT_TYPE
from pgscope.duck import table_exists

# (waiting statement's query id, its lock wait event) -> rows of (locktype, relation, mode,
# holder's state, application, statement, mean seconds in its transaction, mean seconds in
# its state, weight: the readings behind the row)
Holders = dict[tuple[int | None, str], list[tuple[Any, ...]]]


# {source} and {where}: the samples of the scope the waits are counted in; only the readings
# of seconds in which its sessions waited for a lock are read.
_HEADS_SQL = """
WITH RECURSIVE waiting AS MATERIALIZED (
    SELECT pid, ts_us // 1000000 AS second, {wait_type} || ':' || {wait_event} AS event,
           {step} AS step, arg_max(query_id, ts_us) AS query_id
    FROM {source} WHERE {where} AND wait_event_type = 'Lock' GROUP BY ALL),
readings AS MATERIALIZED (
    SELECT * FROM activity_blockers
    WHERE ts_us // 1000000 IN (SELECT DISTINCT second FROM waiting)),
hops(ts_us, waiter, holder) AS (
    SELECT ts_us, pid, blocked_by FROM readings
    UNION  -- each (waiter, session) once: a queue or a cycle ends the walk
    SELECT h.ts_us, h.waiter, b.blocked_by
    FROM hops h JOIN readings b ON b.ts_us = h.ts_us AND b.pid = h.holder),
heads AS MATERIALIZED (
    SELECT DISTINCT ts_us, waiter, holder FROM hops h
    WHERE NOT EXISTS (SELECT 1 FROM readings b WHERE b.ts_us = h.ts_us AND b.pid = h.holder)),
holders AS MATERIALIZED (
    SELECT ts_us, blocked_by AS holder, any_value(blocker_state) AS state,
           any_value(blocker_application) AS application,
           any_value(blocker_query) AS query, any_value(blocker_xact_s) AS xact_s,
           any_value(blocker_state_s) AS state_s
    FROM readings GROUP BY ALL),
-- The holder's samples from the start of its transaction, and at most {span_s} s back: a
-- reading stands for about the second since the one before.
spans AS MATERIALIZED (
    SELECT ts_us, holder,
           ts_us - CAST(least(coalesce(xact_s, 0), {span_s}) * 1e6 AS BIGINT) AS since_us
    FROM holders),
held AS MATERIALIZED (
    SELECT h.ts_us, h.holder, a.ts_us AS seen_us, a.state,
           max(CASE WHEN a.wait_event_type = 'Lock' THEN a.ts_us END)
               OVER (PARTITION BY h.ts_us, h.holder) AS waited
    FROM (SELECT *, unnest(range(since_us // 1000000, ts_us // 1000000 + 1)) AS second
          FROM spans) h
    JOIN activity_samples a ON a.pid = h.holder AND a.ts_us // 1000000 = h.second
        AND a.ts_us > h.since_us AND a.ts_us <= h.ts_us),
spent AS MATERIALIZED (
    SELECT ts_us, holder, count(*) AS n,
           count(*) FILTER (WHERE state LIKE 'idle in transaction%') AS idle
    FROM held WHERE seen_us > coalesce(waited, 0) GROUP BY ALL),
split AS MATERIALIZED (
    SELECT *, CASE WHEN coalesce(n, 0) = 0 THEN read_idle::int::double
                   ELSE idle / n END AS idle_share
    FROM (SELECT h.*, h.state LIKE 'idle in transaction%' AS read_idle, s.n, s.idle
          FROM holders h LEFT JOIN spent s USING (ts_us, holder))),
-- Each reading in two parts, idle and not, weighed by the share; read_so: the reading saw the
-- holder in the part's state, so its statement is the one the part names.
parts AS MATERIALIZED (
    SELECT ts_us, holder, application, query, xact_s, idle_share AS weight,
           CASE WHEN read_idle THEN state ELSE 'idle in transaction' END AS state,
           CASE WHEN read_idle THEN state_s END AS state_s, read_idle AS read_so
    FROM split WHERE idle_share > 0
    UNION ALL
    SELECT ts_us, holder, application, query, xact_s, 1 - idle_share,
           CASE WHEN read_idle THEN 'active' ELSE state END,
           CASE WHEN read_idle THEN NULL ELSE state_s END, NOT read_idle
    FROM split WHERE idle_share < 1),
locks AS MATERIALIZED (
    SELECT ts_us, ts_us // 1000000 AS second, pid, any_value(locktype) AS locktype,
           any_value(relation) AS relation, any_value(mode) AS mode
    FROM readings GROUP BY ALL),
-- The waiter's sample of the same second and, where it has one, of the same lock
-- (a lock wait's event is its lock's type): a second can hold two waits.
matched AS MATERIALIZED (
    SELECT e.ts_us, e.waiter, e.holder, l.locktype, l.relation, l.mode, w.step,
           arg_max(w.query_id, ((w.event = 'Lock:' || l.locktype)::int, w.event)) AS query_id,
           arg_max(w.event, ((w.event = 'Lock:' || l.locktype)::int, w.event)) AS event
    FROM heads e
    JOIN locks l ON l.ts_us = e.ts_us AND l.pid = e.waiter
    -- keyed on the lock's (pid, second): keyed on the waiter alone, the planner joined every
    -- second of a session's waits to every reading of it
    JOIN waiting w ON w.pid = l.pid AND w.second = l.second
    GROUP BY ALL)
-- The same rows in every process: ties are broken by value, and the means and sums are
-- rounded below the last digit a reading holds (DuckDB adds floats in the order its threads
-- finish: two reports of one store differed in the 17th digit).
SELECT m.query_id, m.event, m.locktype, m.relation, m.mode, p.state,
       p.application, coalesce(arg_max(p.query, (p.read_so::int, p.ts_us)), ''),
       round(avg(p.xact_s), 6), round(avg(p.state_s), 6), round(sum(p.weight), 9) AS weight,
       m.step
FROM matched m JOIN parts p ON p.ts_us = m.ts_us AND p.holder = m.holder
GROUP BY ALL ORDER BY 12, weight DESC, 1, 2, 3, 4, 5, 6, 7, 8
"""
# How far back a holder's own samples are read from a reading (seconds).
_SPAN_S = 1.0


def lock_holders(db: duckdb.DuckDBPyConnection, source: str, where: str) -> Holders:
    """The heads of the lock waits of the samples `source` holds where `where` is true."""
    return lock_holders_by_step(db, source, where, "NULL").get(None, {})


def lock_holders_by_step(
    db: duckdb.DuckDBPyConnection, source: str, where: str, step: str = "step_id"
) -> dict[int | None, Holders]:
    """lock_holders of each step apart (`step`: the column of `source` that names it), in one
    reading: the same rows as one call per step, at the cost of one."""
    if not table_exists(db, "activity_blockers"):
        return {}
    rows = db.execute(
        _HEADS_SQL.format(
            source=source,
            where=where,
            step=step,
            wait_type=WAIT_TYPE,
            wait_event=WAIT_EVENT,
            span_s=_SPAN_S,
        )
    ).fetchall()
    out: dict[int | None, Holders] = defaultdict(lambda: defaultdict(list))
    for query_id, event, *rest, step_id in rows:
        key = (None if query_id is None else int(query_id), str(event))
        out[None if step_id is None else int(step_id)][key].append(tuple(rest))
    return out
