"""The HTML report: one self-contained file (`report.html` in the run folder) that works
offline: plotly.js and the flame graph views are inlined. It renders analysis results; where
a section has nothing to show, it says which collector was missing and why.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import jinja2
from plotly.offline import get_plotlyjs

from pgscope.analyze import profile, timeline, usdt
from pgscope.analyze.run import RunResult
from pgscope.render import charts
from pgscope.render.variants import EVIDENCE_COLUMNS
from pgscope.store import RunStore

MAX_FLAMES = 3  # per kind: beyond that the report gets long and heavy (~300 kB each)


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("pgscope.render", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _missing(result: RunResult, name: str, purpose: str) -> str:
    """Why collector `name` gave nothing, from the run's own record."""
    row = next((c for c in result.collectors if c["name"] == name), None)
    if row is None:
        return (
            f"The {name} collector was not selected for this run ({purpose}); add it with "
            f"--collectors or a [collectors] table."
        )
    if not row["available"]:
        return f"The {name} collector could not run here: {row['reason']}."
    if row["status"] == "failed":
        return f"The {name} collector failed: {row['error']}."
    return f"The {name} collector ran but recorded nothing for this section."


def _flames(store: RunStore, result: RunResult) -> list[tuple[str, str]]:
    from pgscope.render.flame import diff_flame_html, flame_html

    if not store.has_table("profile_stacks"):
        return []
    pages: list[tuple[str, str]] = []
    variants = result.scaling.variants()
    for kind, what in (("cpu", "On-CPU"), ("offcpu", "Off-CPU (where processes sleep)")):
        loaded = []
        for variant in variants[:MAX_FLAMES]:
            prof = profile.load_profile(
                store, kind, profile.steps_of(store, variant), label=variant
            )
            if prof.total:
                loaded.append(prof)
                pages.append(
                    (f"{what}: {variant}", flame_html(prof, f"{what} profile, variant {variant}"))
                )
        if len(loaded) >= 2:
            a, b = loaded[0], loaded[-1]
            pages.append(
                (
                    f"{what}: what changed from {a.label} to {b.label}",
                    diff_flame_html(
                        a, b, profile.differential(a, b), f"{what}: {a.label} → {b.label}"
                    ),
                )
            )
        elif len(loaded) == 1 and len({c.clients for c in result.scaling.cells}) >= 2:
            clients = sorted({c.clients for c in result.scaling.cells})
            low = profile.load_profile(
                store,
                kind,
                profile.steps_of(store, variants[0], clients[0]),
                label=f"{clients[0]} clients",
            )
            high = profile.load_profile(
                store,
                kind,
                profile.steps_of(store, variants[0], clients[-1]),
                label=f"{clients[-1]} clients",
            )
            if low.total and high.total:
                pages.append(
                    (
                        f"{what}: what changed from {low.label} to {high.label}",
                        diff_flame_html(
                            low,
                            high,
                            profile.differential(low, high),
                            f"{what}: {low.label} → {high.label}",
                        ),
                    )
                )
    return pages


def report_html(result: RunResult) -> str:
    store = RunStore.open(result.run_dir)
    try:
        series = timeline.series(store.db)
        traced = usdt.has_usdt(store.db)
        lwlocks = usdt.latency(store.db, "lwlock_wait") if traced else []
        lock_waits = usdt.latency(store.db, "lock_wait") if traced else []
        checkpoints = usdt.checkpoints(store.db) if traced else []
        flames = _flames(store, result)
        settings: dict[str, list[dict[str, Any]]] = {}
        for row in store.query(
            "SELECT variant, name, setting, unit, source FROM settings ORDER BY variant, name"
        ):
            settings.setdefault(row["variant"], []).append(row)
    finally:
        store.close()
    variants = result.scaling.variants()
    figures: dict[str, Any] = {
        "scalability": charts.scalability(result),
        "latency": charts.latency(result),
        "variants": charts.variants(result),
        "timeline": charts.timeline(series),
        "lwlocks": charts.lwlock_histograms(lwlocks),
        "checkpoints": charts.checkpoint_phases(checkpoints),
    }
    wait_charts = {f"waits-{i}": charts.waits_vs_clients(result, v) for i, v in enumerate(variants)}
    wait_charts = {k: v for k, v in wait_charts.items() if v is not None}
    figures.update(wait_charts)
    figures = {k: v for k, v in figures.items() if v is not None}
    run = result.run
    waits = result.waits
    rate = waits.rate if waits else None
    shown = [
        (title, attr, fmt)
        for title, attr, fmt in EVIDENCE_COLUMNS
        if any(getattr(e, attr) for e in result.evidence)
    ]
    evidence_rows = (
        [
            [
                e.variant,
                str(e.clients),
                *(
                    "-" if getattr(e, attr) is None else fmt.format(getattr(e, attr))
                    for _, attr, fmt in shown
                ),
            ]
            for e in result.evidence
        ]
        if shown
        else []
    )
    from pgscope.collect import registry

    selected = {c["name"] for c in result.collectors}
    not_selected = [
        (name, f"on request: {cls.summary}")
        for name, cls in registry().items()
        if name not in selected and not name.startswith("test")
    ]
    host = result.host
    charts_json = json.dumps(figures, default=float).replace("</", "<\\/")
    started = dt.datetime.fromtimestamp((run["started_us"] or 0) / 1e6, dt.UTC)
    return (
        _environment()
        .get_template("report.html.j2")
        .render(
            run=run,
            started=started.strftime("%Y-%m-%d %H:%M"),
            server=(run["server_version"] or "server version unknown").split(" on ")[0],
            host_line=f"{host.get('usable_cpus')} CPUs ({host.get('cpu_model')}), "
            f"{(host.get('memory_bytes') or 0) / 2**30:.0f} GiB",
            diagnosis=result.diagnosis,
            not_assessed=result.diagnosis.not_assessed if result.diagnosis else [],
            charts=figures,
            charts_json=charts_json,
            plotly_js=get_plotlyjs(),
            fits=list(result.scaling.fits.items()),
            cells=result.scaling.cells,
            wait_charts=list(wait_charts),
            waits=waits,
            sampler_line=(
                f"{waits.overall.samples:,} samples at {rate.achieved_hz:.1f} Hz "
                f"(aimed at {rate.target_hz:g}); reading the status array took "
                f"{rate.query_mean_ms:.2f} ms on average"
                if waits and rate
                else ""
            ),
            lock_waits=lock_waits[:12],
            dips=result.dips,
            flames=flames,
            comparisons=result.comparisons,
            evidence_titles=[title for title, _, _ in shown],
            evidence_rows=evidence_rows,
            collectors=result.collectors,
            not_selected=not_selected,
            gaps=result.gaps,
            settings=list(settings.items()),
            host={k: v for k, v in host.items() if k != "hostname"},
            missing={
                "activity": _missing(result, "activity", "wait-event sampling"),
                "usdt": _missing(result, "usdt", "kernel-side tracing of the server's probes"),
                "usdt_checkpoint": (
                    _missing(result, "usdt", "checkpoint phases") if not checkpoints else ""
                ),
                "perf": _missing(result, "perf", "CPU profiles"),
            },
        )
    )


def write_report(result: RunResult) -> Path:
    path = result.run_dir / "report.html"
    path.write_text(report_html(result))
    return path
