"""The HTML report: one self-contained file (`report.html` in the run folder) that works
offline: plotly.js and the flame graph views are inlined. It renders the run's analysis and
nothing else (it can be rendered from `summary.json` alone); where a section has nothing to
show, it says which collector was missing and why.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
from plotly.offline import get_plotlyjs

from pgscope.analyze.model import RunAnalysis
from pgscope.files import write_atomic
from pgscope.render import charts
from pgscope.render.account import heading, tree_lines
from pgscope.render.capacity import COLUMNS, cell_row
from pgscope.render.console import step_problem
from pgscope.render.flame import flame_page
from pgscope.render.variants import evidence_table
from pgscope.render.waits import background_lines
from pgscope.words import human_bytes, n_clients


def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("pgscope.render", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["n_clients"] = n_clients
    return environment


def _host_rows(host: dict[str, Any]) -> dict[str, Any]:
    """The host as the environment table shows it: sizes in binary units (memory 23.5 GiB,
    not memory_bytes 25276510208); the hostname left out."""
    rows: dict[str, Any] = {}
    for key, value in host.items():
        if key == "hostname":
            continue
        if key.endswith("_bytes") and isinstance(value, int | float):
            rows[key.removesuffix("_bytes")] = human_bytes(value)
        else:
            rows[key] = value
    return rows


# The collectors `observe` runs on request, and its flag for each.
OBSERVE_FLAGS = {"usdt": "--trace", "perf": "--profile"}


def _missing(analysis: RunAnalysis, name: str, purpose: str) -> str:
    """Why collector `name` gave nothing, from the run's own record."""
    row = next((c for c in analysis.environment.collectors if c["name"] == name), None)
    if row is None:
        if analysis.observation is not None:
            # observe chooses its collectors by these flags, not by --collectors.
            flag = OBSERVE_FLAGS.get(name)
            how = f"observe with {flag}" if flag else "observe does not run it"
            return f"The {name} collector did not run in this observation ({purpose}): {how}."
        return (
            f"The {name} collector was not selected for this run ({purpose}); add it with "
            f"--collectors or a [collectors] table."
        )
    if not row["available"]:
        return f"The {name} collector could not run here: {row['reason']}."
    if row["status"] == "failed":
        return f"The {name} collector failed: {row['error']}."
    return f"The {name} collector ran but recorded nothing for this section."


def _step_rows(analysis: RunAnalysis) -> list[dict[str, Any]]:
    """The steps worth a line of their own: those not ok, and those with failed or retried
    transactions (what failed quoted; no tps where none was measured)."""
    rows = []
    for step in analysis.steps:
        kinds = (step.failed_serialization, step.failed_deadlock, step.failed_other)
        if step.status == "ok" and not any(kinds) and not step.retried_xacts:
            continue
        rows.append(
            {
                "step": step,
                "failed": " / ".join("-" if k is None else f"{k:,}" for k in kinds),
                "problem": "" if step.status == "ok" else step_problem(step),
            }
        )
    return rows


def _capacity(analysis: RunAnalysis, figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Per variant with offered rates: its charts (added to `figures`), its table's rows and
    its knee's judgement."""
    if analysis.capacity is None:
        return []
    knees = analysis.diagnosis.knees if analysis.diagnosis else []
    out = []
    for i, variant in enumerate(analysis.capacity.variants):
        chart = charts.capacity(analysis, variant.variant)
        achieved = charts.achieved(analysis, variant.variant)
        if chart is not None:
            figures[f"capacity-{i}"] = chart
        if achieved is not None:
            figures[f"achieved-{i}"] = achieved
        out.append(
            {
                "section": variant,
                "chart": f"capacity-{i}" if chart is not None else None,
                "achieved_chart": f"achieved-{i}" if achieved is not None else None,
                "rows": [cell_row(c, analysis.capacity.objectives) for c in variant.cells],
                "knee": next((k for k in knees if k.variant == variant.variant), None),
            }
        )
    return out


def report_html(analysis: RunAnalysis, offered: Mapping[str, str] | None = None) -> str:
    """The report; `offered` (collector name -> what it records) lists the collectors this
    pgscope has, so that the report can name those the run did not select."""
    variants = analysis.scalability.variants()
    locks, checkpoints = analysis.locks, analysis.checkpoints
    figures: dict[str, Any] = {
        "scalability": charts.scalability(analysis),
        "latency": charts.latency(analysis),
        "variants": charts.variants(analysis),
        "timeline": charts.timeline(
            analysis.timeline.series, observed=analysis.observation is not None
        ),
        "lwlocks": charts.lwlock_histograms(locks.lwlocks),
        "checkpoints": charts.checkpoint_phases(checkpoints.items),
    }
    wait_charts = {
        f"waits-{i}": charts.waits_vs_clients(analysis, v) for i, v in enumerate(variants)
    }
    wait_charts = {k: v for k, v in wait_charts.items() if v is not None}
    figures.update(wait_charts)
    accounts = analysis.peak_accounts()
    account_charts = {
        f"account-{i}": charts.account_icicle(a, heading(a)[:-1].capitalize())
        for i, a in enumerate(accounts)
    }
    figures.update({k: v for k, v in account_charts.items() if v is not None})
    capacity = _capacity(analysis, figures)
    figures = {k: v for k, v in figures.items() if v is not None}
    waits = analysis.waits
    rate = waits.rate if waits else None
    titles, rows = evidence_table(analysis)
    selected = {c["name"] for c in analysis.environment.collectors}
    not_selected = [
        (name, f"on request: {what}")
        for name, what in (offered or {}).items()
        if name not in selected and not name.startswith("test")
    ]
    host = analysis.environment.host
    charts_json = json.dumps(figures, default=float).replace("</", "<\\/")
    started = dt.datetime.fromtimestamp((analysis.started_us or 0) / 1e6, dt.UTC)
    return (
        _environment()
        .get_template("report.html.j2")
        .render(
            run=analysis,
            started=started.strftime("%Y-%m-%d %H:%M"),
            server=(analysis.target.server_version or "server version unknown").split(" on ")[0],
            host_line=f"{host.get('usable_cpus')} CPUs ({host.get('cpu_model')}), "
            f"{human_bytes(host.get('memory_bytes') or 0)}",
            diagnosis=analysis.diagnosis,
            not_assessed=analysis.diagnosis.not_assessed if analysis.diagnosis else [],
            charts=figures,
            charts_json=charts_json,
            plotly_js=get_plotlyjs(),
            fits=list(analysis.scalability.fits.items()),
            capacity=capacity,
            capacity_columns=[
                *COLUMNS,
                *(analysis.capacity.objectives if analysis.capacity else []),
            ],
            cells=analysis.scalability.cells,
            # An observation's windows are no pgbench steps: their figures are in Windows.
            step_rows=_step_rows(analysis) if analysis.observation is None else [],
            wait_charts=list(wait_charts),
            accounts=[
                (f"account-{i}", heading(a), tree_lines(a), a.closed)
                for i, a in enumerate(accounts)
                if f"account-{i}" in figures
            ],
            waits=waits,
            background=background_lines(waits) if waits else [],
            sampler_line=(
                f"{waits.overall.samples:,} samples at {rate.achieved_hz:.1f} Hz "
                f"(aimed at {rate.target_hz:g}); reading the status array took "
                f"{rate.query_mean_ms:.2f} ms on average"
                if waits and rate
                else ""
            ),
            lock_waits=locks.lock_waits[:12],
            dips=analysis.timeline.dips,
            flames=[(g.title, flame_page(g)) for g in analysis.cpu.flames],
            comparisons=analysis.variants.comparisons,
            evidence_titles=titles,
            evidence_rows=rows,
            collectors=analysis.environment.collectors,
            not_selected=not_selected,
            gaps=analysis.environment.gaps,
            settings=list(analysis.environment.settings.items()),
            host=_host_rows(host),
            missing={
                "activity": _missing(analysis, "activity", "wait-event sampling"),
                "usdt": _missing(analysis, "usdt", "kernel-side tracing of the server's probes"),
                "usdt_checkpoint": (
                    _missing(analysis, "usdt", "checkpoint phases") if not checkpoints.items else ""
                ),
                "perf": _missing(analysis, "perf", "CPU profiles"),
            },
        )
    )


def write_report(
    analysis: RunAnalysis, folder: Path | None = None, offered: Mapping[str, str] | None = None
) -> Path:
    return write_atomic((folder or analysis.folder) / "report.html", report_html(analysis, offered))
