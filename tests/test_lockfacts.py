"""Relation-lock facts from sparse pg_locks readings (one a second)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from pgscope.analyze.facts import CellFacts
from pgscope.analyze.facts.heldlocks import HeldLockFamily
from pgscope.analyze.heldlocks import HeldLocks, HeldStep, HeldTable
from pgscope.analyze.model import FactSheet, RunAnalysis


def _analysis(caught_at_8: int) -> RunAnalysis:
    steps = [SimpleNamespace(step_id=i, variant="generic", clients=c) for i, c in ((1, 2), (2, 8))]
    held = HeldLocks(
        True,
        [
            HeldStep(1, 3, 2, 258, 32, 226, 1.0, 2.0),
            HeldStep(
                2, 3, caught_at_8, 129 * caught_at_8, 16 * caught_at_8, 113 * caught_at_8, 1.0, 2.0
            ),
        ],
        [
            HeldTable(1, "orders", 128, 2, 258),
            HeldTable(2, "orders", 128, caught_at_8, 129 * caught_at_8),
        ],
    )
    cpu = SimpleNamespace(profiles=[])
    return cast(
        RunAnalysis,
        cast(Any, SimpleNamespace(steps=steps, held_locks=held, cpu=cpu, observation=None)),
    )


def _held_lock_facts(analysis: RunAnalysis) -> FactSheet:
    """The held-lock family's facts of the 8-client cell (the only family this needs)."""
    sheet = FactSheet("generic", 8)
    cell = CellFacts(analysis, "generic", 8, True, [], cast(Any, None))
    HeldLockFamily().fill(sheet, cell)
    return sheet


def test_a_cell_whose_readings_caught_no_busy_session_borrows_its_variants() -> None:
    """A transaction's locks are its plan's: at 8 clients three readings caught no session
    holding locks, the 2-client cell's did; the peak cell still gets the figures, and says so."""
    sheet = _held_lock_facts(_analysis(caught_at_8=0))
    per_backend = sheet.get("locks.per_backend")
    assert per_backend is not None and per_backend.value == 129.0
    assert "at any client count of generic" in per_backend.label
    assert sheet.facts["locks.table.orders"].value == 129.0


def test_a_cell_that_caught_sessions_speaks_for_itself() -> None:
    sheet = _held_lock_facts(_analysis(caught_at_8=1))
    per_backend = sheet.get("locks.per_backend")
    assert per_backend is not None and "at 8 clients" in per_backend.label
    assert sheet.facts["locks.sessions_seen"].value == 1
