"""The variants against each other: how far each cell is below the fastest variant at its
client count (a finding on a slower variant explains a loss; one on the fastest, a ceiling),
and, for the run, what logging every statement and synchronous commits cost against the
baseline."""

from __future__ import annotations

from pgscope.analyze.facts import FactKind, FactSheet, Family, variant_settings
from pgscope.analyze.facts.cell import TPS
from pgscope.analyze.model import RunAnalysis
from pgscope.words import n_clients

NEEDS = "variants that change the setting in question"
SOURCES = ("pgbench (variants)",)
LOSS = FactKind(
    "variants.loss_vs_fastest",
    "share",
    "tps below the fastest variant at the same client count",
    "two or more variants",
    SOURCES,
)
LOGGING_COST = FactKind(
    "variants.logging_cost",
    "share",
    "throughput lost by a variant logging statements against the baseline, beyond noise (else 0)",
    NEEDS,
    SOURCES,
)
SYNC_COMMIT_COST = FactKind(
    "variants.sync_commit_cost",
    "share",
    "throughput lost by a variant whose synchronous_commit differs, beyond noise (else 0)",
    NEEDS,
    SOURCES,
)
LOGGING_SETTINGS = (
    "log_statement",
    "log_duration",
    "log_min_duration_statement",
    "log_min_duration_sample",
    "log_statement_sample_rate",
)


class VariantFamily(Family):
    name = "variants"
    order = 200

    def across(self, sheets: list[FactSheet]) -> None:
        by_clients: dict[int | None, list[FactSheet]] = {}
        for sheet in sheets:
            if sheet.value(TPS.name) is not None:
                by_clients.setdefault(sheet.clients, []).append(sheet)
        for group in by_clients.values():
            if len(group) < 2:
                continue
            fastest = max(group, key=lambda s: s.value(TPS.name) or 0.0)
            best = fastest.value(TPS.name) or 0.0
            for sheet in group:
                if best > 0:
                    sheet.add(
                        LOSS,
                        1 - (sheet.value(TPS.name) or 0.0) / best,
                        f"tps below the fastest variant ({fastest.variant}) "
                        f"at {n_clients(sheet.clients)}",
                    )

    def run_facts(self, sheet: FactSheet, analysis: RunAnalysis) -> None:
        for comparison in analysis.variants.comparisons:
            own = variant_settings(analysis, comparison.variant)
            base = variant_settings(analysis, comparison.baseline)
            changed = {k for k in own.keys() | base.keys() if own.get(k) != base.get(k)}
            cost = -comparison.change_pct / 100 if comparison.significant else 0.0
            logs = changed & set(LOGGING_SETTINGS) and own.get("log_statement", "none") != "none"
            if logs and cost >= (sheet.value(LOGGING_COST.name) or 0.0):
                sheet.add(
                    LOGGING_COST,
                    cost,
                    f"throughput lost by {comparison.variant} against {comparison.baseline} "
                    f"at {n_clients(comparison.clients)}, where the change is beyond noise "
                    f"(else 0)",
                )
            syncs = "synchronous_commit" in changed
            if syncs and cost >= (sheet.value(SYNC_COMMIT_COST.name) or 0.0):
                sheet.add(
                    SYNC_COMMIT_COST,
                    cost,
                    f"throughput lost by {comparison.variant} against {comparison.baseline} "
                    f"(synchronous_commit differs), beyond noise",
                )
