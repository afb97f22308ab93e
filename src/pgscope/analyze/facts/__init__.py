"""Facts: the run's evidence as named numbers, each of a kind declared once, with its unit,
what it is, what a run needs to measure it and where it came from.

The diagnosis (`diagnose.py`) reads nothing else: its rules name facts, and every name they
use must be a declared kind (`load_rules` checks). Facts are computed per cell (a variant at
one client count), each variant's highest client count being its `peak` cell, where the rules
look unless they say otherwise; a last sheet holds facts about the variants against each
other. A fact a missing collector would have given is simply absent; rules that need it say
so (with the kind's `needs`) instead of guessing. Shares are fractions of 1.

Each family of facts is a module of this package with one `Family` subclass and its kinds
(module-level `FactKind`s), found as collectors are: adding a family is adding a module. A
family computes its facts from the run's analysis, and may read evidence of its own from the
store first (`Family.read`, run by the loader), so that new evidence with its facts and its
rule costs a table declaration, a collector, a family, a rule and a test.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar

from pgscope.analyze.model import Fact, FactKind, FactSheet, RunAnalysis, Step
from pgscope.analyze.scaling import Cell
from pgscope.duck import Queryable
from pgscope.words import n_clients

__all__ = ["CellFacts", "Fact", "FactKind", "FactSheet", "Family", "extract", "families", "kind"]


@dataclass(frozen=True)
class CellFacts:
    """What a family's facts of one cell are computed from."""

    analysis: RunAnalysis
    variant: str
    clients: int
    peak: bool
    cells: list[Cell]  # the variant's cells with a measured tps, client counts ascending
    cell: Cell
    evidence: Mapping[str, Any] = field(default_factory=dict)  # per family: what it read

    @property
    def rate(self) -> float | None:
        """An open-loop cell's offered rate (None: a closed-loop cell, the sweep's)."""
        return getattr(self.cell, "rate", None)

    def owns(self, item: Any) -> bool:
        """Whether a section's entry (a host cell, a profile, an account...) is this cell's:
        its variant, client count and rate (a closed-loop entry has none)."""
        return (
            item.variant == self.variant
            and item.clients == self.clients
            and getattr(item, "rate", None) == self.rate
        )

    def steps(self) -> list[Step]:
        """The cell's steps."""
        return [s for s in self.analysis.steps if self.owns(s)]

    @property
    def step_ids(self) -> set[int]:
        return {s.step_id for s in self.steps()}

    @property
    def observed(self) -> bool:
        """An observation's cell: windows of the server's own workload, no pgbench."""
        return self.analysis.observation is not None

    @property
    def where(self) -> str:
        if self.observed:
            return f"at {self.clients} session{'' if self.clients == 1 else 's'}"
        if self.rate is not None:
            return f"at {self.rate:,.0f} tps offered by {n_clients(self.clients)}"
        return f"at {n_clients(self.clients)}"


class Family:
    """A family of facts: its kinds are the `FactKind`s of its module. `order` places it
    among the others (a family reading facts another one added comes after it)."""

    name: ClassVar[str]
    order: ClassVar[int]

    def read(self, store: Queryable) -> Any:
        """Evidence of the family's own, read from the store by the loader (None: it needs
        none beyond the analysis)."""
        return None

    def fill(self, sheet: FactSheet, cell: CellFacts) -> None:
        """The cell's facts."""

    def across(self, sheets: list[FactSheet]) -> None:
        """Facts of each cell against the others (after every cell's own)."""

    def run_facts(self, sheet: FactSheet, analysis: RunAnalysis) -> None:
        """Facts of the run as a whole (the variants against each other)."""


@cache
def _modules() -> tuple[Any, ...]:
    return tuple(
        importlib.import_module(f"{__name__}.{m.name}")
        for m in pkgutil.iter_modules(__path__)
        if not m.name.startswith("_")
    )


@cache
def families() -> tuple[Family, ...]:
    """Every family, in order."""
    found = [
        obj()
        for module in _modules()
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, Family)
        and obj is not Family
        and obj.__module__ == module.__name__
    ]
    return tuple(sorted(found, key=lambda f: (f.order, f.name)))


@cache
def catalog() -> dict[str, tuple[FactKind, str]]:
    """Every declared kind by name, with its family's name."""
    out: dict[str, tuple[FactKind, str]] = {}
    for module in _modules():
        owner = next(
            (f.name for f in families() if type(f).__module__ == module.__name__), module.__name__
        )
        for obj in _kinds_of(module):
            if obj.name in out and out[obj.name][0] is not obj:
                raise ValueError(f"fact {obj.name} declared twice")
            out[obj.name] = (obj, owner)
    return out


def _kinds_of(module: Any) -> list[FactKind]:
    """A module's kinds: its FactKind constants, and those in its constant tables."""
    found = []
    for obj in vars(module).values():
        items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, tuple) else [obj]
        found += [item for item in items if isinstance(item, FactKind)]
    return found


def kind(name: str) -> FactKind | None:
    """The declared kind of the fact `name` (`x.*`: of the set `x.<what>`), or None."""
    kinds = [k for k, _ in catalog().values()]
    if name.endswith(".*"):
        prefix = name[:-1]
        return next((k for k in kinds if k.named and k.prefix == prefix), None)
    exact = next((k for k in kinds if not k.named and k.name == name), None)
    if exact is not None:
        return exact
    named = [k for k in kinds if k.matches(name)]
    return max(named, key=lambda k: len(k.prefix), default=None)


def variant_settings(analysis: RunAnalysis, variant: str) -> dict[str, Any]:
    """The settings a variant ran with, as the spec gave them (the run's, then its own)."""
    spec = analysis.environment.spec
    return {**(spec.get("settings") or {}), **(spec.get("variants") or {}).get(variant, {})}


def read_evidence(store: Queryable) -> dict[str, Any]:
    """What each family reads of its own from the store (the loader's part)."""
    return {f.name: found for f in families() if (found := f.read(store)) is not None}


def extract(analysis: RunAnalysis, evidence: Mapping[str, Any] | None = None) -> list[FactSheet]:
    """One sheet per cell (variants in order, client counts ascending), then one per
    open-loop cell (by rate; never a peak: the rules judge them where the diagnosis asks,
    at the knee), then one for the run (variant comparisons)."""
    sheets: list[FactSheet] = []
    for variant in analysis.scalability.variants():
        own = [c for c in analysis.scalability.cells if c.variant == variant]
        measured = [c for c in own if c.tps_mean]
        # A cell whose every step errored (the workload's SQL raised an error) has no tps, but
        # what failed is its finding: it gets a sheet, with the failure facts.
        cells = [c for c in own if c.tps_mean or c.errored_steps]
        peak = max((c.clients for c in cells), default=None)
        for c in cells:
            sheet = FactSheet(variant, c.clients, peak=c.clients == peak)
            context = CellFacts(
                analysis, variant, c.clients, c.clients == peak, measured, c, evidence or {}
            )
            for family in families():
                family.fill(sheet, context)
            sheets.append(sheet)
    for family in families():
        family.across(sheets)
    for group in analysis.capacity.variants if analysis.capacity else []:
        closed = [
            c for c in analysis.scalability.cells if c.variant == group.variant and c.tps_mean
        ]
        for rated in group.cells:
            if rated.achieved_tps is None:
                continue
            cell = rated.as_cell()
            sheet = FactSheet(group.variant, cell.clients, peak=False, rate=cell.rate)
            context = CellFacts(
                analysis, group.variant, cell.clients, False, closed, cell, evidence or {}
            )
            for family in families():
                family.fill(sheet, context)
            sheets.append(sheet)
    run = FactSheet(None, None, peak=False)
    for family in families():
        family.run_facts(run, analysis)
    sheets.append(run)
    return sheets
