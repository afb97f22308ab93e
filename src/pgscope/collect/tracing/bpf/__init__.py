"""pgscope's bpftrace programs: their files, what they read, and what their numbers mean.

Each `.bt` file here answers one question and says in its header what it traces, what it
costs and what it prints. This module is their catalogue for the usdt collector: which
probes and arguments each program relies on (verified against a binary's USDT notes before
anything runs), which printed maps become which store rows, and the names behind the numbers
PostgreSQL passes (LWLock modes, lock tag types and modes, checkpoint flags and phases).
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources.abc import Traversable

from pgscope.collect.tracing.elfprobes import UsdtProbe


@dataclass(frozen=True)
class LatencySeries:
    """A histogram map and its sum map: usdt_latency(+_hist) rows of one event."""

    event: str  # lwlock_wait, lock_wait, smgr_read, ...
    hist_map: str
    sum_map: str
    hist_unit_ns: int  # 1000 where the program histograms microseconds
    key_parts: int  # fields in the map's key; 0 for an unkeyed map


@dataclass(frozen=True)
class CounterSeries:
    """A count() map: usdt_counters rows."""

    map_name: str
    counter: str


@dataclass(frozen=True)
class Program:
    name: str
    file: str
    # probe -> {argument index: size in bytes} the program reads from it
    probes: Mapping[str, Mapping[int, int]]
    latency: tuple[LatencySeries, ...] = ()
    counters: tuple[CounterSeries, ...] = ()

    def source(self) -> Traversable:
        return importlib.resources.files(__name__).joinpath(self.file)


PROGRAMS: dict[str, Program] = {
    "lwlock": Program(
        "lwlock",
        "lwlock.bt",
        {"lwlock__wait__start": {}, "lwlock__wait__done": {0: 8, 1: 4}},
        (LatencySeries("lwlock_wait", "@wait_us", "@wait_ns", 1000, 2),),
    ),
    "lwlock_hold": Program(
        "lwlock_hold",
        "lwlock_hold.bt",
        {
            "lwlock__acquire": {0: 8, 1: 4},
            "lwlock__condacquire": {0: 8, 1: 4},
            "lwlock__acquire__or__wait": {0: 8, 1: 4},
            "lwlock__release": {0: 8},
        },
        (LatencySeries("lwlock_hold", "@hold_ns_hist", "@hold_ns", 1, 2),),
    ),
    "locks": Program(
        "locks",
        "locks.bt",
        {"lock__wait__start": {}, "lock__wait__done": {4: 1, 5: 4}, "deadlock__found": {}},
        (LatencySeries("lock_wait", "@wait_us", "@wait_ns", 1000, 2),),
        (CounterSeries("@deadlocks", "deadlocks"),),
    ),
    "checkpoint": Program(
        "checkpoint",
        "checkpoint.bt",
        {
            "checkpoint__start": {0: 4},
            "buffer__checkpoint__start": {0: 4},
            "clog__checkpoint__start": {},
            "clog__checkpoint__done": {},
            "subtrans__checkpoint__start": {},
            "subtrans__checkpoint__done": {},
            "multixact__checkpoint__start": {},
            "multixact__checkpoint__done": {},
            "buffer__sync__start": {0: 4, 1: 4},
            "buffer__flush__start": {},
            "buffer__flush__done": {},
            "buffer__sync__written": {},
            "buffer__sync__done": {1: 4, 2: 4},
            "buffer__checkpoint__sync__start": {},
            "buffer__checkpoint__done": {},
            "twophase__checkpoint__start": {},
            "twophase__checkpoint__done": {},
            "checkpoint__done": {},
        },
        counters=(CounterSeries("@written", "checkpoint_buffers_written"),),
    ),
    "io": Program(
        "io",
        "io.bt",
        {
            "smgr__md__read__start": {},
            "smgr__md__read__done": {},
            "smgr__md__write__start": {},
            "smgr__md__write__done": {},
            "buffer__read__done": {},
            "wal__insert": {},
            "wal__buffer__write__dirty__start": {},
            "wal__buffer__write__dirty__done": {},
            "transaction__start": {},
            "transaction__commit": {},
            "transaction__abort": {},
        },
        (
            LatencySeries("smgr_read", "@read_us", "@read_ns", 1000, 0),
            LatencySeries("smgr_write", "@write_us", "@write_ns", 1000, 0),
            LatencySeries("wal_dirty_write", "@wal_dirty_us", "@wal_dirty_ns", 1000, 0),
        ),
        (
            CounterSeries("@buffer_reads", "buffer_accesses"),
            CounterSeries("@wal_inserts", "wal_inserts"),
            CounterSeries("@xact_start", "xact_start"),
            CounterSeries("@xact_commit", "xact_commit"),
            CounterSeries("@xact_abort", "xact_abort"),
        ),
    ),
}


def argument_problems(program: Program, probes: list[UsdtProbe]) -> list[str]:
    """Why `program` cannot read what it needs from these probes (empty: it can).

    Every site of each probe must pass each argument the program reads at the size it
    expects, and not as a %rip-relative operand: bpftrace 0.17 resolves those against the
    wrong base in a position-independent binary and reads garbage (checkpoint__done's
    arguments are such operands in Debian's PostgreSQL 15, so checkpoint.bt reads none).
    """
    sites: dict[str, list[list[str]]] = {}
    for probe in probes:
        if probe.provider == "postgresql":
            sites.setdefault(probe.name, []).append(probe.arguments.split())
    problems = []
    for name, wanted in program.probes.items():
        if name not in sites:
            problems.append(f"probe {name} is missing")
            continue
        for args in sites[name]:
            for index, size in wanted.items():
                if index >= len(args):
                    problems.append(f"probe {name} has no argument {index}")
                    continue
                spec_size, _, operand = args[index].partition("@")
                if abs(int(spec_size or 0)) != size:
                    problems.append(
                        f"probe {name} argument {index} is {args[index]!r}, not {size} bytes"
                    )
                elif "(%rip)" in operand:
                    problems.append(
                        f"probe {name} argument {index} is {args[index]!r}, a %rip-relative "
                        f"operand bpftrace 0.17 misreads"
                    )
    return sorted(set(problems))


# -- what the numbers mean ------------------------------------------------------------------

LWLOCK_MODES = {0: "exclusive", 1: "shared", 2: "wait_until_free"}
LOCK_MODES = {
    1: "AccessShareLock",
    2: "RowShareLock",
    3: "RowExclusiveLock",
    4: "ShareUpdateExclusiveLock",
    5: "ShareLock",
    6: "ShareRowExclusiveLock",
    7: "ExclusiveLock",
    8: "AccessExclusiveLock",
}
# LockTagType as pg_locks.locktype names it; PostgreSQL 13 inserted frozenid as number 2.
LOCK_TYPES = (
    "relation",
    "extend",
    "frozenid",
    "page",
    "tuple",
    "transactionid",
    "virtualxid",
    "spectoken",
    "object",
    "userlock",
    "advisory",
)
_LOCK_TYPES_12 = tuple(t for t in LOCK_TYPES if t != "frozenid")
# Checkpoint request flags, in the words and order of the server log (log_checkpoints).
_CHECKPOINT_FLAGS = (
    (0x0001, "shutdown"),
    (0x0002, "end-of-recovery"),
    (0x0004, "immediate"),
    (0x0008, "force"),
    (0x0020, "wait"),
    (0x0080, "wal"),
    (0x0100, "time"),
    (0x0010, "flush-all"),
)


def lwlock_mode_name(code: int) -> str:
    return LWLOCK_MODES.get(code, f"mode {code}")


def lock_mode_name(code: int) -> str:
    return LOCK_MODES.get(code, f"mode {code}")


def lock_type_name(code: int, server_version_num: int) -> str:
    """0 for an unknown version reads as the newest numbering."""
    names = _LOCK_TYPES_12 if 0 < server_version_num < 130000 else LOCK_TYPES
    return names[code] if 0 <= code < len(names) else f"type {code}"


def checkpoint_flags_text(flags: int) -> str:
    return " ".join(name for bit, name in _CHECKPOINT_FLAGS if flags & bit)


# (phase, start events, end events): a phase runs from the latest of its start events seen
# to the earliest of its end events seen. PostgreSQL 14 moved buffer__checkpoint__start
# before the SLRU steps; the bounds hold for both orders. "marking" includes
# CheckPointPredicate, "finish" the checkpoint's WAL record, the control file and the
# recycling of WAL segments (no probes inside).
CHECKPOINT_PHASES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("prepare", ("start",), ("buffer_start", "clog_start")),
    ("clog", ("clog_start",), ("clog_done",)),
    ("subtrans", ("subtrans_start",), ("subtrans_done",)),
    ("multixact", ("multixact_start",), ("multixact_done",)),
    ("marking", ("multixact_done", "buffer_start"), ("sync_start",)),
    ("write", ("sync_start",), ("sync_done",)),
    ("sync", ("fsync_start",), ("fsync_done",)),
    ("twophase", ("twophase_start",), ("twophase_done",)),
    ("finish", ("fsync_done", "twophase_done"), ("done",)),
)


def checkpoint_phases(events: Mapping[str, int]) -> list[tuple[str, int, int]]:
    """(phase, start, end) of each phase whose bounds were seen, in checkpoint order. A
    checkpoint with nothing to write has no marking and write phases: BufferSync returns
    before its probes."""
    phases = []
    for phase, starts, ends in CHECKPOINT_PHASES:
        begin = [events[e] for e in starts if e in events]
        finish = [events[e] for e in ends if e in events]
        if begin and finish and min(finish) >= max(begin):
            phases.append((phase, max(begin), min(finish)))
    return phases
