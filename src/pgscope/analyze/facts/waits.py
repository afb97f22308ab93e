"""The sampled wait profile's facts: each wait event's and class's share of active time, the
groups of events the rules speak of, how each class grew from the lowest client count, the
average active sessions, and what the client sessions were doing (idle, in a transaction)."""

from __future__ import annotations

from pgscope.analyze.facts import CellFacts, FactKind, FactSheet, Family
from pgscope.analyze.waits import Profile
from pgscope.words import n_clients

SAMPLING = "the activity collector"
SOURCES = ("activity",)
# Groups of wait events the rules speak of. The keys are fact names (`wait.<group>`).
WAIT_GROUPS: dict[str, tuple[str, ...]] = {
    "row_lock": ("Lock:transactionid", "Lock:tuple"),
    "object_lock": (
        "Lock:relation",
        "Lock:advisory",
        "Lock:extend",
        "Lock:object",
        "Lock:page",
        "Lock:userlock",
        "Lock:frozenid",
        "Lock:virtualxid",
    ),
    "advisory_lock": ("Lock:advisory",),
    "commit_flush": (
        "IO:WALSync",
        "IO:WALWrite",
        "LWLock:WALWrite",
        "IO:WALInitSync",
        "IO:WALInitWrite",
    ),
    # Writing WAL out, whether a commit waits for it or a backend for room in the WAL
    # buffers (full of WAL not yet written: WALBufMapping).
    "wal_io": (
        "IO:WALWrite",
        "IO:WALSync",
        "LWLock:WALWrite",
        "LWLock:WALBufMapping",
        "IO:WALInitWrite",
        "IO:WALInitSync",
    ),
    "syncrep": ("IPC:SyncRep",),
    "datafile_read": ("IO:DataFileRead", "IO:DataFilePrefetch"),
    "client_read": ("Client:ClientRead",),
    "client_write": ("Client:ClientWrite",),
}


def _events(events: tuple[str, ...]) -> str:
    return f"{' + '.join(events[:3])}{' …' if len(events) > 3 else ''}"


GROUPS = {
    group: FactKind(
        f"wait.{group}", "share", f"{_events(events)} share of active time", SAMPLING, SOURCES
    )
    for group, events in WAIT_GROUPS.items()
}
SHARE = FactKind(
    "wait.share.<event>", "share", "a wait event's share of active time", SAMPLING, SOURCES
)
CLASS = FactKind(
    "wait.class.<class>", "share", "a wait class's share of active time", SAMPLING, SOURCES
)
GROWTH = FactKind(
    "wait.growth.<class>",
    "share",
    "growth of a wait class's share of active time from the lowest client count",
    SAMPLING,
    SOURCES,
)
LWLOCK_TOP = FactKind(
    "wait.lwlock_top",
    "share",
    "the most waited-for LWLock tranche's share of active time",
    SAMPLING,
    SOURCES,
)
LWLOCK_TOP_OF = FactKind(
    "wait.lwlock_top.<tranche>",
    "share",
    "the most waited-for LWLock tranche's share of active time, named",
    SAMPLING,
    SOURCES,
)
AAS = FactKind("wait.aas", "count", "average active sessions", SAMPLING, SOURCES)
AAS_PER_CLIENT = FactKind(
    "wait.aas_per_client", "share", "average active sessions per client", SAMPLING, SOURCES
)
IDLE = FactKind(
    "sessions.idle",
    "share",
    "share of client sessions' samples idle (in or out of a transaction)",
    SAMPLING,
    SOURCES,
)
IDLE_IN_TRANSACTION = FactKind(
    "sessions.idle_in_transaction",
    "share",
    "share of client sessions' samples idle inside a transaction",
    SAMPLING,
    SOURCES,
)


class WaitFamily(Family):
    name = "waits"
    order = 30

    def fill(self, sheet: FactSheet, cell: CellFacts) -> None:
        profile = cell_profile(cell)
        if profile is None:
            return
        waits = cell.analysis.waits
        assert waits is not None
        # Growth from the sweep's lowest client count (closed loop), for an open-loop cell too.
        by_clients = {
            p.clients: p.profile
            for p in waits.by_clients
            if p.variant == cell.variant and p.rate is None
        }
        lowest = min(by_clients, default=None)
        low = (
            (lowest, by_clients[lowest])
            if lowest is not None and (lowest < cell.clients or cell.rate is not None)
            else None
        )
        to = cell.where.removeprefix("at ") if cell.rate is not None else None
        profile_facts(sheet, profile, cell.clients, cell.where, low, to)


def cell_profile(cell: CellFacts) -> Profile | None:
    """The cell's sampled wait profile (None: not sampled; sampled but never active counts)."""
    waits = cell.analysis.waits
    if waits is None:
        return None
    profile = next((p.profile for p in waits.by_clients if cell.owns(p)), None)
    return profile if profile is not None and profile.samples else None


def profile_facts(
    sheet: FactSheet,
    profile: Profile,
    n: int,
    where: str,
    low: tuple[int, Profile] | None = None,
    to: str | None = None,
) -> None:
    """The facts of one wait profile of `n` sessions (`where`: "at 8 clients", "in window 7"),
    with each class's growth from the `low` (clients, profile) where there is one."""
    for entry in profile.entries:
        sheet.add(
            SHARE, entry.share, f"{entry.label} share of active time {where}", thing=entry.label
        )
    for cls, share in profile.class_shares().items():
        sheet.add(CLASS, share, f"{cls} waits' share of active time {where}", thing=cls)
    for group, events in WAIT_GROUPS.items():
        total = sum(e.share for e in profile.entries if e.label in events)
        sheet.add(GROUPS[group], total, f"{GROUPS[group].label} {where}")
    lwlocks = [e for e in profile.entries if e.wait_event_type == "LWLock"]
    if lwlocks:
        top = max(lwlocks, key=lambda e: e.share)
        sheet.add(
            LWLOCK_TOP,
            top.share,
            f"LWLock:{top.wait_event}, the most waited-for LWLock tranche, {where}",
        )
        sheet.add(
            LWLOCK_TOP_OF,
            top.share,
            f"LWLock:{top.wait_event} share of active time {where}",
            thing=top.wait_event,
        )
    sheet.add(AAS, profile.aas, f"average active sessions {where}")
    sheet.add(AAS_PER_CLIENT, profile.aas / n, f"average active sessions per client {where}")
    states = profile.states
    sheet.add(
        IDLE,
        states.get("idle", 0.0) + states.get("idle in transaction", 0.0),
        f"{IDLE.label} {where}",
    )
    sheet.add(
        IDLE_IN_TRANSACTION,
        states.get("idle in transaction", 0.0),
        f"{IDLE_IN_TRANSACTION.label} {where}",
    )
    if low is not None:
        lowest, low_profile = low
        low_classes = low_profile.class_shares()
        for cls, share in profile.class_shares().items():
            sheet.add(
                GROWTH,
                share - low_classes.get(cls, 0.0),
                f"growth of {cls}'s share of active time from {lowest} to {to or n_clients(n)}",
                thing=cls,
            )
