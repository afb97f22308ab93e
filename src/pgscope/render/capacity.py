"""The open-loop steps on the console: per variant, latency against the offered rate, what the
run shows about the knee, and the capacity at each objective. Renders the analysis only."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pgscope.analyze.capacity import CellObjective, RateCell, VariantCapacity
from pgscope.analyze.model import RunAnalysis
from pgscope.words import n_clients

COLUMNS = (
    "offered tps",
    "achieved",
    "p50 ms",
    "p99 ms",
    "lag p99",
    "service p99",
    "growth ms/s",
    "skipped",
)


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


def cell_row(cell: RateCell, objectives: list[str]) -> list[str]:
    """A rate cell as the console and the report show it: COLUMNS, then each objective."""
    judged = {o.name: o for o in cell.objectives}
    offered = f"{cell.rate:,.0f}"
    if cell.share_of_peak is not None:
        offered += f" ({cell.share_of_peak:.0%})"
    achieved = (
        f"{cell.achieved_tps:,.0f} ({cell.achieved_share:.0%})"
        if cell.achieved_tps is not None and cell.achieved_share is not None
        else "-"
    )
    return [
        offered,
        achieved,
        _ms(cell.p50_ms),
        _ms(cell.p99_ms),
        _ms(cell.lag_p99_ms),
        _ms(cell.service_p99_ms),
        _growth(cell.growth_ms_per_s),
        "-" if cell.skipped_share is None else f"{cell.skipped_share:.1%}",
        *(_objective(judged.get(name)) for name in objectives),
    ]


def _growth(value: float | None) -> str:
    if value is None:
        return "-"
    return "0.0" if abs(value) < 0.05 else f"{value:+,.1f}"


def _objective(judged: CellObjective | None) -> str:
    if judged is None:
        return "-"
    return "met" if judged.met else f"missed ({judged.above_share:.1%} above)"


def title(variant: VariantCapacity) -> str:
    peak = (
        f"; shares are of the sweep's peak, {variant.peak_tps:,.0f} tps at "
        f"{n_clients(variant.peak_clients)}"
        if variant.peak_tps is not None and any(c.share_of_peak is not None for c in variant.cells)
        else ""
    )
    return (
        f"open loop, variant {variant.variant}: {n_clients(variant.clients)} at offered rates; "
        f"latency from each transaction's scheduled start{peak}"
    )


def print_capacity(console: Console, result: RunAnalysis) -> None:
    if result.capacity is None:
        return
    objectives = result.capacity.objectives
    for variant in result.capacity.variants:
        table = Table(title=title(variant), title_justify="left", show_edge=False)
        for name in (*COLUMNS, *objectives):
            table.add_column(name, justify="right")
        for cell in variant.cells:
            table.add_row(*cell_row(cell, objectives))
        console.print()
        console.print(table)
        for sentence in variant.said:
            console.print(escape(sentence), highlight=False)
        for estimate in variant.capacities:
            console.print(f"[bold]capacity:[/bold] {escape(estimate.said)}", highlight=False)
