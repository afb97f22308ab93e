"""Who held the lock each waiting session waited for, and what it did while it held it: the
heads of the wait chains in each reading of the blockers (activity_blockers, at most one a
second), weighted by the holder's own samples (activity_samples, 50 a second).

The holder is the head of the chain: a session that blocks a waiter while it waits itself
(for a row's lock, the session holding the tuple lock waits for the row's transaction) is a
link, not the cause, so each waiter is followed, within one reading, to the sessions that
block it and wait for nothing. A wait that is a cycle (a deadlock, until the server breaks
it) has no head and is left out.

What the holder did while it held the lock is read from its own samples, not from the one
instant of the reading: from its last wait for a lock in its transaction to the reading, the
share of its samples idle in the transaction. A holder read at the instant it commits after
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


# {source} and {where}: the samples of the scope the waits are counted in.
_HEADS_SQL = """
WITH RECURSIVE hops(ts_us, waiter, holder) AS (
    SELECT ts_us, pid, blocked_by FROM activity_blockers
    UNION  -- each (waiter, session) once: a queue or a cycle ends the walk
    SELECT h.ts_us, h.waiter, b.blocked_by
    FROM hops h JOIN activity_blockers b ON b.ts_us = h.ts_us AND b.pid = h.holder),
heads AS (
    SELECT DISTINCT ts_us, waiter, holder FROM hops h
    WHERE NOT EXISTS (SELECT 1 FROM activity_blockers b
                      WHERE b.ts_us = h.ts_us AND b.pid = h.holder)),
holders AS (
    SELECT ts_us, blocked_by AS holder, any_value(blocker_state) AS state,
           any_value(blocker_application) AS application,
           any_value(blocker_query) AS query, any_value(blocker_xact_s) AS xact_s,
           any_value(blocker_state_s) AS state_s
    FROM activity_blockers GROUP BY ALL),
held AS (
    SELECT h.ts_us, h.holder, a.ts_us AS seen_us, a.state,
           max(CASE WHEN a.wait_event_type = 'Lock' THEN a.ts_us END)
               OVER (PARTITION BY h.ts_us, h.holder) AS waited
    FROM holders h JOIN activity_samples a ON a.pid = h.holder
        AND a.ts_us > h.ts_us - CAST(coalesce(h.xact_s, 0) * 1e6 AS BIGINT)
        AND a.ts_us <= h.ts_us),
spent AS (
    SELECT ts_us, holder, count(*) AS n,
           count(*) FILTER (WHERE state LIKE 'idle in transaction%') AS idle
    FROM held WHERE seen_us > coalesce(waited, 0) GROUP BY ALL),
split AS (
    SELECT h.*, CASE WHEN coalesce(s.n, 0) = 0
                     THEN (h.state LIKE 'idle in transaction%')::int::double
                     ELSE s.idle / s.n END AS idle_share
    FROM holders h LEFT JOIN spent s USING (ts_us, holder)),
parts AS (
    SELECT ts_us, holder, application, query, xact_s, idle_share AS weight,
           CASE WHEN state LIKE 'idle in transaction%' THEN state
                ELSE 'idle in transaction' END AS state,
           CASE WHEN state LIKE 'idle in transaction%' THEN state_s END AS state_s
    FROM split WHERE idle_share > 0
    UNION ALL
    SELECT ts_us, holder, application, query, xact_s, 1 - idle_share,
           CASE WHEN state LIKE 'idle in transaction%' THEN 'active' ELSE state END,
           CASE WHEN state LIKE 'idle in transaction%' THEN NULL ELSE state_s END
    FROM split WHERE idle_share < 1),
locks AS (
    SELECT ts_us, pid, any_value(locktype) AS locktype,
           any_value(relation) AS relation, any_value(mode) AS mode
    FROM activity_blockers GROUP BY ALL),
waiting AS (
    SELECT pid, ts_us // 1000000 AS second, {wait_type} || ':' || {wait_event} AS event,
           any_value(query_id) AS query_id
    FROM {source} WHERE {where} AND wait_event_type = 'Lock' GROUP BY ALL),
-- The waiter's sample of the same second and, where it has one, of the same lock
-- (a lock wait's event is its lock's type): a second can hold two waits.
matched AS (
    SELECT e.ts_us, e.waiter, e.holder, l.locktype, l.relation, l.mode,
           arg_max(w.query_id, (w.event = 'Lock:' || l.locktype)::int) AS query_id,
           arg_max(w.event, (w.event = 'Lock:' || l.locktype)::int) AS event
    FROM heads e
    JOIN locks l ON l.ts_us = e.ts_us AND l.pid = e.waiter
    JOIN waiting w ON w.pid = e.waiter AND w.second = e.ts_us // 1000000
    GROUP BY ALL)
SELECT m.query_id, m.event, m.locktype, m.relation, m.mode, p.state,
       p.application, coalesce(any_value(p.query), ''),
       avg(p.xact_s), avg(p.state_s), sum(p.weight)
FROM matched m JOIN parts p ON p.ts_us = m.ts_us AND p.holder = m.holder
GROUP BY ALL ORDER BY sum(p.weight) DESC
"""


def lock_holders(db: duckdb.DuckDBPyConnection, source: str, where: str) -> Holders:
    """The heads of the lock waits of the samples `source` holds where `where` is true."""
    if not table_exists(db, "activity_blockers"):
        return {}
    rows = db.execute(
        _HEADS_SQL.format(source=source, where=where, wait_type=WAIT_TYPE, wait_event=WAIT_EVENT)
    ).fetchall()
    out: Holders = defaultdict(list)
    for query_id, event, *rest in rows:
        out[(None if query_id is None else int(query_id), str(event))].append(tuple(rest))
    return out
