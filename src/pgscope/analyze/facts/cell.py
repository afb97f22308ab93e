"""The cell itself: its throughput, latency and client count, and how pgbench drove it."""

from __future__ import annotations

from pgscope.analyze.facts import CellFacts, FactKind, FactSheet, Family

PGBENCH = "pgbench's transaction log"
TPS = FactKind(
    "tps",
    "tps",
    "mean tps over the cell's repeats (an observation: commits/s)",
    PGBENCH,
    ("pgbench", "pgstats"),
)
P95 = FactKind("p95_ms", "ms", "p95 latency, mean over repeats", PGBENCH, ("pgbench",))
CLIENTS = FactKind(
    "clients", "clients", "the cell's client count", "the spec", ("spec", "activity")
)
PREPARED = FactKind(
    "pgbench.prepared", "yes/no", "pgbench ran with -M prepared", "a run pgbench drove", ("spec",)
)
OBSERVED = FactKind(
    "observed",
    "yes/no",
    "the load is a server's own workload, observed: pgscope drove none (advice about pgbench "
    "does not apply)",
    "an observation (pgscope observe)",
    ("spec",),
)


class CellFamily(Family):
    name = "cell"
    order = 0

    def fill(self, sheet: FactSheet, cell: CellFacts) -> None:
        if cell.observed:
            # The server's commits over the windows at this concurrency, not a load
            # generator's transactions.
            sheet.add(TPS, cell.cell.tps_mean, f"commits/s {cell.where}", source="pgstats")
            sheet.add(
                CLIENTS,
                cell.clients,
                "the highest concurrency observed (client sessions)"
                if cell.peak
                else "the concurrency of these windows (client sessions)",
                source="activity",
            )
            sheet.add(OBSERVED, 1.0, OBSERVED.label)
            return
        sheet.add(TPS, cell.cell.tps_mean, f"mean tps {cell.where}")
        sheet.add(P95, cell.cell.p95_ms, f"p95 latency {cell.where}")
        sheet.add(
            CLIENTS,
            cell.clients,
            "the highest client count measured" if cell.peak else "the client count of this cell",
        )
        protocol = cell.analysis.environment.spec.get("protocol")
        if protocol is not None:  # pgbench drove the load: advice reads how
            sheet.add(PREPARED, 1.0 if protocol == "prepared" else 0.0, PREPARED.label)
