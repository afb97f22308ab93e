"""`pgscope compare`: what changed between two runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from pgscope.cli.app import app, out_console, print_json
from pgscope.cli.options import FromFile, FromRepository, JsonFlag, repository_params
from pgscope.words import plain


@app.command()
def compare(
    run_a: Annotated[Path, typer.Argument(help="The run to compare against (before).")],
    run_b: Annotated[Path, typer.Argument(help="The run compared (after).")],
    as_json: JsonFlag = False,
    from_: FromRepository = None,
    from_file: FromFile = None,
) -> None:
    """What changed from RUN_A to RUN_B. First whether they measured the same thing (workload,
    scale, protocol, target, server version, host): a difference is a warning, said before
    any number. Then throughput per cell (with a 95% interval), the model, the wait profile at
    the highest client count, the top finding, the settings that differ (in human units), and
    the CPU profile where both runs have one.

    With --from, a run named by its id is the central repository's (as its push stored its
    analysis; docs/repository.md), and a run folder (a path with a slash, or a folder that
    exists) is read from the folder: last Tuesday's run of a server against today's.

    \b
    Examples:
      pgscope compare results/20261121-113841-scaling-5b4b results/20261122-090000-scaling-77aa
      pgscope compare 20261121-113841-scaling-5b4b results/20261122-090000-scaling-77aa \\
          --from "host=fleet dbname=pgscope"
    """
    from pgscope.analyze.change import compare_runs
    from pgscope.analyze.load import load_analysis

    params = repository_params(from_, from_file, "--from", env=False, required=False)
    if params is None:
        change = compare_runs(load_analysis(run_a), load_analysis(run_b))
    else:
        from pgscope.cli.runs import stored_analysis
        from pgscope.repository.connection import connect

        session, _ = connect(params, writing=False)
        try:
            a, b = (
                load_analysis(run)
                if "/" in str(run) or run.is_dir()
                else stored_analysis(session, str(run))
                for run in (run_a, run_b)
            )
        finally:
            session.close()
        change = compare_runs(a, b)
    if as_json:
        print_json(change.to_json())
        return
    out = out_console()
    out.print(f"[bold]{escape(change.a)} → {escape(change.b)}[/bold]")
    # Whether the two measured the same thing comes before any percentage.
    if change.warning:
        out.print(f"[bold yellow]warning:[/bold yellow] {escape(change.warning)}")
    if change.differences:
        for d in change.differences:
            out.print(
                f"  {d['what']}: {_shown(d['a'])} → {_shown(d['b'])}",
                highlight=False,
                markup=False,
            )
    else:
        same = change.runs["a"]
        out.print(
            "same: "
            + ", ".join(f"{key} {_shown(same[key])}" for key in same if same[key] is not None),
            highlight=False,
            markup=False,
        )
    if change.throughput:
        table = Table(title="throughput", title_justify="left", show_edge=False)
        for name in ("variant", "clients", "A tps", "B tps", "change", "95% interval", ""):
            table.add_column(name, justify="left" if name == "variant" else "right")
        for c in change.throughput:
            table.add_row(
                c.variant,
                str(c.clients),
                f"{c.baseline_tps:,.0f}",
                f"{c.tps:,.0f}",
                f"{c.change_pct:+.1f}%",
                f"{c.ci95_pct[0]:+.1f}% … {c.ci95_pct[1]:+.1f}%" if c.ci95_pct else "n/a",
                c.judgement,
            )
        out.print(table)
    else:
        out.print("throughput: no (variant, clients) cell measured in both runs")
    for model in change.models:
        # Each run's model as its report chose it (AIC): Amdahl has no κ to compare.
        out.print(
            f"model {model['variant']}: {_model(model, 'a')} → {_model(model, 'b')}",
            highlight=False,
        )
    for row in change.capacity:
        what = "the knee (tps completed beyond it)" if row["what"] == "knee" else row["what"]
        out.print(
            f"capacity {row['variant']}, {what}: {_tps(row['a'])} → {_tps(row['b'])}"
            + (f" ({row['change_pct']:+.1f}%" if row["change_pct"] is not None else "")
            + (
                f", 95% interval {row['ci95_pct'][0]:+.1f}% … {row['ci95_pct'][1]:+.1f}%)"
                if row["ci95_pct"]
                else ")"
                if row["change_pct"] is not None
                else ""
            ),
            highlight=False,
            markup=False,
        )
    if change.waits:
        shares = ", ".join(f"{w['class']} {w['a']:.0%} → {w['b']:.0%}" for w in change.waits[:6])
        out.print(f"waits at the highest client count: {shares}", highlight=False)
    out.print(
        f"top finding: {change.findings['a'] or 'none'} → {change.findings['b'] or 'none'}",
        highlight=False,
        markup=False,
    )
    for s in change.settings:
        out.print(f"setting {s['name']}: {s['a']} → {s['b']}", highlight=False, markup=False)
    if change.profile:
        grew = ", ".join(f"{d['name']} {d['delta']:+.1%}" for d in change.profile["grew"][:5])
        out.print(f"CPU profile, grew most: {grew}", highlight=False, markup=False)


def _model(model: dict[str, object], side: str) -> str:
    """One run's chosen model in a line: "usl (σ 0.0123, κ 0.00045, N* 12.3)", "amdahl (σ
    0.052)", "linear"."""
    name = str(model[f"model_{side}"])
    parts = []
    for key, symbol in (("sigma", "σ"), ("kappa", "κ")):
        value = model.get(f"{key}_{side}")
        if isinstance(value, int | float) and (key == "sigma" or name == "usl"):
            parts.append(f"{symbol} {plain(value, 3)}")
    n_star = model.get(f"n_star_{side}")
    if isinstance(n_star, int | float):
        parts.append(f"N* {n_star:.1f}")
    return f"{name} ({', '.join(parts)})" if parts else name


def _shown(value: object) -> str:
    return "not recorded" if value is None else str(value)


def _tps(value: float | None) -> str:
    return "not measured" if value is None else f"{value:,.0f} tps"
