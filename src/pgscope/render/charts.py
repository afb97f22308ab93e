"""The report's charts as plotly figures (JSON-ready dicts). Each draws analysis results and
returns None when there is nothing to draw, so the report says why instead of an empty axis.
Every axis names its unit."""

from __future__ import annotations

import html
import itertools
import math
import re
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from pgscope.analyze.account import Account, Node
from pgscope.analyze.model import RunAnalysis
from pgscope.analyze.timeline import Series
from pgscope.analyze.usl import goodness_of_fit
from pgscope.words import n_clients, plain

PALETTE = [
    "#2563eb",
    "#dc2626",
    "#16a34a",
    "#9333ea",
    "#ea580c",
    "#0891b2",
    "#ca8a04",
    "#db2777",
    "#4b5563",
    "#65a30d",
]
WAIT_COLOURS = {
    "CPU": "#16a34a",
    "LWLock": "#dc2626",
    "Lock": "#ea580c",
    "IO": "#2563eb",
    "IPC": "#9333ea",
    "Client": "#9ca3af",
    "BufferPin": "#ca8a04",
    "Timeout": "#0891b2",
    "Extension": "#db2777",
    "Activity": "#d1d5db",
}
CLIENTS_TITLE = "clients (pgbench connections)"
TPS_TITLE = "throughput (transactions/s)"
# An observation's words: its windows' concurrency and the server's commits, no load generator.
SESSIONS_TITLE = "client sessions (concurrency, each window's)"
COMMITS_TITLE = "throughput (commits/s)"


_MARKUP = re.compile(r"<[^<>]*>|&")


def _t(value: object) -> str:
    """Text from the data (a variant's, a wait class's, a tranche's, a checkpoint's name) as
    plotly may show it: plotly renders a subset of HTML in every label, legend, hover and
    title (`<a href=...>` a link, `<br>` a new line), and a received folder names what it
    likes. Escaped where it holds a tag or an entity; plain text, which plotly shows the same
    either way, is left as it is (`p99<5ms`)."""
    text = str(value)
    return html.escape(text, quote=False) if _MARKUP.search(text) else text


def _titles(result: RunAnalysis) -> tuple[str, str, str]:
    """(the clients axis's title, the throughput axis's, what one measurement is)."""
    if result.observation is not None:
        return SESSIONS_TITLE, COMMITS_TITLE, "each window"
    return CLIENTS_TITLE, TPS_TITLE, "each repeat"


LAYOUT = {
    "template": "plotly_white",
    "margin": {"l": 60, "r": 20, "t": 40, "b": 50},
    "height": 380,
    "legend": {"orientation": "h", "y": -0.2},
}


def _figure(fig: go.Figure, title: str, height: int | None = None) -> dict[str, Any]:
    fig.update_layout(title={"text": _t(title), "font": {"size": 15}}, **LAYOUT)
    if height is not None:
        fig.update_layout(height=height)
    document: dict[str, Any] = fig.to_plotly_json()
    return document


def _interval_bars(cells: list[Any]) -> dict[str, Any]:
    """Asymmetric error bars from each cell's 95% interval (none where it has none)."""

    def up(c: Any) -> float:
        return float(c.tps_ci95[1] - c.tps_mean) if c.tps_ci95 and c.tps_mean else 0.0

    def down(c: Any) -> float:
        return float(c.tps_mean - c.tps_ci95[0]) if c.tps_ci95 and c.tps_mean else 0.0

    return {
        "type": "data",
        "symmetric": False,
        "array": [up(c) for c in cells],
        "arrayminus": [down(c) for c in cells],
    }


def _colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def scalability(result: RunAnalysis) -> dict[str, Any] | None:
    """tps vs clients: every repeat, the mean with its 95% interval, the USL fit and band."""
    variants = result.scalability.variants()
    if len({c.clients for c in result.scalability.cells}) < 2:
        return None
    clients_title, tps_title, each = _titles(result)
    fig = go.Figure()
    for i, variant in enumerate(variants):
        colour = _colour(i)
        steps = [s for s in result.steps if s.variant == variant and s.ok and s.rate is None]
        fig.add_trace(
            go.Scatter(
                x=[s.clients for s in steps],
                y=[s.tps for s in steps],
                mode="markers",
                marker={"color": colour, "opacity": 0.35, "size": 7},
                name=f"{_t(variant)}: {each}",
                legendgroup=_t(variant),
            )
        )
        cells = [c for c in result.scalability.cells if c.variant == variant and c.tps_mean]
        fig.add_trace(
            go.Scatter(
                x=[c.clients for c in cells],
                y=[c.tps_mean for c in cells],
                mode="markers+lines",
                marker={"color": colour, "size": 9},
                line={"color": colour, "width": 1},
                error_y=_interval_bars(cells),
                name=f"{_t(variant)}: mean, 95% interval",
                legendgroup=_t(variant),
            )
        )
        fit = result.scalability.fits.get(variant)
        curve = result.scalability.curves.get(variant)
        if fit is None or curve is None:
            continue
        top = max(c.clients for c in cells)
        if curve.low is not None and curve.high is not None:
            fig.add_trace(
                go.Scatter(
                    x=curve.clients + curve.clients[::-1],
                    y=curve.high + curve.low[::-1],
                    fill="toself",
                    fillcolor=colour,
                    opacity=0.12,
                    line={"width": 0},
                    hoverinfo="skip",
                    name=f"{_t(variant)}: USL 95% band",
                    legendgroup=_t(variant),
                )
            )
        fig.add_trace(
            go.Scatter(
                x=curve.clients,
                y=curve.tps,
                mode="lines",
                line={"color": colour, "dash": "dash"},
                legendgroup=_t(variant),
                name=f"{_t(variant)}: USL σ={plain(fit.sigma, 3)} κ={plain(fit.kappa, 3)} "
                f"({goodness_of_fit(fit.r_squared)})",
            )
        )
        if fit.n_star is not None and fit.n_star <= 2 * top:
            fig.add_vline(
                x=fit.n_star,
                line={"color": colour, "dash": "dot", "width": 1},
                annotation_text=f"N*≈{fit.n_star:.1f}",
            )
    fig.update_xaxes(**_clients_axis(result.scalability.cells, clients_title))
    fig.update_yaxes(title=tps_title, rangemode="tozero")
    observed = result.observation is not None
    return _figure(fig, "Throughput vs concurrency" if observed else "Throughput vs clients")


def latency(result: RunAnalysis) -> dict[str, Any] | None:
    cells = [c for c in result.scalability.cells if c.p50_ms is not None]
    if len({c.clients for c in cells}) < 2:
        return None
    fig = go.Figure()
    for i, variant in enumerate(result.scalability.variants()):
        mine = [c for c in cells if c.variant == variant]
        for dash, key in (("dot", "p50_ms"), ("dash", "p95_ms"), ("solid", "p99_ms")):
            fig.add_trace(
                go.Scatter(
                    x=[str(c.clients) for c in mine],
                    y=[getattr(c, key) for c in mine],
                    mode="lines+markers",
                    line={"color": _colour(i), "dash": dash},
                    name=f"{_t(variant)} {key[:-3]}",
                )
            )
    fig.update_xaxes(**_clients_categories(cells))
    fig.update_yaxes(title="transaction latency (ms)", rangemode="tozero")
    return _figure(fig, "Latency percentiles vs clients")


def variants(result: RunAnalysis) -> dict[str, Any] | None:
    """Mean tps per variant with its 95% interval, per client count."""
    cells = [c for c in result.scalability.cells if c.tps_mean]
    if len({c.variant for c in cells}) < 2:
        return None
    fig = go.Figure()
    for i, clients in enumerate(sorted({c.clients for c in cells})):
        mine = [c for c in cells if c.clients == clients]
        fig.add_trace(
            go.Bar(
                x=[_t(c.variant) for c in mine],
                y=[c.tps_mean for c in mine],
                name=n_clients(clients),
                marker={"color": _colour(i)},
                error_y=_interval_bars(mine),
            )
        )
    fig.update_xaxes(title="variant")
    fig.update_yaxes(title=TPS_TITLE, rangemode="tozero")
    fig.update_layout(barmode="group")
    return _figure(fig, "Variants side by side (mean tps, 95% interval)")


def waits_vs_clients(result: RunAnalysis, variant: str) -> dict[str, Any] | None:
    """Stacked share of active time per wait class, per client count."""
    if result.waits is None:
        return None
    profiles = [p for p in result.waits.by_clients if p.variant == variant and p.rate is None]
    if not profiles:
        return None
    classes = sorted(
        {c for p in profiles for c in p.profile.class_shares()},
        key=lambda c: list(WAIT_COLOURS).index(c) if c in WAIT_COLOURS else 99,
    )
    fig = go.Figure()
    x = [str(p.clients) for p in profiles]
    for cls in classes:
        fig.add_trace(
            go.Bar(
                x=x,
                y=[p.profile.class_shares().get(cls, 0.0) * 100 for p in profiles],
                name=_t(cls),
                marker={"color": WAIT_COLOURS.get(cls, "#6b7280")},
                hovertemplate=f"{_t(cls)}: %{{y:.1f}}%<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(**_clients_categories(profiles, _titles(result)[0]))
    fig.update_yaxes(title="share of active time (%)", range=[0, 100])
    by = "concurrency" if result.observation is not None else "client count"
    return _figure(fig, f"Where active time goes, by {by} ({variant})")


MANY_STEPS = 24  # beyond, the timeline's step bands go unlabelled, drawn in one pass
GAP_S = 1.5  # per-second series: two points further apart have unmeasured time between them
OWN_CHECKPOINT_COLOUR = "#9ca3af"


def _step_gaps(steps: list[tuple[int, str, int, float, float]]) -> list[tuple[float, float]]:
    """From each step's end to the next one's start: a run's steps are separate experiments
    (another client count, pgbench started anew), even where one follows the next within
    milliseconds, so no line joins the last second of one to the first of the next."""
    spans = sorted((start, end) for _, _, _, start, end in steps)
    return [(end, nxt) for (_, end), (nxt, _) in itertools.pairwise(spans)]


def _broken_line(
    points: list[tuple[float, float]], gaps: list[tuple[float, float]]
) -> tuple[list[float], list[float | None]]:
    """x and y of a line that stops where nothing was measured: between two points further
    apart than GAP_S, and across the boundaries between steps. plotly draws a straight line
    from one point to the next unless a null y lies between them."""
    xs: list[float] = []
    ys: list[float | None] = []
    for t, value in points:
        if xs:
            before = xs[-1]
            if t - before > GAP_S or any(before <= high and t >= low for low, high in gaps):
                xs.append((before + t) / 2)
                ys.append(None)
        xs.append(t)
        ys.append(value)
    return xs, ys


def timeline(series: Series | None, *, observed: bool = False) -> dict[str, Any] | None:
    """Throughput, p95 latency and active sessions over the run. `observed`: the steps are an
    observation's windows, slices of one workload, and its lines run on across them."""
    if series is None or not series.tps:
        return None
    # A panel per series that has points: an observation measures no latency (no p95 panel
    # left empty), and its throughput is the server's commits, not a load generator's tps.
    lines = [
        (
            series.tps,
            PALETTE[0],
            "commits/s" if observed else "tps",
            "commits/s (pg_stat_database)" if observed else "tps (transactions/s)",
        )
    ]
    if series.p95_ms:
        lines.append((series.p95_ms, PALETTE[1], "p95 ms", "p95 latency (ms)"))
    titles = [title for *_, title in lines]
    if series.aas:
        titles.append("active sessions (AAS)")
    rows = len(titles)
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.06)
    gaps = [] if observed else _step_gaps(series.steps)
    for row, (points, colour, name, _) in enumerate(lines, start=1):
        xs, ys = _broken_line(points, gaps)
        fig.add_trace(
            go.Scatter(x=xs, y=ys, mode="lines", line={"color": colour, "width": 1}, name=name),
            row=row,
            col=1,
        )
    for cls, points in sorted(series.aas.items()):
        # Sampling goes on between steps, so these areas run on (a null in a stacked area
        # would be drawn as a dive to zero, which no sample showed).
        fig.add_trace(
            go.Scatter(
                x=[t for t, _ in points],
                y=[v for _, v in points],
                mode="lines",
                stackgroup="aas",
                name=f"AAS {_t(cls)}",
                line={"width": 0.5, "color": WAIT_COLOURS.get(cls)},
            ),
            row=rows,
            col=1,
        )
    _step_bands(fig, series, rows)
    _own_checkpoints(fig, series)
    _checkpoints_in_progress(fig, series)
    for t, kind, label in series.markers:
        if kind in ("checkpoint-start", "action", "outlier"):
            colour = "#dc2626" if kind == "outlier" else "#111827"
            fig.add_vline(x=t, line={"color": colour, "dash": "dot", "width": 1})
            fig.add_annotation(
                x=t,
                y=1,
                yref="paper",
                # plotly renders a subset of HTML in text: an action's SQL is shown, not run.
                # The label's head on the chart, all of it (an outlier's why) on hover.
                text=html.escape(label.split(" — ")[0].split(" at ")[0][:24]),
                hovertext=html.escape(label),
                showarrow=False,
                font={"size": 9},
                textangle=-90,
                xanchor="right",
                yanchor="top",
            )
    for row, title in enumerate(titles, start=1):
        fig.update_yaxes(title=title, rangemode="tozero", row=row, col=1)
    started = "the observation" if observed else "the run"
    fig.update_xaxes(title=f"time since {started} started (s)", row=rows, col=1)
    return _figure(fig, "Timeline", height=260 * rows)


CHECKPOINT_COLOUR = "#f59e0b"


def _checkpoints_in_progress(fig: go.Figure, series: Series) -> None:
    """Each checkpoint in progress as a shaded stretch of the throughput panel, one legend
    entry for all: what the server was doing beside the workload, as long as it lasted (a
    spread checkpoint takes minutes; a line at its start would say nothing of that)."""
    spans = [(a, b, label) for a, b, kind, label in series.spans if kind == "checkpoint"]
    if not spans:
        return
    top = max((v for _, v in series.tps), default=1.0) or 1.0
    xs: list[float | None] = []
    ys: list[float | None] = []
    texts: list[str] = []
    for start, end, label in spans:
        xs += [start, start, end, end, start, None]
        ys += [0.0, top, top, 0.0, 0.0, None]
        texts += [html.escape(label)] * 6
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=ys,
            text=texts,
            mode="lines",
            fill="toself",
            fillcolor="rgba(245, 158, 11, 0.15)",
            line={"color": CHECKPOINT_COLOUR, "width": 0.5},
            name="checkpoint in progress",
            hovertemplate="%{text}<extra></extra>",
        ),
        row=1,
        col=1,
    )


def _step_bands(fig: go.Figure, series: Series, rows: int) -> None:
    """A grey band per step across every panel, set in one pass (each add_vrect re-validated
    every shape before it: 2.2 of a 3-step report's 7.5 s under a profiler, and an hour's
    observation in 10-s windows took minutes). Up to MANY_STEPS, each band is labelled
    once, at the top of the first panel."""
    axes = ["" if row == 1 else str(row) for row in range(1, rows + 1)]
    fig.update_layout(
        shapes=[
            {
                "type": "rect",
                "xref": f"x{axis}",
                "yref": f"y{axis} domain",
                "x0": start,
                "x1": end,
                "y0": 0,
                "y1": 1,
                "fillcolor": "#6b7280",
                "line": {"width": 0},
                "opacity": 0.05 if i % 2 else 0.1,
                "layer": "below",
            }
            for i, (_, _, _, start, end) in enumerate(series.steps)
            for axis in axes
        ]
    )
    if len(series.steps) > MANY_STEPS:
        return
    fig.update_layout(
        annotations=[
            *fig.layout.annotations,
            *(
                {
                    "text": f"{_t(variant)} {clients}",
                    "xref": "x",
                    "yref": "y domain",
                    "x": start,
                    "y": 1,
                    "xanchor": "left",
                    "yanchor": "top",
                    "showarrow": False,
                    "font": {"size": 9},
                }
                for _, variant, clients, start, _ in series.steps
            ),
        ]
    )


def _own_checkpoints(fig: go.Figure, series: Series) -> None:
    """pgscope's CHECKPOINT before each step, as a legend entry of its own: a grey dashed
    line across the throughput panel, apart from the checkpoints the server started."""
    own = [(t, label) for t, kind, label in series.markers if kind == "pgscope-checkpoint"]
    if not own:
        return
    top = max((v for _, v in series.tps), default=1.0) or 1.0
    fig.add_trace(
        go.Scatter(
            x=[x for t, _ in own for x in (t, t, None)],
            y=[y for _ in own for y in (0.0, top, None)],
            text=[html.escape(label) for _, label in own for _ in range(3)],
            mode="lines",
            line={"color": OWN_CHECKPOINT_COLOUR, "dash": "dash", "width": 1},
            name="pgscope's CHECKPOINT before a step",
            hovertemplate="pgscope: %{text}<extra></extra>",
        ),
        row=1,
        col=1,
    )


def lwlock_histograms(summaries: list[Any]) -> dict[str, Any] | None:
    """Wait-time histograms of the most waited-for LWLock tranches (usdt)."""
    top = [s for s in summaries if s.count][:6]
    if not top:
        return None
    fig = go.Figure()
    for i, summary in enumerate(top):
        buckets = [b for b in summary.buckets if b.count]
        fig.add_trace(
            go.Bar(
                x=[_ns_label(b.lo_ns) for b in buckets],
                y=[b.count for b in buckets],
                name=_t(
                    f"{summary.object or summary.event} {summary.mode or ''} "
                    f"({summary.count:,} waits)"
                ),
                marker={"color": _colour(i)},
            )
        )
    # Categories, in the order of time: plotly would take them as each trace first shows
    # them, which put a tranche's 4 µs after another's 256 µs.
    lower_bounds = sorted({b.lo_ns for s in top for b in s.buckets if b.count})
    fig.update_layout(barmode="group")
    fig.update_xaxes(
        title="wait time (bucket lower bound, unit in each label)",
        type="category",
        categoryorder="array",
        categoryarray=[_ns_label(ns) for ns in lower_bounds],
    )
    counts = [b.count for s in top for b in s.buckets if b.count]
    fig.update_yaxes(title="waits (count, log scale)", type="log", **_count_ticks(max(counts)))
    return _figure(fig, "LWLock wait-time histograms (kernel-side tracing)")


def checkpoint_phases(items: list[Any]) -> dict[str, Any] | None:
    """A waterfall of each traced checkpoint's phases (ms from its start), each named by who
    started it: the server (for its own reasons), a CHECKPOINT command (an action's), or
    pgscope before a step. pgscope's own come last: the others are what a reader looks for."""
    traced = [item for item in items if item.checkpoint.phases]
    shown = sorted(traced, key=lambda item: item.before_step is not None)[:4]
    if not shown:
        return None
    fig = go.Figure()
    for i, item in enumerate(shown):
        ckpt = item.checkpoint
        if item.before_step is not None:
            who = f"pgscope's, before step {item.before_step}"
        elif "immediate" in ckpt.flags_text:  # a CHECKPOINT command: an action's, a user's
            who = _t(f"requested: {ckpt.flags_text}"[:32])
        else:  # the server's own reasons: time, wal, shutdown ...
            who = _t(f"server: {ckpt.flags_text}"[:32])
        if ckpt.total_ns:
            # The whole checkpoint beneath its phases: a spread checkpoint is minutes long
            # and its traced phases milliseconds (issue 30: 272 s drawn as 31 ms of phases).
            phases_ms = ckpt.phases_ns / 1e6
            fig.add_trace(
                go.Bar(
                    y=[f"#{i + 1} {who}"],
                    x=[ckpt.total_ns / 1e6],
                    base=[0],
                    orientation="h",
                    name="whole checkpoint",
                    legendgroup="whole checkpoint",
                    showlegend=i == 0,
                    marker={"color": "rgba(156, 163, 175, 0.35)"},
                    hovertemplate=(
                        f"whole checkpoint: {ckpt.total_ns / 1e9:,.1f} s; its traced phases "
                        f"{phases_ms:,.1f} ms<extra></extra>"
                    ),
                )
            )
        for phase in ckpt.phases:
            fig.add_trace(
                go.Bar(
                    y=[f"#{i + 1} {who}"],
                    x=[max(phase.duration_ns / 1e6, 0.01)],
                    base=[(phase.start_us - ckpt.start_us) / 1000],
                    orientation="h",
                    name=_t(phase.name),
                    legendgroup=_t(phase.name),
                    showlegend=i == 0,
                    marker={
                        "color": _colour(
                            [
                                "prepare",
                                "clog",
                                "subtrans",
                                "multixact",
                                "marking",
                                "write",
                                "sync",
                                "finish",
                            ].index(phase.name)
                            if phase.name
                            in (
                                "prepare",
                                "clog",
                                "subtrans",
                                "multixact",
                                "marking",
                                "write",
                                "sync",
                                "finish",
                            )
                            else 9
                        )
                    },
                    hovertemplate=f"{_t(phase.name)}: %{{x:.1f}} ms<extra></extra>",
                )
            )
    fig.update_layout(barmode="overlay")
    fig.update_xaxes(title="time since the checkpoint started (ms)")
    fig.update_yaxes(title="checkpoint (who started it)", type="category", autorange="reversed")
    return _figure(fig, "Checkpoint phases (kernel-side tracing)")


def _clients_categories(cells: list[Any], title: str = CLIENTS_TITLE) -> dict[str, Any]:
    """Client counts as categories, in numeric order: the axis shows the counts measured and
    nothing between them (plotly's own numeric ticks put 1.2, 1.4 … between two counts)."""
    measured = sorted({c.clients for c in cells})
    return {
        "title": title,
        "type": "category",
        "categoryorder": "array",
        "categoryarray": [str(n) for n in measured],
    }


def _clients_axis(cells: list[Any], title: str = CLIENTS_TITLE) -> dict[str, Any]:
    """The throughput chart's clients axis: numeric, because the USL curve and its band are
    a function of clients between the counts measured (as categories, 1, 2, 4, 8 would sit
    at equal distances and bend the curve), but ticked at the measured counts only."""
    measured = sorted({c.clients for c in cells})
    return {
        "title": title,
        "type": "linear",
        "tickmode": "array",
        "tickvals": measured,
        "ticktext": [str(n) for n in measured],
    }


def _count_ticks(top: int) -> dict[str, Any]:
    """Ticks of a log axis of counts at whole numbers a reader expects: decades, with 2 and 5
    between them while the axis spans few decades (plotly's own put ticks at 1.5 and 2.5)."""
    decades = [10**k for k in range(len(str(max(top, 1))) + 1)]
    steps = (1, 2, 5) if len(decades) <= 3 else (1,)
    ticks = [d * m for d in decades for m in steps if d * m <= max(top, 1) * 10]
    return {"tickmode": "array", "tickvals": ticks, "ticktext": [f"{t:,}" for t in ticks]}


def _ns_label(ns: int) -> str:
    if ns < 1000:
        return f"{ns} ns"
    if ns < 1_000_000:
        return f"{ns / 1000:g} µs"
    return f"{ns / 1e6:g} ms"


def account_icicle(account: Account, title: str) -> dict[str, Any] | None:
    """The account of active time as an icicle: each node's width its share of active time,
    the root on top; hovering a node gives its share, session-seconds, samples and where the
    figure came from. Nodes below 0.5% are left out (their time stays in their parent's)."""
    if not account.samples:
        return None
    ids, labels, parents, values, hover, colours = [], [], [], [], [], []

    def add(node: Node, parent_id: str, index: str, colour: str, parent: Node | None) -> None:
        if node.kind == "event" and parent is not None and node.name == parent.name:
            for i, child in enumerate(node.children):  # CPU under CPU: one box, not two
                add(child, parent_id, f"{index}.{i}", colour, node)
            return
        node_id = f"{parent_id}/{index}" if parent_id else "root"
        if node.kind == "class":
            colour = WAIT_COLOURS.get(node.name, "#6b7280")
        ids.append(node_id)
        labels.append(
            html.escape(node.name if len(node.name) <= 60 else node.name[:59] + "…", quote=False)
        )
        parents.append(parent_id)
        values.append(node.share)
        hover.append(
            f"{html.escape(node.name, quote=False)}<br>{node.share:.1%} of active time, "
            f"{node.seconds:,.1f} session-seconds<br>{node.samples:,} samples · {_t(node.source)}"
        )
        colours.append(colour)
        shown = [c for c in node.children if c.share >= 0.005]
        # An icicle's children must not exceed their parent: scale them where estimates do.
        total = sum(c.share for c in shown)
        for i, child in enumerate(shown):
            if total > node.share > 0:
                child = Node(
                    child.kind,
                    child.name,
                    child.share * node.share / total,
                    child.seconds,
                    child.samples,
                    child.source,
                    child.detail,
                    child.children,
                )
            add(child, node_id, str(i), colour, node)

    add(account.root, "", "0", "#9ca3af", None)
    fig = go.Figure(
        go.Icicle(
            ids=ids,
            labels=labels,
            parents=parents,
            values=values,
            branchvalues="total",
            hovertext=hover,
            hoverinfo="text",
            marker={"colors": colours},
            tiling={"orientation": "v"},
        )
    )
    return _figure(fig, title, height=520)


OBJECTIVE_COLOURS = ("#dc2626", "#9333ea", "#ea580c", "#0891b2")


def capacity(result: RunAnalysis, variant: str) -> dict[str, Any] | None:
    """Open loop: latency percentiles (from the scheduled start, log axis) against the offered
    rate, p99 against the achieved rate too; each objective's threshold, each capacity with its
    95% interval, the knee measured and predicted, and the closed loop at the same clients."""
    found = result.capacity.of(variant) if result.capacity else None
    cells = [c for c in found.cells if c.p50_ms is not None] if found else []
    if found is None or not cells:
        return None
    fig = go.Figure()
    percentiles = (("dot", "p50_ms", "p50"), ("dash", "p95_ms", "p95"), ("solid", "p99_ms", "p99"))
    for dash, key, name in percentiles:
        fig.add_trace(
            go.Scatter(
                x=[c.rate for c in cells],
                y=[getattr(c, key) for c in cells],
                mode="lines+markers",
                line={"color": PALETTE[0], "dash": dash},
                name=f"{name} vs offered rate",
            )
        )
    steps = [s for s in result.steps if s.variant == variant and s.rate is not None and s.ok]
    fig.add_trace(
        go.Scatter(
            x=[s.rate for s in steps],
            y=[s.latency_ms.p99 for s in steps],
            mode="markers",
            marker={"color": PALETTE[0], "opacity": 0.35, "size": 7},
            name="p99, each repeat",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[c.achieved_tps for c in cells],
            y=[c.p99_ms for c in cells],
            mode="lines+markers",
            line={"color": PALETTE[4], "dash": "dashdot"},
            name="p99 vs achieved rate",
        )
    )
    latencies = [v for c in cells for v in (c.p50_ms, c.p99_ms) if v]
    knee, closed = found.knee, found.knee.closed
    if closed is not None and closed.tps and closed.p99_ms:
        latencies.append(closed.p99_ms)
        fig.add_trace(
            go.Scatter(
                x=[closed.tps],
                y=[closed.p99_ms],
                mode="markers",
                marker={"color": PALETTE[2], "size": 12, "symbol": "diamond"},
                name=f"closed loop at {n_clients(closed.clients)}: p99",
            )
        )
    objectives = {c.objective: c for c in found.capacities}
    thresholds = [c.threshold_ms for c in found.capacities]
    low = min([*latencies, *thresholds]) / 2
    high = max([*latencies, *thresholds]) * 2
    top = max(c.rate for c in cells) * 1.1
    for i, (name, estimate) in enumerate(objectives.items()):
        colour = OBJECTIVE_COLOURS[i % len(OBJECTIVE_COLOURS)]
        fig.add_trace(
            go.Scatter(
                x=[0, top],
                y=[estimate.threshold_ms, estimate.threshold_ms],
                mode="lines",
                line={"color": colour, "dash": "dash", "width": 1},
                name=f"objective {_t(name)}",
            )
        )
        if estimate.tps is None:
            continue
        if estimate.ci95 is not None:
            lo, hi = estimate.ci95
            fig.add_trace(
                go.Scatter(
                    x=[lo, hi, hi, lo],
                    y=[low, low, high, high],
                    fill="toself",
                    fillcolor=colour,
                    opacity=0.12,
                    line={"width": 0},
                    hoverinfo="skip",
                    name=f"capacity {_t(name)}: 95% interval",
                )
            )
        fig.add_trace(
            go.Scatter(
                x=[estimate.tps, estimate.tps],
                y=[low, high],
                mode="lines",
                line={"color": colour, "width": 2},
                name=f"capacity {_t(name)}: {estimate.tps:,.0f} tps",
            )
        )
    for x, label, dash in (
        (knee.saturated_tps, "knee, measured (completed beyond it)", "dot"),
        (knee.predicted_tps, "knee, predicted by the USL fit", "dashdot"),
    ):
        if x is not None:
            fig.add_trace(
                go.Scatter(
                    x=[x, x],
                    y=[low, high],
                    mode="lines",
                    line={"color": PALETTE[8], "dash": dash, "width": 1},
                    name=f"{label}: {x:,.0f} tps",
                )
            )
    fig.update_xaxes(title="rate (transactions/s)", rangemode="tozero")
    fig.update_yaxes(
        title="latency from the scheduled start (ms, log scale)",
        type="log",
        range=[math.log10(low), math.log10(high)],
    )
    return _figure(
        fig,
        f"Latency against the offered rate ({variant}, {n_clients(found.clients)}, open loop)",
        height=460,
    )


def achieved(result: RunAnalysis, variant: str) -> dict[str, Any] | None:
    """Open loop: the rate completed against the rate offered, beside the line where they are
    equal; the server kept up where its points sit on it."""
    found = result.capacity.of(variant) if result.capacity else None
    cells = [c for c in found.cells if c.achieved_tps is not None] if found else []
    if not cells:
        return None
    fig = go.Figure()
    top = max(max(c.rate for c in cells), max(c.achieved_tps or 0.0 for c in cells)) * 1.05
    fig.add_trace(
        go.Scatter(
            x=[0, top],
            y=[0, top],
            mode="lines",
            line={"color": PALETTE[8], "dash": "dot", "width": 1},
            name="achieved = offered",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[c.rate for c in cells],
            y=[c.achieved_tps for c in cells],
            mode="lines+markers",
            marker={"color": PALETTE[0], "size": 9},
            error_y=_interval_bars([c.as_cell() for c in cells]),
            name="achieved (mean, 95% interval)",
        )
    )
    fig.update_xaxes(title="offered rate (transactions/s)", rangemode="tozero")
    fig.update_yaxes(title="achieved rate (transactions/s)", rangemode="tozero")
    return _figure(fig, f"Rate achieved against rate offered ({variant})")
