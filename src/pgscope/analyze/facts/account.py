"""The account of active time, as facts: how much of it the heaviest path explains, and how
many samples it rests on. A path finding's evidence is of these kinds too (analyze/paths.py)."""

from __future__ import annotations

from pgscope.analyze.facts import CellFacts, FactKind, FactSheet, Family
from pgscope.analyze.heavy import heavy_paths

SAMPLING = "the activity collector"
SOURCES = ("activity",)
SAMPLES = FactKind(
    "account.samples",
    "count",
    "active samples the account of active time rests on",
    SAMPLING,
    SOURCES,
)
TOP_SHARE = FactKind(
    "account.top_share", "share", "the heaviest path's share of active time", SAMPLING, SOURCES
)
PATH_SHARE = FactKind(
    "path.share", "share", "the path's share of active time", SAMPLING, ("activity", "statements")
)
PATH_STATEMENT_SHARE = FactKind(
    "path.statement_share", "share", "the statement's share of active time", SAMPLING, SOURCES
)
PATH_NODE_SHARE = FactKind(
    "path.node_share",
    "share",
    "the path's deepest node's share of the statement's time",
    "the statements collector (pg_stat_statements; plans on clusters pgscope starts)",
    ("statements", "auto_explain", "pg_stat_user_functions", "activity (blockers)"),
)
PATH_SAMPLES = FactKind("path.samples", "count", "wait samples behind the path", SAMPLING, SOURCES)


class AccountFamily(Family):
    name = "account"
    order = 130

    def fill(self, sheet: FactSheet, cell: CellFacts) -> None:
        account = next(
            (a for a in cell.analysis.accounts if a.scope == "cell" and cell.owns(a)),
            None,
        )
        if account is None:
            return
        sheet.add(SAMPLES, account.samples, f"{SAMPLES.label} {cell.where}")
        found = heavy_paths(account)
        if found:
            sheet.add(TOP_SHARE, found[0].share, f"{TOP_SHARE.label} {cell.where}")
