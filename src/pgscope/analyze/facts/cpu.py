"""The cell's on-CPU profile (the perf collector): time in the kernel and in its lock slow
paths, on the statement-logging path, and the user-space hot spots: PostgreSQL's spin loops
(`cpu.spin`: s_lock, perform_spin_delay) and the snapshot (`cpu.snapshot`: GetSnapshotData),
each as the share of the cluster's on-CPU samples with it on the stack, and the function that
called most of it (`cpu.spin_caller.<function>`, `cpu.snapshot_caller.<function>`: its share
of those samples), which the label names and the rules put in their titles.

On the stack, not as the leaf: a spinning process is in the loop (s_lock), in the delay
between tries (perform_spin_delay) or entering the sleep after them (pg_usleep, nanosleep),
and all of it is the spin's; a snapshot's cost includes taking ProcArrayLock under it."""

from __future__ import annotations

from pgscope.analyze.facts import CellFacts, FactKind, FactSheet, Family
from pgscope.analyze.model import ProfileCell
from pgscope.analyze.profile import HotSpot

PERF = "the perf collector"
SOURCES = ("perf",)
# Functions on the statement-logging path (its user-space part, and this kernel's pipe write).
LOGGING_FUNCTIONS = frozenset(
    {
        "errfinish",
        "EmitErrorReport",
        "send_message_to_server_log",
        "write_pipe_chunks",
        "write_syslogger_file",
        "pipe_write_[k]",
        "anon_pipe_write_[k]",
    }
)
KERNEL_LOCK = FactKind(
    "cpu.kernel_lock", "share", "on-CPU samples in kernel mutex/spinlock slow paths", PERF, SOURCES
)
KERNEL = FactKind("cpu.kernel", "share", "on-CPU samples in the kernel", PERF, SOURCES)
LOGGING_PATH = FactKind(
    "cpu.logging_path",
    "share",
    "on-CPU samples under the statement-logging path (errfinish, pipe writes)",
    PERF,
    SOURCES,
)
SAMPLES = FactKind(
    "cpu.samples", "count", "on-CPU samples of the cluster's processes", PERF, SOURCES
)
SPIN = FactKind(
    "cpu.spin",
    "share",
    "on-CPU samples spinning for a spinlock another process holds (s_lock, perform_spin_delay)",
    PERF,
    SOURCES,
)
SNAPSHOT = FactKind(
    "cpu.snapshot", "share", "on-CPU samples taking snapshots (GetSnapshotData)", PERF, SOURCES
)
SPIN_CALLER = FactKind(
    "cpu.spin_caller.<function>",
    "share",
    "share of the spinning samples called from a function",
    PERF,
    SOURCES,
)
SNAPSHOT_CALLER = FactKind(
    "cpu.snapshot_caller.<function>",
    "share",
    "share of the snapshot samples called from a function",
    PERF,
    SOURCES,
)


def profile_cell(cell: CellFacts) -> ProfileCell | None:
    """The cell's on-CPU profile, None where it has none (or no sample)."""
    found = next((p for p in cell.analysis.cpu.profiles if cell.owns(p)), None)
    return found if found is not None and found.functions.total else None


class CpuFamily(Family):
    name = "cpu"
    order = 80

    def fill(self, sheet: FactSheet, cell: CellFacts) -> None:
        profile = profile_cell(cell)
        if profile is None:
            return
        table = profile.functions
        sheet.add(KERNEL_LOCK, table.kernel_lock_share, KERNEL_LOCK.label)
        sheet.add(KERNEL, table.kernel_share, KERNEL.label)
        logging = max(
            (v for f, v in table.total_values.items() if f in LOGGING_FUNCTIONS), default=0
        )
        sheet.add(LOGGING_PATH, logging / table.total, LOGGING_PATH.label)
        total = table.total
        sheet.add(SAMPLES, total, f"{SAMPLES.label} {cell.where}")
        for kind, caller, spot, of_them in (
            (SPIN, SPIN_CALLER, profile.spin, "the spinning samples"),
            (SNAPSHOT, SNAPSHOT_CALLER, profile.snapshot, "the snapshot samples"),
        ):
            if spot is not None:  # None: a summary written before hot spots were read
                _spot(sheet, kind, caller, spot, total, of_them, cell.where)


def _spot(
    sheet: FactSheet,
    kind: FactKind,
    caller: FactKind,
    spot: HotSpot,
    total: int,
    of_them: str,
    where: str,
) -> None:
    top = spot.sites[0] if spot.sites else None
    called = ""
    if top is not None and spot.value:
        via = f", under {top.via}" if top.via else ""
        called = f"; {top.value / spot.value:.0%} of them called from {top.caller}{via}"
    sheet.add(kind, spot.value / total, f"{kind.label} {where}{called}")
    if top is not None and spot.value:
        via = f" (itself called from {top.via})" if top.via else ""
        sheet.add(
            caller,
            top.value / spot.value,
            f"share of {of_them} called from {top.caller}{via} {where}",
            thing=top.caller,
        )
