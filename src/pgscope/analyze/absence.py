"""Why this run lacks a kind of evidence: a collector that could not run, failed or was not
selected, or pg_stat_statements absent from the target database. The diagnosis says it beside
each rule it could not assess, so a reader knows whether to install something, select a
collector, or expect the evidence never to come (a server without the extension).

Keyed by collector name, and `pg_stat_statements` for the extension; read from the run's
collector records and the statements section only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pgscope.analyze.model import RunAnalysis

STATEMENTS_EXTENSION = "pg_stat_statements"
# How a fact kind's `needs` names a collector (analyze/facts/).
_COLLECTOR = re.compile(r"\bthe (\w+) collector\b")


@dataclass(frozen=True)
class Absence:
    """What this run knows about evidence it lacks."""

    reasons: dict[str, str] = field(default_factory=dict)  # collector or extension -> why
    selected: frozenset[str] | None = None  # the collectors selected; None: not recorded

    def why(self, source: str) -> list[str]:
        """Why this run lacks the evidence `source` (a fact kind's `needs`) would give:
        a reason for each collector it names, or none when one of them ran (the evidence
        could have come, and did not: nothing to explain)."""
        if source.startswith(STATEMENTS_EXTENSION) and STATEMENTS_EXTENSION in self.reasons:
            return [self.reasons[STATEMENTS_EXTENSION]]
        reasons = [self._collector(name) for name in _COLLECTOR.findall(source)]
        return [r for r in reasons if r] if reasons and all(reasons) else []

    def _collector(self, name: str) -> str | None:
        if name in self.reasons:
            return self.reasons[name]
        if self.selected is not None and name not in self.selected:
            return f"the {name} collector was not selected for this run"
        return None


def absent_evidence(analysis: RunAnalysis) -> Absence:
    records = analysis.environment.collectors
    if not records:  # a store from before collectors were recorded: nothing is known
        return Absence()
    reasons: dict[str, str] = {}
    for record in records:
        name = str(record["name"])
        if not record["available"]:
            reasons[name] = f"the {name} collector could not run: {record['reason'] or '?'}"
        elif record["status"] == "failed":
            reasons[name] = f"the {name} collector failed: {record['error'] or '?'}"
        elif record["status"] == "not started":
            reasons[name] = f"the {name} collector never started: the run ended first"
    statements = analysis.statements
    if statements.read and not statements.statements_read:
        reasons[STATEMENTS_EXTENSION] = (
            "pg_stat_statements is absent from the target database, so no statement was "
            "measured (CREATE EXTENSION pg_stat_statements, with it in shared_preload_libraries)"
        )
    return Absence(reasons, frozenset(str(r["name"]) for r in records))
