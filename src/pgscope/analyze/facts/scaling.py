"""How a cell compares with its variant's cells up to it, and the variant's USL fit."""

from __future__ import annotations

from pgscope.analyze.facts import CellFacts, FactKind, FactSheet, Family
from pgscope.words import n_clients

SWEEP = "a sweep of 2 or more client counts"
FIT = "a sweep of 3 or more client counts"
EFFICIENCY = FactKind(
    "scaling.efficiency",
    "share",
    "tps as a share of linear scaling from the lowest client count",
    SWEEP,
    ("pgbench",),
)
BEST_CLIENTS = FactKind(
    "scaling.best_clients",
    "clients",
    "the client count with the highest mean tps",
    SWEEP,
    ("pgbench",),
)
DROP_AFTER_BEST = FactKind(
    "scaling.drop_after_best",
    "share",
    "how far tps at this cell is below the best",
    SWEEP,
    ("pgbench",),
)
GROWTH_SHOWN = FactKind(
    "scaling.growth_shown",
    "yes/no",
    "throughput at the best client count is above every lower client count's beyond their "
    "95% intervals (absent where a cell has one repeat)",
    "a sweep of 2 or more client counts, 2 or more repeats each",
    ("pgbench",),
)
# Coefficients like κ, not shares: the fit lets σ pass 1 (throughput falling from the first
# client), where "131% serialised" would mean nothing.
SIGMA = FactKind("usl.sigma", "coefficient", "USL contention σ", FIT, ("usl",))
KAPPA = FactKind("usl.kappa", "coefficient", "USL coherency κ", FIT, ("usl",))
N_STAR = FactKind("usl.n_star", "clients", "USL peak N*", FIT, ("usl",))


class ScalingFamily(Family):
    name = "scaling"
    order = 10

    def fill(self, sheet: FactSheet, cell: CellFacts) -> None:
        if not cell.cell.tps_mean:
            return
        cells = [c for c in cell.cells if c.clients <= cell.clients]
        # An open-loop cell is not a point of the sweep: only the variant's fit is its fact.
        if len(cells) >= 2 and cell.rate is None:
            low, high = cells[0], cells[-1]
            assert low.tps_mean is not None and high.tps_mean is not None
            per_client_low = low.tps_mean / low.clients
            sheet.add(
                EFFICIENCY,
                high.tps_mean / (per_client_low * high.clients),
                f"tps at {n_clients(high.clients)} as a share of {high.clients}× "
                f"the per-client tps at {low.clients}",
            )
            best = max(cells, key=lambda c: c.tps_mean or 0.0)
            sheet.add(BEST_CLIENTS, best.clients, BEST_CLIENTS.label)
            lower = [c for c in cells if c.clients < best.clients]
            if lower and best.tps_ci95 and all(c.tps_ci95 for c in lower):
                above = all(
                    best.tps_ci95[0] > c.tps_ci95[1] for c in lower if c.tps_ci95 is not None
                )
                sheet.add(GROWTH_SHOWN, 1.0 if above else 0.0, GROWTH_SHOWN.label)
            sheet.add(
                DROP_AFTER_BEST,
                1 - high.tps_mean / (best.tps_mean or high.tps_mean),
                f"how far tps at {n_clients(high.clients)} is below the best",
            )
        fit = cell.analysis.scalability.fits.get(cell.variant)
        if fit is not None:
            sheet.add(SIGMA, fit.sigma, SIGMA.label)
            sheet.add(KAPPA, fit.kappa, KAPPA.label)
            if fit.n_star is not None:
                sheet.add(N_STAR, fit.n_star, N_STAR.label)
