"""Console views of wait analyses: profiles, the profile versus concurrency, top queries, the
sampler's real resolution, the comparison with pg_wait_sampling, and the live top-like view.
Renders analysis results only; computes nothing of its own."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from pgscope.analyze.model import Finding
from pgscope.analyze.waits import ConcurrencyProfile, Profile, QueryProfile, WaitAnalysis

CLASS_ORDER = (
    "CPU",
    "LWLock",
    "Lock",
    "IO",
    "IPC",
    "Client",
    "BufferPin",
    "Timeout",
    "Extension",
    "Activity",
)


def _pct(share: float) -> str:
    return f"{share:6.1%}"


def profile_table(profile: Profile, title: str, limit: int = 12) -> Table:
    caption = (
        "no active session in any sample: the server was idle" if not profile.entries else None
    )
    table = Table(title=title, title_justify="left", show_edge=False, caption=caption)
    table.add_column("wait event")
    table.add_column("share of active time", justify="right")
    table.add_column("samples", justify="right")
    for entry in profile.entries[:limit]:
        table.add_row(entry.label, _pct(entry.share), f"{entry.samples:,}")
    rest = profile.entries[limit:]
    if rest:
        table.add_row(
            f"({len(rest)} more)",
            _pct(sum(e.share for e in rest)),
            f"{sum(e.samples for e in rest):,}",
        )
    return table


def concurrency_table(profiles: list[ConcurrencyProfile], variant: str) -> Table | None:
    """Rows: client counts; columns: wait classes (share of active time) and AAS. The
    sweep's cells (an open-loop cell has a rate: the capacity section's)."""
    rows = [p for p in profiles if p.variant == variant and p.rate is None]
    if not rows:
        return None
    classes = {c for p in rows for c in p.profile.class_shares()}
    ordered = [c for c in CLASS_ORDER if c in classes] + sorted(classes - set(CLASS_ORDER))
    table = Table(
        title=f"wait profile vs clients, variant {variant} (share of active time)",
        title_justify="left",
        show_edge=False,
    )
    table.add_column("clients", justify="right")
    table.add_column("AAS", justify="right")
    for cls in ordered:
        table.add_column(cls, justify="right")
    table.add_column("top wait")
    for p in rows:
        shares = p.profile.class_shares()
        top = next((e for e in p.profile.entries if e.wait_event_type != "CPU"), None)
        table.add_row(
            str(p.clients),
            f"{p.profile.aas:.2f}",
            *(_pct(shares[c]) if c in shares else "" for c in ordered),
            f"{top.label} {top.share:.0%}" if top else "-",
        )
    return table


def queries_table(queries: list[QueryProfile], limit: int = 5) -> Table:
    table = Table(title="top queries by active time", title_justify="left", show_edge=False)
    table.add_column("share", justify="right")
    table.add_column("top wait (share of the query's time)")
    table.add_column("query")
    for q in queries[:limit]:
        # No id: the analysis named what it was (a COMMIT, the statement's text as sampled,
        # or that nothing tells); no text: the id is not in pg_stat_statements.
        text = " ".join((q.query or f"query_id {q.query_id}").split())
        table.add_row(
            _pct(q.share),
            f"{q.top_wait} {q.top_wait_share:.0%}",
            Text(text[:70] + ("…" if len(text) > 70 else "")),
        )
    return table


def background_lines(analysis: WaitAnalysis) -> list[str]:
    """What the server's own processes did beside the workload, in a line each (none when
    they did nothing the samples caught): never part of the workload's active time."""
    lines = []
    for b in analysis.background[:6]:
        waits = ", ".join(f"{w} {share:.0%}" for w, share in b.waits)
        lines.append(f"{b.backend_type}: {b.busy:.2f} at work on average ({waits})")
    spans = analysis.checkpoints
    if spans:
        seconds = sum((c.end_us - c.start_us) / 1e6 for c in spans)
        lines.append(
            f"checkpoints in progress: {len(spans)}, {seconds:,.1f} s in all "
            f"(the longest {max((c.end_us - c.start_us) / 1e6 for c in spans):,.1f} s)"
        )
    return lines


def print_waits(console: Console, analysis: WaitAnalysis, variants: list[str]) -> None:
    """The wait sections of a run's (or a sample's) console summary."""
    for variant in variants:
        table = concurrency_table(analysis.by_clients, variant)
        if table is not None:
            console.print()
            console.print(table)
    if not analysis.by_clients:
        console.print()
        console.print(profile_table(analysis.overall, "wait profile (share of active time)"))
    if analysis.queries:
        console.print()
        console.print(queries_table(analysis.queries))
    states = ", ".join(f"{s} {v:.0%}" for s, v in analysis.overall.states.items())
    rate = analysis.rate
    console.print(
        f"sampler: {analysis.overall.samples:,} samples"
        + (
            f", {rate.achieved_hz:.1f} Hz achieved of {rate.target_hz:g} Hz, lag "
            f"{rate.lag_mean_ms:.2f} ms mean / {rate.lag_max_ms:.1f} ms max, its query "
            f"{rate.query_mean_ms:.2f} ms"
            if rate
            else ""
        )
        + (f"; client sessions: {states}" if states else ""),
        highlight=False,
    )
    beside = background_lines(analysis)
    if beside:
        console.print(
            "the server's own processes, beside the workload (not its active time): "
            + "; ".join(beside),
            highlight=False,
        )
    comparison = analysis.versus_pgws
    if comparison is not None:
        console.print(
            f"vs pg_wait_sampling ({comparison.pgws_rows:,} rows): total-variation distance "
            f"{comparison.tvd:.3f} over client-backend waits (no CPU bucket there)",
            highlight=False,
        )


def live_view(
    analysis: WaitAnalysis | None,
    elapsed: float | None,
    duration: float,
    window_s: float,
    command: str = "sample",
    leading: Finding | str | None = None,
) -> RenderableType:
    """The top-like view of `pgscope sample --live` and `observe --live`, over the last
    `window_s` seconds; `leading`: the finding the rules rank first over them (a string
    when there is none), shown under the header when given. `elapsed` None: the collectors
    are still starting (the sampler may be sampling already)."""
    clock = "starting" if elapsed is None else f"{elapsed:4.0f}/{duration:.0f} s"
    header = Text(f"pgscope {command}  {clock}   last {window_s:.0f} s", style="bold")
    if analysis is None or not analysis.overall.samples:
        return Group(header, Text("waiting for samples…"))
    profile = analysis.overall
    aas = Table(title=f"AAS {profile.aas:.2f} by class", title_justify="left", show_edge=False)
    aas.add_column("class")
    aas.add_column("AAS", justify="right")
    aas.add_column("")
    for cls, share in profile.class_shares().items():
        value = share * profile.aas
        aas.add_row(cls, f"{value:.2f}", "█" * max(1, round(value * 8)))
    parts: list[RenderableType] = [header]
    if leading is not None:
        parts.append(_leading(leading, window_s))
    return Group(
        *parts,
        aas,
        profile_table(profile, "top waits", limit=8),
        queries_table(analysis.queries, limit=5),
        Text(f"{profile.achieved_hz:.1f} samples/s", style="dim"),
    )


def _leading(leading: Finding | str, window_s: float) -> Text:
    text = Text(f"leading finding, last {window_s:.0f} s: ", style="bold")
    if isinstance(leading, str):
        text.append(leading, style="dim")
        return text
    text.append(f"{leading.title} ({leading.confidence})", style="bold red")
    numbers = "; ".join(f"{f.label}: {f.shown()}" for f in leading.evidence[:2])
    if numbers:
        text.append(f"\n  {numbers}", style="dim")
    return text
