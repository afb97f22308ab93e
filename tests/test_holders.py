"""Who held a waited-for lock, read from planted readings: the head of the chain, and what it
did while it held the lock by its own samples (analyze/holders.py)."""

from __future__ import annotations

from typing import Any

import duckdb
import pytest

from pgscope import tables
from pgscope.analyze.holders import lock_holders

QUERY = 42
READ_US = 10_500_000  # the reading's instant, mid-second: waiters are matched by second
MS = 1000


def _store() -> duckdb.DuckDBPyConnection:
    db = duckdb.connect()
    for name in ("activity_samples", "activity_blockers"):
        db.execute(tables.of(name).ddl())
    return db


def _reading(db: duckdb.DuckDBPyConnection, *rows: tuple[Any, ...]) -> None:
    """(waiter, blocked by, locktype, the blocker's state, its seconds in its transaction,
    in its state), all read at READ_US."""
    for pid, by, locktype, state, xact_s, state_s in rows:
        db.execute(
            "INSERT INTO activity_blockers (ts_us, pid, blocked_by, locktype, relation, mode, "
            "blocker_state, blocker_xact_s, blocker_state_s, blocker_query, blocker_application) "
            "VALUES (?, ?, ?, ?, NULL, 'ShareLock', ?, ?, ?, 'update t set n = n + 1', 'app')",
            [READ_US, pid, by, locktype, state, xact_s, state_s],
        )


def _samples(db: duckdb.DuckDBPyConnection, pid: int, *states: tuple[int, str, str | None]) -> None:
    """(ms before the reading, state, Lock wait event or None) of one session."""
    for before_ms, state, event in states:
        db.execute(
            "INSERT INTO activity_samples (ts_us, sample_no, pid, backend_type, state, "
            "wait_event_type, wait_event, query_id) VALUES (?, ?, ?, 'client backend', ?, ?, ?, ?)",
            [READ_US - before_ms * MS, READ_US - before_ms * MS, pid, state,
             "Lock" if event else None, event, QUERY],
        )  # fmt: skip


def _waiting(db: duckdb.DuckDBPyConnection, pid: int, event: str) -> None:
    _samples(db, pid, (5, "active", event))


def _weights(db: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], float]:
    """(wait event, holder's state) -> readings behind it."""
    out: dict[tuple[str, str], float] = {}
    for (_, event), rows in lock_holders(db, "activity_samples", "TRUE").items():
        for row in rows:
            out[(event, row[3])] = out.get((event, row[3]), 0.0) + row[-1]
    return out


def test_a_waiter_behind_a_waiter_is_held_by_the_head_of_the_chain() -> None:
    """Session 1 waits for the tuple lock held by 2, which waits for 3's transaction: 3,
    idle in its transaction, holds both up; 2, active in its wait, is only a link."""
    db = _store()
    _reading(
        db,
        (1, 2, "tuple", "active", 0.03, 0.03),
        (2, 3, "transactionid", "idle in transaction", 0.06, 0.04),
    )
    _waiting(db, 1, "tuple")
    _waiting(db, 2, "transactionid")
    weights = _weights(db)
    assert weights == {
        ("Lock:tuple", "idle in transaction"): 1.0,
        ("Lock:transactionid", "idle in transaction"): 1.0,
    }


def test_a_cycle_has_no_head_and_is_left_out() -> None:
    db = _store()
    _reading(
        db, (1, 2, "transactionid", "active", 0.1, 0.1), (2, 1, "transactionid", "active", 0.1, 0.1)
    )
    _waiting(db, 1, "transactionid")
    _waiting(db, 2, "transactionid")
    assert _weights(db) == {}


def test_a_holder_caught_committing_after_idling_was_idle_for_its_waiters() -> None:
    """Read at the instant it commits (active, 0.3 ms in that state), after waiting for the
    row itself and then idling 60 ms: two of its three samples since it got the lock are idle
    in its transaction, and that is the share its waiters waited on an idle holder."""
    db = _store()
    _reading(db, (1, 3, "transactionid", "active", 0.155, 0.0003))
    _waiting(db, 1, "transactionid")
    _samples(
        db, 3,
        (90, "active", "transactionid"),  # waiting for the row itself: not yet holding it
        (70, "active", "transactionid"),
        (50, "active", None),
        (30, "idle in transaction", None),
        (10, "idle in transaction", None),
        (200, "idle in transaction", None),  # before its transaction began: not counted
    )  # fmt: skip
    weights = _weights(db)
    assert weights[("Lock:transactionid", "idle in transaction")] == pytest.approx(2 / 3)
    assert weights[("Lock:transactionid", "active")] == pytest.approx(1 / 3)


def test_a_holder_running_statements_stays_active() -> None:
    """Hot rows: the holder runs its statements while others wait; its samples since it got
    the lock show it active, so nothing of the wait goes to an idle holder, though it was
    read between two statements for a moment."""
    db = _store()
    _reading(db, (1, 3, "transactionid", "idle in transaction", 0.05, 0.0015))
    _waiting(db, 1, "transactionid")
    _samples(db, 3, (40, "active", "transactionid"), (20, "active", None), (2, "active", None))
    weights = _weights(db)
    assert weights == {("Lock:transactionid", "active"): 1.0}


def test_the_idle_stretch_is_the_readings_own() -> None:
    """Seconds in the idle state come from readings that saw the holder idle: a reading of a
    holder at work says nothing about how long it idles."""
    db = _store()
    _reading(db, (1, 3, "transactionid", "active", 0.1, 0.0))
    _waiting(db, 1, "transactionid")
    _samples(db, 3, (40, "idle in transaction", None), (20, "idle in transaction", None))
    rows = {r[3]: r for r in next(iter(lock_holders(db, "activity_samples", "TRUE").values()))}
    assert rows["idle in transaction"][8] == pytest.approx(1.0)
    assert rows["idle in transaction"][7] is None


def test_a_long_transactions_holder_is_read_over_the_second_before_the_reading() -> None:
    """A reading stands for about the second since the one before: what a holder 30 s into its
    transaction did seconds earlier is another reading's."""
    db = _store()
    _reading(db, (1, 3, "transactionid", "active", 30.0, 0.4))
    _waiting(db, 1, "transactionid")
    _samples(
        db, 3,
        (5000, "idle in transaction", None),
        (3000, "idle in transaction", None),
        (500, "active", None),
        (100, "active", None),
    )  # fmt: skip
    assert _weights(db) == {("Lock:transactionid", "active"): 1.0}
