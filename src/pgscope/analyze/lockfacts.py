"""Facts about the relation locks the workload's transactions hold, per cell: how many
relations a busy session has locked against the 16 fast-path slots, the share of lock entries
that went to the shared lock table, and which table (a partition tree by its root) they are
in; and what taking them costs, from the best source at hand: the LockManager LWLock's traced
or sampled share of active time, and the CPU spent in the lock manager where it was profiled.

From the `held_locks` section (the pglocks collector) and facts already on the sheet (the
wait, tracing and profile facts), so it runs after them.
"""

from __future__ import annotations

from collections import defaultdict

from pgscope.analyze.heldlocks import FASTPATH_SLOTS
from pgscope.analyze.model import FactSheet, RunAnalysis
from pgscope.words import n_clients

SOURCE = "pglocks"
# Inclusive on-CPU time in these is the heavyweight lock manager's: taking a lock (fast path
# or the shared table with its partition LWLock) and releasing one or all at transaction end.
LOCK_MANAGER_FUNCTIONS = ("LockAcquireExtended", "LockRelease", "LockReleaseAll")


def lock_facts(sheet: FactSheet, analysis: RunAnalysis, variant: str, n: int) -> None:
    _held_facts(sheet, analysis, variant, n)
    _cpu_fact(sheet, analysis, variant, n)
    _manager_fact(sheet, n)


def _held_facts(sheet: FactSheet, analysis: RunAnalysis, variant: str, n: int) -> None:
    section = analysis.held_locks
    if not section.read:
        return
    steps = {s.step_id for s in analysis.steps if s.variant == variant and s.clients == n}
    held = [h for h in section.steps if h.step_id in steps]
    where = f"at {n_clients(n)}"
    if not sum(h.sessions for h in held):
        # A transaction's locks are its plan's, whatever the client count: where this cell's
        # few readings (one a second) caught no busy session, the variant's other cells do.
        steps = {s.step_id for s in analysis.steps if s.variant == variant}
        held = [h for h in section.steps if h.step_id in steps]
        where = f"at any client count of {variant}"
    readings = sum(h.readings for h in held)
    if not readings:
        return
    sessions = sum(h.sessions for h in held)
    seen = f"{sessions} busy session(s) caught in {readings} reading(s) of pg_locks {where}"
    sheet.add("locks.sessions_seen", sessions, "count", SOURCE, seen)
    if not sessions:
        return
    sheet.add(
        "locks.per_backend",
        sum(h.relations for h in held) / sessions,
        "count",
        SOURCE,
        f"relations locked by a busy session, on average, against {FASTPATH_SLOTS} fast-path "
        f"slots ({seen})",
    )
    fastpath = sum(h.fastpath for h in held)
    shared = sum(h.shared for h in held)
    if fastpath + shared:
        sheet.add(
            "locks.non_fastpath_share",
            shared / (fastpath + shared),
            "share",
            SOURCE,
            f"relation lock entries in the shared lock table rather than a session's "
            f"fast-path slots, {where}",
        )
    relations: dict[str, int] = defaultdict(int)
    partitions: dict[str, int] = defaultdict(int)
    for table in section.tables:
        if table.step_id in steps:
            relations[table.relname] += table.relations
            partitions[table.relname] = max(partitions[table.relname], table.partitions)
    for rel, count in relations.items():
        tree = f"{partitions[rel]} partitions" if partitions[rel] else "not partitioned"
        sheet.add(
            f"locks.table.{rel}",
            count / sessions,
            "count",
            SOURCE,
            f"relations of {rel} ({tree}) locked by a busy session, each partition and index "
            f"one, {where}",
        )


def _cpu_fact(sheet: FactSheet, analysis: RunAnalysis, variant: str, n: int) -> None:
    cell = next((p for p in analysis.cpu.profiles if p.variant == variant and p.clients == n), None)
    if cell is None or not cell.functions.total:
        return
    table = cell.functions
    inside = sum(table.total_values.get(f, 0) for f in LOCK_MANAGER_FUNCTIONS)
    sheet.add(
        "cpu.lock_manager",
        inside / table.total,
        "share",
        "perf",
        f"on-CPU samples taking and releasing heavyweight locks "
        f"({', '.join(LOCK_MANAGER_FUNCTIONS)}) at {n_clients(n)}",
    )


def _manager_fact(sheet: FactSheet, n: int) -> None:
    """`locks.manager_share`: the LockManager LWLock's share of active time, traced where
    the lwlock program ran (every wait, timed), else sampled; a tranche never seen waiting
    counts 0 where either measured. `locks.manager_cpu`: where the CPU was profiled, the
    time on CPU in the lock manager as a share of active time too (its share of the CPU
    samples times the sessions' on-CPU share of active time), so the two add up."""
    cpu, on_cpu = sheet.get("cpu.lock_manager"), sheet.get("wait.class.CPU")
    if cpu is not None and on_cpu is not None:
        sheet.add(
            "locks.manager_cpu",
            cpu.value * on_cpu.value,
            "share",
            "perf",
            f"on CPU taking and releasing heavyweight locks: share of active time at {n} "
            f"clients ({cpu.shown()} of the CPU samples, {on_cpu.shown()} of active time on CPU)",
        )
    traced = sheet.get("lwlock.traced_share")
    if traced is not None:
        share = sheet.get("lwlock.share.LockManager")
        value, source, how = (share.value if share else 0.0), "usdt", "traced in the kernel"
    elif sheet.get("wait.aas") is not None:
        share = sheet.get("wait.share.LWLock:LockManager")
        value, source, how = (share.value if share else 0.0), "activity", "sampled"
    else:
        return
    sheet.add(
        "locks.manager_share",
        value,
        "share",
        source,
        f"LWLock:LockManager waits (the shared lock table's partitions, {how}): share of "
        f"active time at {n_clients(n)}",
    )
