"""Facts about the relation locks the workload's transactions hold, per cell: how many
relations a busy session has locked against the 16 fast-path slots, the share of lock entries
that went to the shared lock table, and which table (a partition tree by its root) they are
in; and what taking them costs, from the best source at hand: the LockManager LWLock's traced
or sampled share of active time, and the CPU spent in the lock manager where it was profiled.

From the `held_locks` section (the pglocks collector) and facts already on the sheet (the
wait, tracing and profile facts), so it comes after those families.
"""

from __future__ import annotations

from collections import defaultdict

from pgscope.analyze.facts import CellFacts, FactKind, FactSheet, Family
from pgscope.analyze.facts.cpu import profile_cell
from pgscope.analyze.facts.tracedlocks import LWLOCK_SHARE, LWLOCK_TRACED
from pgscope.analyze.facts.waits import AAS, CLASS, SHARE
from pgscope.analyze.heldlocks import FASTPATH_SLOTS
from pgscope.words import n_clients

PGLOCKS = "the pglocks collector, and its readings catching sessions that hold locks"
SOURCES = ("pglocks",)
# Inclusive on-CPU time in these is the heavyweight lock manager's: taking a lock (fast path
# or the shared table with its partition LWLock) and releasing one or all at transaction end.
LOCK_MANAGER_FUNCTIONS = ("LockAcquireExtended", "LockRelease", "LockReleaseAll")

SESSIONS_SEEN = FactKind(
    "locks.sessions_seen",
    "count",
    "busy sessions caught in the readings of pg_locks",
    PGLOCKS,
    SOURCES,
)
PER_BACKEND = FactKind(
    "locks.per_backend",
    "count",
    f"relations locked by a busy session, on average, against {FASTPATH_SLOTS} fast-path slots",
    PGLOCKS,
    SOURCES,
)
NON_FASTPATH = FactKind(
    "locks.non_fastpath_share",
    "share",
    "relation lock entries in the shared lock table rather than a session's fast-path slots",
    PGLOCKS,
    SOURCES,
)
TABLE = FactKind(
    "locks.table.<table>",
    "count",
    "relations of a table (its partitions and indexes) locked by a busy session",
    PGLOCKS,
    SOURCES,
)
CPU_LOCK_MANAGER = FactKind(
    "cpu.lock_manager",
    "share",
    f"on-CPU samples taking and releasing heavyweight locks ({', '.join(LOCK_MANAGER_FUNCTIONS)})",
    "the perf collector",
    ("perf",),
)
MANAGER_CPU = FactKind(
    "locks.manager_cpu",
    "share",
    "on CPU taking and releasing heavyweight locks: share of active time",
    "the perf collector",
    ("perf",),
)
MANAGER_SHARE = FactKind(
    "locks.manager_share",
    "share",
    "LWLock:LockManager waits (the shared lock table's partitions): share of active time",
    "the activity collector or the usdt collector's lwlock program",
    ("usdt", "activity"),
)


class HeldLockFamily(Family):
    name = "heldlocks"
    order = 120

    def fill(self, sheet: FactSheet, cell: CellFacts) -> None:
        _held_facts(sheet, cell)
        _cpu_fact(sheet, cell)
        _manager_fact(sheet, cell.clients)


def _held_facts(sheet: FactSheet, cell: CellFacts) -> None:
    analysis, variant = cell.analysis, cell.variant
    section = analysis.held_locks
    if not section.read:
        return
    steps = cell.step_ids
    held = [h for h in section.steps if h.step_id in steps]
    where = cell.where
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
    sheet.add(SESSIONS_SEEN, sessions, seen)
    if not sessions:
        return
    sheet.add(
        PER_BACKEND,
        sum(h.relations for h in held) / sessions,
        f"relations locked by a busy session, on average, against {FASTPATH_SLOTS} fast-path "
        f"slots ({seen})",
    )
    fastpath = sum(h.fastpath for h in held)
    shared = sum(h.shared for h in held)
    if fastpath + shared:
        sheet.add(
            NON_FASTPATH,
            shared / (fastpath + shared),
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
            TABLE,
            count / sessions,
            f"relations of {rel} ({tree}) locked by a busy session, each partition and index "
            f"one, {where}",
            thing=rel,
        )


def _cpu_fact(sheet: FactSheet, cell: CellFacts) -> None:
    profile = profile_cell(cell)
    if profile is None:
        return
    table = profile.functions
    inside = sum(table.total_values.get(f, 0) for f in LOCK_MANAGER_FUNCTIONS)
    sheet.add(CPU_LOCK_MANAGER, inside / table.total, f"{CPU_LOCK_MANAGER.label} {cell.where}")


def _manager_fact(sheet: FactSheet, n: int) -> None:
    """`locks.manager_share`: the LockManager LWLock's share of active time, traced where
    the lwlock program ran (every wait, timed), else sampled; a tranche never seen waiting
    counts 0 where either measured. `locks.manager_cpu`: where the CPU was profiled, the
    time on CPU in the lock manager as a share of active time too (its share of the CPU
    samples times the sessions' on-CPU share of active time), so the two add up."""
    cpu, on_cpu = sheet.get(CPU_LOCK_MANAGER.name), sheet.get(CLASS.of("CPU"))
    if cpu is not None and on_cpu is not None:
        sheet.add(
            MANAGER_CPU,
            cpu.value * on_cpu.value,
            f"on CPU taking and releasing heavyweight locks: share of active time at {n} "
            f"clients ({cpu.shown()} of the CPU samples, {on_cpu.shown()} of active time on CPU)",
        )
    traced = sheet.get(LWLOCK_TRACED.name)
    if traced is not None:
        share = sheet.get(LWLOCK_SHARE.of("LockManager"))
        value, source, how = (share.value if share else 0.0), "usdt", "traced in the kernel"
    elif sheet.get(AAS.name) is not None:
        share = sheet.get(SHARE.of("LWLock:LockManager"))
        value, source, how = (share.value if share else 0.0), "activity", "sampled"
    else:
        return
    sheet.add(
        MANAGER_SHARE,
        value,
        f"LWLock:LockManager waits (the shared lock table's partitions, {how}): share of "
        f"active time at {n_clients(n)}",
        source=source,
    )
