"""Console views of variants side by side: the comparison with the baseline, the evidence per
variant (a view of the facts of each cell), and the dips after actions. Renders analysis
results only."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from pgscope.analyze.facts.cell import P95, TPS
from pgscope.analyze.facts.counters import FPI_PER_XACT, LOG_RATE, ROWS_PER_COMMIT, WAL_PER_XACT
from pgscope.analyze.facts.host import WALSENDER_CPU
from pgscope.analyze.facts.waits import CLASS, GROUPS
from pgscope.analyze.model import RunAnalysis

# (column title, fact, format) for the evidence table; a column shows only if measured.
EVIDENCE_COLUMNS = (
    ("p95 ms", P95.name, "{:.2f}"),
    ("IPC:SyncRep", GROUPS["syncrep"].name, "{:.0%}"),
    ("Lock waits", CLASS.of("Lock"), "{:.0%}"),
    ("walsender CPU", WALSENDER_CPU.name, "{:.2f}"),
    ("WAL B/xact", WAL_PER_XACT.name, "{:,.0f}"),
    ("FPI/xact", FPI_PER_XACT.name, "{:.2f}"),
    ("rows/commit", ROWS_PER_COMMIT.name, "{:.1f}"),
    ("log MB/s", LOG_RATE.name, "{:.2f}"),
)
# Facts in bytes/s shown in MB/s.
_SCALE = {LOG_RATE.name: 1e-6}


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def evidence_table(analysis: RunAnalysis) -> tuple[list[str], list[list[str]]]:
    """Column titles and rows (variant, clients, tps, then each measured column) of the
    evidence per cell; none where nothing beyond tps was measured. A column shows only where
    something was measured: a share that is zero everywhere (no SyncRep waits without
    standbys) would only be noise."""
    sheets = analysis.cell_sheets()
    shown = [
        (title, fact, fmt)
        for title, fact, fmt in EVIDENCE_COLUMNS
        if any(s.value(fact) for s in sheets)
    ]
    if not shown:
        return [], []
    rows = [
        [
            s.variant or "",
            str(s.clients),
            _fmt(s.value(TPS.name), "{:,.0f}"),
            *(
                _fmt(None if (v := s.value(fact)) is None else v * _SCALE.get(fact, 1.0), fmt)
                for _, fact, fmt in shown
            ),
        ]
        for s in sheets
    ]
    return ["tps", *(title for title, _, _ in shown)], rows


def print_variants(console: Console, result: RunAnalysis) -> None:
    comparisons = result.variants.comparisons
    if comparisons:
        base = comparisons[0].baseline
        table = Table(
            title=f"variants against {base} (tps; 95% interval of the change)",
            title_justify="left",
            show_edge=False,
        )
        for name in ("variant", "clients", "tps", f"{base} tps", "change", "95% interval", ""):
            table.add_column(name, justify="left" if name == "variant" else "right")
        for c in comparisons:
            ci = f"{c.ci95_pct[0]:+.1f}% … {c.ci95_pct[1]:+.1f}%" if c.ci95_pct else "n/a"
            verdict = c.judgement
            table.add_row(
                c.variant,
                str(c.clients),
                f"{c.tps:,.0f}",
                f"{c.baseline_tps:,.0f}",
                f"{c.change_pct:+.1f}%",
                ci,
                verdict,
            )
        console.print()
        console.print(table)
    titles, rows = evidence_table(result)
    if len({row[0] for row in rows}) > 1 and len(titles) > 2:
        table = Table(title="evidence per variant", title_justify="left", show_edge=False)
        table.add_column("variant")
        table.add_column("clients", justify="right")
        for title in titles:
            table.add_column(title, justify="right")
        for row in rows:
            table.add_row(*row)
        console.print()
        console.print(table)
    dips = result.timeline.dips
    if dips:
        table = Table(title="throughput around each action", title_justify="left", show_edge=False)
        for name in (
            "step",
            "variant",
            "action",
            "tps before",
            "lowest 3 s",
            "dip",
            "noise",
            "at",
            "back to 90%",
            "FPI/s before → after",
            "WAL MB/s before → after",
        ):
            table.add_column(name, justify="left" if name in ("variant", "action") else "right")
        for d in dips:
            fpi = (
                f"{d.fpi_per_s_before:,.0f} → {d.fpi_per_s_after:,.0f}"
                if d.fpi_per_s_before is not None and d.fpi_per_s_after is not None
                else "-"
            )
            wal = (
                f"{d.wal_bytes_per_s_before / 1e6:.1f} → {d.wal_bytes_per_s_after / 1e6:.1f}"
                if d.wal_bytes_per_s_before is not None and d.wal_bytes_per_s_after is not None
                else "-"
            )
            table.add_row(
                str(d.step_id),
                d.variant,
                d.action,
                f"{d.tps_before:,.0f}",
                f"{d.tps_lowest:,.0f}",
                f"{d.depth_pct:.0f}%",
                f"{d.noise_pct:.0f}%",
                f"+{d.lowest_after_s:.0f} s",
                f"+{d.recovered_after_s:.0f} s"
                if d.recovered_after_s is not None
                else "not in step",
                fpi,
                wal,
            )
        console.print()
        console.print(table)
