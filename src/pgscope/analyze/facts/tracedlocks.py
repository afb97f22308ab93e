"""LWLock and heavyweight-lock waits from kernel-side tracing (the usdt collector), as a share
of the sessions' active time (Little's law: wait time per second is the average number of
sessions waiting), per transaction, and mean; then the LWLock hot spot from the best source:
traced time where the lwlock program ran, the sampled share otherwise."""

from __future__ import annotations

from pgscope.analyze.facts import CellFacts, FactKind, FactSheet, Family
from pgscope.analyze.facts.waits import cell_profile
from pgscope.analyze.model import Fact
from pgscope.analyze.usdt import LatencySummary
from pgscope.words import n_clients

LWLOCK = "the usdt collector's lwlock program"
LOCKS = "the usdt collector's locks program"
USDT = ("usdt",)
LWLOCK_TRACED = FactKind(
    "lwlock.traced_share",
    "share",
    "LWLock wait time (kernel-side tracing) as a share of active time",
    LWLOCK,
    USDT,
)
LOCK_TRACED = FactKind(
    "lock.traced_share",
    "share",
    "heavyweight lock wait time (kernel-side tracing) as a share of active time",
    LOCKS,
    USDT,
)
LWLOCK_SHARE = FactKind(
    "lwlock.share.<tranche>",
    "share",
    "an LWLock tranche's wait time (traced), share of active time",
    LWLOCK,
    USDT,
)
LOCK_SHARE = FactKind(
    "lock.share.<type>",
    "share",
    "a lock type's wait time (traced), share of active time",
    LOCKS,
    USDT,
)
LWLOCK_PER_XACT = FactKind(
    "lwlock.waits_per_xact.<tranche>",
    "count",
    "an LWLock tranche's waits per transaction (traced)",
    LWLOCK,
    USDT,
)
LOCK_PER_XACT = FactKind(
    "lock.waits_per_xact.<type>",
    "count",
    "a lock type's waits per transaction (traced)",
    LOCKS,
    USDT,
)
LWLOCK_MEAN = FactKind(
    "lwlock.mean_us.<tranche>", "µs", "an LWLock tranche's mean wait (traced)", LWLOCK, USDT
)
LOCK_MEAN = FactKind("lock.mean_us.<type>", "µs", "a lock type's mean wait (traced)", LOCKS, USDT)
TOP_NEEDS = "the usdt collector's lwlock program or the activity collector"
TOP_SOURCES = ("usdt", "activity")
TOP = FactKind(
    "lwlock.top",
    "share",
    "the most waited-for LWLock tranche's share of active time",
    TOP_NEEDS,
    TOP_SOURCES,
)
TOP_OF = FactKind(
    "lwlock.top.<tranche>",
    "share",
    "the most waited-for LWLock tranche's share, named",
    TOP_NEEDS,
    TOP_SOURCES,
)
TOP_PER_XACT = FactKind(
    "lwlock.top_waits_per_xact",
    "count",
    "the top tranche's waits per transaction (traced)",
    LWLOCK,
    USDT,
)
TOP_MEAN = FactKind(
    "lwlock.top_mean_us", "µs", "the top tranche's mean wait (traced)", LWLOCK, USDT
)
_KINDS = {
    "lwlock": (LWLOCK_TRACED, LWLOCK_SHARE, LWLOCK_PER_XACT, LWLOCK_MEAN, "LWLock"),
    "lock": (LOCK_TRACED, LOCK_SHARE, LOCK_PER_XACT, LOCK_MEAN, "heavyweight lock"),
}


class TracedLockFamily(Family):
    name = "tracedlocks"
    order = 90

    def fill(self, sheet: FactSheet, cell: CellFacts) -> None:
        n = cell.clients
        traced = next((c for c in cell.analysis.locks.by_cell if cell.owns(c)), None)
        if traced is not None and traced.seconds > 0:
            sampled = cell_profile(cell)
            # Active time: the sampled average active sessions where sampling ran; otherwise
            # the clients' whole session time (every client active: a lower bound of the share).
            if sampled is not None and sampled.aas > 0:
                sessions, of_what = sampled.aas, "active time"
            else:
                sessions, of_what = float(n), "the clients' session time"
            active_ns = sessions * traced.seconds * 1e9
            xacts = traced.xacts
            where = f"{of_what} {cell.where}"
            for key, summaries in (("lwlock", traced.lwlocks), ("lock", traced.lock_waits)):
                whole, share, per_xact, mean, what = _KINDS[key]
                objects = _by_object(summaries)
                total_ns = sum(ns for _, ns in objects.values())
                sheet.add(
                    whole,
                    min(1.0, total_ns / active_ns),
                    f"{what} wait time (kernel-side tracing) as a share of {where}",
                )
                for obj, (count, ns) in objects.items():
                    sheet.add(
                        share,
                        min(1.0, ns / active_ns),
                        f"{what} {obj}: wait time (traced) as a share of {where}",
                        thing=obj,
                    )
                    if xacts:
                        sheet.add(
                            per_xact,
                            count / xacts,
                            f"{what} {obj}: waits per transaction (traced) {cell.where}",
                            thing=obj,
                        )
                    if count:
                        sheet.add(
                            mean,
                            ns / count / 1000,
                            f"{what} {obj}: mean wait (traced) {cell.where}",
                            thing=obj,
                        )
        lwlock_top(sheet, n, traced is not None and traced.seconds > 0)


def _by_object(summaries: list[LatencySummary]) -> dict[str, tuple[int, int]]:
    """(waits, total ns) per object (tranche, lock type), over its modes."""
    out: dict[str, tuple[int, int]] = {}
    for s in summaries:
        count, total = out.get(s.object or "?", (0, 0))
        out[s.object or "?"] = (count + s.count, total + s.total_ns)
    return out


def lwlock_top(sheet: FactSheet, n: int, traced: bool) -> None:
    """`lwlock.top` (and `lwlock.top.<tranche>`): the most waited-for LWLock tranche's share
    of active time, from traced time where tracing ran, else from sampling; its source says
    which."""
    prefix = LWLOCK_SHARE.prefix if traced else "wait.lwlock_top."
    candidates = [f for name, f in sheet.facts.items() if name.startswith(prefix)]
    if not candidates:
        if traced:  # traced, and no LWLock wait at all
            sheet.add(TOP, 0.0, f"LWLock wait time at {n_clients(n)}", source="usdt")
        return
    top = max(candidates, key=lambda f: f.value)
    tranche = top.name.rsplit(".", 1)[-1]
    how = "traced in the kernel" if traced else "sampled"
    of = "active time" if "active time" in top.label else "session time"
    label = (
        f"LWLock:{tranche}, the most waited-for tranche ({how}): share of {of} at {n_clients(n)}"
    )
    sheet.add(TOP, top.value, label, source=top.source)
    sheet.add(TOP_OF, top.value, label, thing=tranche, source=top.source)
    for kind, copy in ((LWLOCK_PER_XACT, TOP_PER_XACT), (LWLOCK_MEAN, TOP_MEAN)):
        found = sheet.get(kind.of(tranche))
        if found is not None:
            sheet.put(Fact(copy.name, found.value, found.unit, found.source, found.label))
