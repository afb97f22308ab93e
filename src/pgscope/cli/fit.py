"""`pgscope fit usl`: the USL fit of measurements a user brings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pgscope.analyze.uslinput import CLIENTS_COLUMNS, THROUGHPUT_COLUMNS
from pgscope.cli.app import fit_app, out_console, print_json
from pgscope.errors import UsageError
from pgscope.words import plain


@fit_app.command("usl")
def fit_usl_command(
    csv_file: Annotated[
        Path,
        typer.Argument(
            metavar="FILE.csv",
            help="Measurements: two numeric columns, clients then throughput, with or without "
            "a header row (1,955.2). Among more columns, the header names them: clients as "
            f"one of {', '.join(CLIENTS_COLUMNS)}; throughput as one of "
            f"{', '.join(THROUGHPUT_COLUMNS)}.",
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the fit as JSON.")] = False,
    bootstrap: Annotated[
        int, typer.Option(help="Bootstrap resamples for confidence intervals (0: none).")
    ] = 500,
) -> None:
    """Fit the Universal Scalability Law to your own measurements.

    Model: X(N) = λN / (1 + σ(N−1) + κN(N−1)), fitted by least squares with σ, κ ≥ 0;
    Amdahl (κ=0) and linear models are compared by AIC. Repeated client counts are fine.
    """
    from pgscope.analyze.usl import fit_usl
    from pgscope.analyze.uslinput import read_csv

    if bootstrap < 0:
        raise UsageError(f"--bootstrap {bootstrap}: must be >= 0")
    clients, throughput = read_csv(str(csv_file))
    fit = fit_usl(clients, throughput, bootstrap=bootstrap)
    if as_json:
        print_json(fit.to_json())
        return
    out = out_console()
    out.print(f"{csv_file}: {fit.points} points, {fit.distinct_clients} client counts")
    for key, value in (
        ("λ", fit.lam),
        ("σ", fit.sigma),
        ("κ", fit.kappa),
        ("N*", fit.n_star),
        ("X(N*)", fit.x_max),
    ):
        name = {"λ": "lambda", "σ": "sigma", "κ": "kappa", "N*": "n_star", "X(N*)": "x_max"}[key]
        ci = fit.ci.get(name)
        shown = "-" if value is None else plain(value, 6)
        out.print(
            f"  {key:<6} {shown:>12}" + (f"   95% CI {plain(ci[0])} – {plain(ci[1])}" if ci else "")
        )
    out.print(f"  R²     {fit.r_squared:>12.4f}   CI method: {fit.ci_method}")
    aics = ", ".join(f"{n} {m.aic:.1f}" for n, m in fit.models.items())
    out.print(f"  AIC: {aics}")
    out.print(fit.describe())
    for warning in fit.warnings:
        out.print(f"warning: {warning}")
