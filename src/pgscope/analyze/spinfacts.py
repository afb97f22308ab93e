"""Facts about user-space hot spots in a cell's on-CPU profile: PostgreSQL's spin loops
(`cpu.spin`: s_lock, perform_spin_delay) and the snapshot (`cpu.snapshot`: GetSnapshotData),
each as the share of the cluster's on-CPU samples with it on the stack, and the function that
called most of it (`cpu.spin_caller.<function>`, `cpu.snapshot_caller.<function>`: its share
of those samples), which the label names and the rules put in their titles.

On the stack, not as the leaf: a spinning process is in the loop (s_lock), in the delay
between tries (perform_spin_delay) or entering the sleep after them (pg_usleep, nanosleep),
and all of it is the spin's; a snapshot's cost includes taking ProcArrayLock under it.

From the `cpu` section (the perf collector).
"""

from __future__ import annotations

from pgscope.analyze.model import FactSheet, RunAnalysis
from pgscope.analyze.profile import HotSpot
from pgscope.words import n_clients

SOURCE = "perf"


def hot_spot_facts(sheet: FactSheet, analysis: RunAnalysis, variant: str, n: int) -> None:
    cell = next((p for p in analysis.cpu.profiles if p.variant == variant and p.clients == n), None)
    if cell is None or not cell.functions.total:
        return
    total = cell.functions.total
    sheet.add(
        "cpu.samples",
        total,
        "count",
        SOURCE,
        f"on-CPU samples of the cluster's processes at {n_clients(n)}",
    )
    for key, spot, what, of_them in (
        (
            "spin",
            cell.spin,
            "spinning for a spinlock another process holds (s_lock, perform_spin_delay)",
            "the spinning samples",
        ),
        ("snapshot", cell.snapshot, "taking snapshots (GetSnapshotData)", "the snapshot samples"),
    ):
        if spot is not None:  # None: a summary written before hot spots were read
            _spot_facts(sheet, key, spot, total, what, of_them, n)


def _spot_facts(
    sheet: FactSheet, key: str, spot: HotSpot, total: int, what: str, of_them: str, n: int
) -> None:
    top = spot.sites[0] if spot.sites else None
    called = ""
    if top is not None and spot.value:
        via = f", under {top.via}" if top.via else ""
        called = f"; {top.value / spot.value:.0%} of them called from {top.caller}{via}"
    sheet.add(
        f"cpu.{key}",
        spot.value / total,
        "share",
        SOURCE,
        f"on-CPU samples {what} at {n_clients(n)}{called}",
    )
    if top is not None and spot.value:
        via = f" (itself called from {top.via})" if top.via else ""
        sheet.add(
            f"cpu.{key}_caller.{top.caller}",
            top.value / spot.value,
            "share",
            SOURCE,
            f"share of {of_them} called from {top.caller}{via} at {n_clients(n)}",
        )
