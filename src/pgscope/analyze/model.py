"""The analysis of one run, as one frozen, typed model.

`load.py` builds it, and is the only code that reads a run store. Everything downstream reads
it and nothing else: the facts (pure functions of it, per cell), the diagnosis, `compare`, and
every renderer (console, text, JSON, HTML). Its JSON form (`to_document`) is the run's
`summary.json` and `report --format json`: one key per report section, so the HTML report can
be rendered from that file alone (`from_document`).

This module defines the shapes only; it imports the section types of the analyses that fill
them and nothing that imports it back.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from pgscope.analyze.account import Account, account_of
from pgscope.analyze.capacity import CapacityAnalysis, Schedule
from pgscope.analyze.compare import Comparison
from pgscope.analyze.heldlocks import HeldLocks
from pgscope.analyze.observation import Observation
from pgscope.analyze.pgstats import StepStats, XidUse
from pgscope.analyze.profile import FlameGraph, FunctionTable, HotSpot
from pgscope.analyze.scaling import ScalingAnalysis
from pgscope.analyze.statements import Statements
from pgscope.analyze.timeline import Dip, Series
from pgscope.analyze.usdt import Checkpoint, LatencySummary
from pgscope.analyze.waits import WaitAnalysis
from pgscope.words import plain

# 2: one key per report section (scalability, timeline, locks, checkpoints, cpu, variants,
# environment), facts per cell; 1 had the store's rows side by side.
DOCUMENT_VERSION = 2

# ---------------------------------------------------------------------------------------------
# Evidence: facts, and what the rules made of them


UNITS = frozenset(
    {"share", "ms", "µs", "tps", "ratio", "bytes", "bytes/s", "count", "clients", "coefficient",
     "yes/no"}
)  # fmt: skip


@dataclass(frozen=True)
class FactKind:
    """A kind of fact, declared once (in its family's module under `analyze/facts/`): its
    name, unit, what it is, what a run needs to measure it, and where it can come from. A
    kind whose name ends in `.<what>` is a set of facts, one per thing it names
    (`wait.share.<event>`: `wait.share.IO:WALSync`, ...)."""

    name: str
    unit: str
    label: str  # what it is, in words; a sheet's fact says it of its cell
    needs: str  # what a run needs to measure it (said when a rule cannot be assessed)
    sources: tuple[str, ...]  # the collectors or analyses it comes from, the usual first

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"fact {self.name}: unit {self.unit!r} is not one of {sorted(UNITS)}")

    @property
    def named(self) -> bool:
        """A set of facts, one per thing (an event, a table): its name ends in `.<what>`."""
        return self.name.endswith(">")

    @property
    def prefix(self) -> str:
        return self.name[: self.name.rindex("<")] if self.named else self.name

    def of(self, thing: str) -> str:
        """The name of this set's fact about `thing`."""
        assert self.named, self.name
        return f"{self.prefix}{thing}"

    def matches(self, name: str) -> bool:
        if self.named:
            return name.startswith(self.prefix) and len(name) > len(self.prefix)
        return name == self.name


@dataclass(frozen=True)
class Fact:
    name: str
    value: float
    unit: str  # one of UNITS
    source: str  # the collector or analysis it came from
    label: str  # what it is, in words

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def shown(self) -> str:
        """The value as a reader wants it."""
        v = self.value
        if self.unit == "share":
            return f"{v:.0%}" if abs(v) >= 0.01 or v == 0 else f"{v:.2%}"
        if self.unit == "bytes/s":
            return f"{v / 1e6:.2f} MB/s"
        if self.unit == "bytes":
            return f"{v:,.0f} B"
        if self.unit == "ratio":
            return f"{v:.1f}×"
        if self.unit == "%":
            return f"{v:+.1f}%"
        if self.unit in ("tps", "count", "clients"):
            return f"{v:,.0f}"
        if self.unit == "yes/no":
            return "yes" if v else "no"
        if self.unit == "coefficient":  # a model's term, not a fraction of anything
            return plain(v, 3)
        if self.unit == "ms" and v >= 1000:
            return f"{plain(v / 1000, 3)} s"
        return f"{plain(v, 3)} {self.unit}"


@dataclass
class FactSheet:
    """The facts of one cell (a variant at one client count), or of the whole run (variant
    None: the variants against each other). `peak` marks each variant's highest client count,
    the cell the rules read unless they say otherwise."""

    variant: str | None
    clients: int | None
    facts: dict[str, Fact] = field(default_factory=dict)
    peak: bool = True
    rate: float | None = None  # an open-loop cell's offered rate (its sheet is not a peak)

    def add(
        self,
        kind: FactKind,
        value: float | None,
        label: str,
        *,
        thing: str | None = None,
        source: str | None = None,
    ) -> None:
        """The fact of `kind` (of `thing`, for a kind that names one), unless unmeasured
        (None); its unit comes from the kind, its source is the kind's usual one unless
        `source` names another of the kind's."""
        name = kind.of(thing) if thing is not None else kind.name
        if not kind.matches(name):
            raise ValueError(f"fact {name!r} is not of kind {kind.name!r}")
        came = source or kind.sources[0]
        if came not in kind.sources:
            raise ValueError(f"fact {name}: source {came!r} is not one of {kind.sources}")
        if value is not None:
            self.facts[name] = Fact(name, float(value), kind.unit, came, label)

    def put(self, fact: Fact) -> None:
        """A fact read back, or one fact standing for another (the top tranche's)."""
        self.facts[fact.name] = fact

    def get(self, name: str) -> Fact | None:
        return self.facts.get(name)

    def value(self, name: str) -> float | None:
        fact = self.facts.get(name)
        return fact.value if fact else None

    def to_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "clients": self.clients,
            "rate": self.rate,
            "peak": self.peak,
            "facts": {n: f.to_json() for n, f in sorted(self.facts.items())},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FactSheet:
        return cls(
            data.get("variant"),
            data.get("clients"),
            {name: Fact(**fact) for name, fact in data["facts"].items()},
            bool(data.get("peak", True)),
            data.get("rate"),
        )


@dataclass
class Finding:
    id: str
    title: str
    confidence: str
    score: float
    variant: str | None
    clients: int | None
    evidence: list[Fact]
    refute: str
    recommendations: list[str]
    weakened_by: list[str] = field(default_factory=list)
    specific: bool = True  # False: every variant shows it (background in a comparison)
    breadth: float = 1.0  # the share of variants (sheets) in which the rule fired
    # The share of active time it explains, where the account of active time measured it
    # (its path's); None: a finding of facts alone.
    share: float | None = None
    # The path it follows in the account: each node's name, from the wait class down; and
    # the path in words (the statement, its part, the node, relation, function, holder).
    path: list[str] = field(default_factory=list)
    named: str | None = None
    # A heavy path no mechanism interprets and whose node shows no waste: where the time
    # goes, said after the findings that say why.
    plain: bool = False
    rate: float | None = None  # an open-loop cell's offered rate (the knee's findings)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "confidence": self.confidence,
            "score": self.score,
            "share": self.share,
            "variant": self.variant,
            "clients": self.clients,
            "named": self.named,
            "path": self.path,
            "evidence": [{**fact.to_json(), "shown": fact.shown()} for fact in self.evidence],
            "refute": self.refute,
            "recommendations": self.recommendations,
            "weakened_by": self.weakened_by,
            "specific": self.specific,  # False: every variant shows it
            "breadth": self.breadth,
            "plain": self.plain,
            "rate": self.rate,
        }


@dataclass(frozen=True)
class NotAssessed:
    id: str
    variant: str | None
    missing: list[str]
    needs: list[str]
    # Why this run lacks them, where it knows: a collector that could not run, failed or was
    # not selected; pg_stat_statements absent from the target database.
    why: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class WindowJudgement:
    """An observation's worst window judged by the same rules as the whole observation: a
    stall or a pile-up can have a cause the whole hides (it is a few seconds of an hour)."""

    step_id: int
    findings: list[Finding]  # best first, medium confidence or more
    # In words: what the window shows against the whole ("the same cause leads", "a cause
    # the whole observation does not show", "no rule fires").
    note: str

    def to_json(self) -> dict[str, Any]:
        return {
            "step_id": self.step_id,
            "findings": [f.to_json() for f in self.findings],
            "note": self.note,
        }


@dataclass
class KneeJudgement:
    """An open-loop knee's cell (the lowest rate the server did not keep up with, or the
    highest offered where it kept up with all) judged by the rules that judge a cell: what
    limits the server where it stops keeping up."""

    variant: str
    clients: int
    rate: float
    findings: list[Finding]  # best first
    note: str  # in words: the knee and its leading finding

    def to_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "clients": self.clients,
            "rate": self.rate,
            "findings": [f.to_json() for f in self.findings],
            "note": self.note,
        }


@dataclass
class Diagnosis:
    verdict: str
    findings: list[Finding]  # best first
    not_assessed: list[NotAssessed]
    weak: bool  # no finding reached medium confidence
    worst_window: WindowJudgement | None = None  # `observe` only
    knees: list[KneeJudgement] = field(default_factory=list)  # runs with offered rates

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "weak": self.weak,
            "findings": [f.to_json() for f in self.findings],
            "not_assessed": [n.to_json() for n in self.not_assessed],
            "worst_window": self.worst_window.to_json() if self.worst_window else None,
            "knees": [k.to_json() for k in self.knees],
        }


# ---------------------------------------------------------------------------------------------
# The run's sections


@dataclass(frozen=True)
class Target:
    kind: str | None  # "embedded", "server" (by DSN), "local" (a server on this host)
    conninfo: str | None  # without its password
    server_version: str | None


@dataclass(frozen=True)
class Latency:
    mean: float | None
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    p999: float | None
    max: float | None


@dataclass(frozen=True)
class Step:
    step_id: int
    variant: str
    clients: int
    repeat: int
    status: str
    error: str | None
    tps: float | None
    xacts: int | None
    failed_xacts: int | None
    latency_ms: Latency
    started_us: int | None
    ended_us: int | None
    window_start_us: int | None = None  # the measured window, after the warm-up
    window_end_us: int | None = None
    # Transactions by how they ended, in the window (the whole step without one); None in
    # stores written before pgscope counted them.
    succeeded_xacts: int | None = None
    failed_serialization: int | None = None
    failed_deadlock: int | None = None
    failed_other: int | None = None
    retried_xacts: int | None = None  # needed more than one try (--max-tries > 1)
    retries: int | None = None  # their extra tries, in all
    # status "errors": pgbench aborted the clients on this ERROR of the workload's own SQL
    workload_error: str | None = None
    reconnects: bool | None = None  # pgbench -C: a connection per transaction
    # pgbench's connection time per transaction (under -C: connecting and disconnecting
    # each; else each client's one connection spread over its transactions)
    connection_ms: float | None = None
    # Open loop (pgbench -R): the rate offered, tps; None for a closed-loop step. Its
    # latency counts from each transaction's scheduled start, the wait for a turn included.
    rate: float | None = None
    schedule: Schedule | None = None
    # How fast the median latency rose over the window, ms per second (the slope of the
    # whole seconds' medians): about 0 while the server keeps up; a backlog makes it grow.
    latency_growth_ms_per_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.tps is not None

    @property
    def attempted_xacts(self) -> int | None:
        """Transactions that ended, succeeded or failed (after their last try)."""
        counts = (
            self.succeeded_xacts,
            self.failed_serialization,
            self.failed_deadlock,
            self.failed_other,
        )
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)


@dataclass(frozen=True)
class Setting:
    name: str
    setting: str | None
    unit: str | None
    source: str | None

    @property
    def shown(self) -> str:
        """The value as PostgreSQL's SHOW gives it: memory in the largest exact unit."""
        if self.setting is None:
            return "-"
        return _with_unit(self.setting, self.unit)


_MEMORY_UNITS = (("TB", 2**40), ("GB", 2**30), ("MB", 2**20), ("kB", 2**10), ("B", 1))


def _with_unit(setting: str, unit: str | None) -> str:
    if not unit:
        return setting
    base = {"B": 1, "kB": 2**10, "8kB": 8 * 2**10, "MB": 2**20, "16MB": 16 * 2**20}.get(unit)
    if base is None or not setting.lstrip("-").isdigit():
        return f"{setting} {unit}"
    value = int(setting) * base
    if value <= 0:
        return setting
    name, size = next((n, s) for n, s in _MEMORY_UNITS if value % s == 0)
    return f"{value // size}{name}"


@dataclass(frozen=True)
class WalDevice:
    """The WAL's device, probed before the load (the waldevice collector)."""

    folder: str | None  # the WAL's folder, where known
    device: str | None  # its device, major:minor, where known
    write_bytes_per_s: float  # WAL the server wrote and flushed alone, in 1 MiB commits
    flush_seconds: float  # a commit of one byte of WAL (median, with the round trip)


@dataclass(frozen=True)
class Environment:
    """Where and how the run was measured."""

    host: dict[str, Any]  # the host's description (CPUs, memory, kernel)
    settings: dict[str, list[Setting]]  # per variant, as the server reported them
    spec: dict[str, Any]  # the effective spec
    collectors: list[dict[str, Any]]  # each collector's record: available, status, error
    gaps: list[dict[str, Any]]  # spans a collector did not cover, and why
    wal_device: WalDevice | None = None  # None: not probed (not a cluster pgscope owns)


@dataclass(frozen=True)
class Timeline:
    series: Series | None  # per second: tps, p95, AAS by wait class, markers
    dips: list[Dip]  # throughput after each action or checkpoint


@dataclass(frozen=True)
class TracedCell:
    """Kernel-side tracing (usdt) pooled over one cell's steps' measured windows."""

    variant: str
    clients: int
    seconds: float  # traced seconds in the windows
    xacts: int  # transactions in those windows
    lwlocks: list[LatencySummary]  # per tranche and mode, most total wait first
    lock_waits: list[LatencySummary]  # heavyweight lock waits per lock type and mode
    rate: float | None = None  # an open-loop cell's offered rate


@dataclass(frozen=True)
class Locks:
    traced: bool  # the usdt collector's lwlock or locks program ran
    lwlocks: list[LatencySummary]  # over the whole run
    lock_waits: list[LatencySummary]
    by_cell: list[TracedCell]


@dataclass(frozen=True)
class StepCheckpoint:
    """A traced checkpoint, with the step it started in (None: between steps)."""

    step_id: int | None
    variant: str | None
    clients: int | None
    checkpoint: Checkpoint
    # pgscope's own CHECKPOINT before this step (its `pgscope-checkpoint` event), not one the
    # server or an action started; None for those, and in stores recorded before the event.
    before_step: int | None = None


@dataclass(frozen=True)
class Checkpoints:
    traced: bool  # the usdt collector's checkpoint program ran
    items: list[StepCheckpoint]


@dataclass(frozen=True)
class HostCell:
    """The host's CPU over one cell's measured windows, as shares of the host's CPU time."""

    variant: str
    clients: int
    busy: float | None
    iowait: float | None
    steal: float | None
    server: float | None  # the cluster's processes
    client: float | None  # pgbench
    cpus: int | None
    walsender_aas: float | None = None  # walsenders on CPU on average (activity sampling)
    own: float | None = None  # pgscope and the tracers it started
    other: float | None = None  # other user-space processes (kernel threads not counted)
    rate: float | None = None  # an open-loop cell's offered rate


@dataclass(frozen=True)
class ProfileCell:
    """The on-CPU profile of one cell's steps."""

    variant: str
    clients: int
    functions: FunctionTable
    spin: HotSpot | None = None  # samples in PostgreSQL's spin loops, by caller
    snapshot: HotSpot | None = None  # samples in GetSnapshotData, by caller
    rate: float | None = None  # an open-loop cell's offered rate


@dataclass(frozen=True)
class Cpu:
    host: list[HostCell]
    profiles: list[ProfileCell]  # on-CPU profile per cell (perf)
    run_profile: FunctionTable | None  # on-CPU over the whole run (for compare)
    flames: list[FlameGraph]


@dataclass(frozen=True)
class Variants:
    baseline: str | None
    comparisons: list[Comparison]  # each variant against the baseline, per client count


SESSIONS = ("sample", "trace", "profile")  # commands that collect without driving load


@dataclass(frozen=True)
class RunAnalysis:
    run_id: str
    run_dir: str
    status: str  # "complete", "partial", "interrupted", "failed"
    status_reason: str | None
    recipe: str | None
    command_line: str | None
    pgscope_version: str | None
    target: Target
    started_us: int | None
    ended_us: int | None
    environment: Environment
    steps: list[Step]
    scalability: ScalingAnalysis
    waits: WaitAnalysis | None
    counters: list[StepStats]  # cumulative statistics per step (pgstats)
    timeline: Timeline
    locks: Locks
    checkpoints: Checkpoints
    cpu: Cpu
    variants: Variants
    statements: Statements = field(default_factory=Statements)  # per step, statements, tables
    held_locks: HeldLocks = field(default_factory=HeldLocks)  # per step, relation locks held
    observation: Observation | None = None  # `pgscope observe`: its windows, layers
    # Where active time went, as a tree: per cell (a run) or per window and whole (observe)
    accounts: list[Account] = field(default_factory=list)
    facts: list[FactSheet] = field(default_factory=list)  # per cell, then the run's
    diagnosis: Diagnosis | None = None
    # On a user's server: transaction ids every session was given while the load ran
    xids: XidUse | None = None
    # Open loop: offered rates, latency against them, the knee, the capacity at each objective
    capacity: CapacityAnalysis | None = None

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    @property
    def folder(self) -> Path:
        return Path(self.run_dir)

    @property
    def command(self) -> str:
        """The pgscope command that made the run, from its command line: `run`, `observe`,
        or a session that ran no load (`sample`, `trace`, `profile`)."""
        words = [w for w in (self.command_line or "").split()[1:] if not w.startswith("-")]
        if words and words[0] in ("run", "observe", *SESSIONS):
            return words[0]
        return "observe" if self.observation is not None else "run"

    @property
    def session(self) -> bool:
        """Collectors for a fixed time, no load steps: nothing the rules judge."""
        return self.command in SESSIONS

    def cell_sheets(self) -> list[FactSheet]:
        """The closed-loop cells' sheets (an open-loop cell's has its rate)."""
        return [s for s in self.facts if s.variant is not None and s.rate is None]

    def account_of(
        self, variant: str | None, clients: int | None, rate: float | None = None
    ) -> Account | None:
        """The account a cell's findings follow: the cell's own, or an observation's whole."""
        return account_of(self.accounts, variant, clients, rate)

    def peak_accounts(self) -> list[Account]:
        """The accounts a reader is shown: each variant's highest client count's, or the
        whole of an observation; then each open-loop knee's."""
        whole = [a for a in self.accounts if a.scope == "whole"]
        if whole:
            return whole
        knees = [
            a
            for k in (self.diagnosis.knees if self.diagnosis else [])
            if (a := account_of(self.accounts, k.variant, k.clients, k.rate)) is not None
            and a.rate is not None
        ]
        peaks: dict[str, Account] = {}
        for a in self.accounts:
            if (
                a.variant is not None
                and a.rate is None
                and (a.variant not in peaks or (a.clients or 0) > (peaks[a.variant].clients or 0))
            ):
                peaks[a.variant] = a
        return [*peaks.values(), *knees]


# ---------------------------------------------------------------------------------------------
# The JSON document


@cache
def _adapter() -> TypeAdapter[RunAnalysis]:
    return TypeAdapter(RunAnalysis)


def _primitive(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def _with_properties(obj: Any, dumped: Any) -> Any:
    """The dump with each dataclass's derived numbers (its properties) beside its fields: what
    a reader of the JSON wants (a dip's depth, a comparison's significance) without the code."""
    if dataclasses.is_dataclass(obj) and isinstance(dumped, dict):
        for f in dataclasses.fields(obj):
            if f.name in dumped:
                dumped[f.name] = _with_properties(getattr(obj, f.name), dumped[f.name])
        for name in dir(type(obj)):
            if name.startswith("_") or name in dumped:
                continue
            if isinstance(getattr(type(obj), name), property):
                value = getattr(obj, name)
                if _primitive(value):
                    dumped[name] = value
        return dumped
    if isinstance(obj, list | tuple) and isinstance(dumped, list):
        return [_with_properties(o, d) for o, d in zip(obj, dumped, strict=True)]
    if isinstance(obj, dict) and isinstance(dumped, dict):
        return {k: _with_properties(obj.get(k), v) for k, v in dumped.items()}
    return dumped


def to_document(analysis: RunAnalysis) -> dict[str, Any]:
    """The analysis as one JSON document: every section of the report under its own key."""
    dumped = _adapter().dump_python(analysis, mode="json")
    document: dict[str, Any] = {"schema_version": DOCUMENT_VERSION}
    diagnosis = analysis.diagnosis
    document["verdict"] = diagnosis.verdict if diagnosis else None
    document["findings"] = [f.to_json() for f in diagnosis.findings] if diagnosis else []
    document.update(_with_properties(analysis, dumped))
    document["diagnosis"] = diagnosis.to_json() if diagnosis else None
    document["facts"] = [sheet.to_json() for sheet in analysis.facts]
    return document


def from_document(document: dict[str, Any]) -> RunAnalysis:
    """The analysis back from its JSON document (derived keys are ignored)."""
    version = document.get("schema_version")
    if version != DOCUMENT_VERSION:
        raise ValueError(
            f"a summary of schema version {version}; this pgscope reads version "
            f"{DOCUMENT_VERSION} (re-create it with `pgscope report RUN`)"
        )
    return _adapter().validate_python(document)


def read_document(path: Path) -> RunAnalysis:
    return from_document(json.loads(path.read_text()))
