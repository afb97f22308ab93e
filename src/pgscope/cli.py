"""The `pgscope` command line: arguments -> spec -> runner/analysis -> renderer.

Kept thin: each command parses its flags, calls one function elsewhere and renders. Every
error reaches the user as one line (`pgscope: error: ...`) with a documented exit code
(docs/exit-codes.md); `--debug` adds the traceback.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import sys
import traceback
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from pgscope import __version__
from pgscope.errors import ExitCode, Interrupted, PgscopeError, UsageError

HELP = """Find out why PostgreSQL stops scaling, and prove it.

pgscope drives load with pgbench at growing client counts against a throw-away cluster it
starts itself (or an existing server with --dsn), records every measurement in a run folder
(results/<run-id>/run.duckdb), and fits the Universal Scalability Law to say where and why
throughput stops growing.

\b
Start here:
  pgscope doctor                      what this machine can measure
  pgscope recipes                     the bundled experiments
  pgscope run scaling --quick         a 3-minute scalability sweep
  pgscope fit usl data.csv            fit USL to your own measurements
"""

app = typer.Typer(
    help=HELP,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)
fit_app = typer.Typer(
    help="Fit scalability models to measurements you bring.", no_args_is_help=True
)
app.add_typer(fit_app, name="fit")

DEFAULT_RESULTS = Path(os.environ.get("PGSCOPE_RESULTS", "results"))


def _out() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _err() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
) -> None:
    if version:
        typer.echo(f"pgscope {__version__}")
        raise typer.Exit(0)


# ----------------------------------------------------------------------------------------------
# run


def safe_command_line(argv: list[str]) -> str:
    """The command line as recorded in the store: a --dsn value loses its password."""
    from pgscope.target.conn import ConnParams

    masked: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            arg, hide_next = ConnParams.from_dsn(arg).conninfo(), False
        elif arg == "--dsn":
            hide_next = True
        elif arg.startswith("--dsn="):
            arg = "--dsn=" + ConnParams.from_dsn(arg[len("--dsn=") :]).conninfo()
        masked.append(arg)
    return shlex.join(masked)


def _absolute_script(text: str) -> str:
    """Make a --script FILE[@weight] path absolute against the current directory (spec files
    resolve theirs against the spec's own directory)."""
    name, sep, weight = text.rpartition("@")
    if not sep or not weight.isdigit():
        name, sep, weight = text, "", ""
    path = Path(name).expanduser()
    return f"{path if path.is_absolute() else Path.cwd() / path}{sep}{weight}"


@app.command()
def run(
    recipe: Annotated[
        str,
        typer.Argument(
            help="A bundled recipe name (see `pgscope recipes`) or a spec file (.toml)."
        ),
    ] = "scaling",
    quick: Annotated[
        bool,
        typer.Option("--quick", help="Use the recipe's [quick] settings: fewer, shorter steps."),
    ] = False,
    clients: Annotated[
        str | None,
        typer.Option(
            help="Client counts, e.g. 1,2,4-8 (default: the recipe's; 'auto' = 1 to 4x cores)."
        ),
    ] = None,
    duration: Annotated[
        float | None, typer.Option(help="Measured seconds per step (after the warm-up).")
    ] = None,
    warmup: Annotated[
        float | None,
        typer.Option(
            help="Seconds run before each step's measurement and left out of its statistics."
        ),
    ] = None,
    repeats: Annotated[
        int | None,
        typer.Option(help="Times each (variant, clients) cell is measured, interleaved."),
    ] = None,
    scale: Annotated[
        int | None,
        typer.Option(
            help="pgbench scale factor to initialise (0: the scripts need no pgbench tables)."
        ),
    ] = None,
    workload: Annotated[
        str | None, typer.Option(help="pgbench builtin: select-only, tpcb-like or simple-update.")
    ] = None,
    script: Annotated[
        list[str] | None,
        typer.Option(
            help="A pgbench script FILE[@weight]; repeatable. Replaces the recipe's workload "
            "unless --workload is also given."
        ),
    ] = None,
    init_sql: Annotated[
        Path | None,
        typer.Option(
            "--init-sql", help="SQL file run once before the first step (schema for scripts)."
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Server setting NAME=VALUE for every variant; repeatable "
            "(embedded clusters only).",
        ),
    ] = None,
    protocol: Annotated[
        str | None,
        typer.Option(help="pgbench query protocol: simple, extended or prepared (default)."),
    ] = None,
    order: Annotated[
        str | None,
        typer.Option(help="Step order: random (interleaved, the default) or sequential."),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed for the randomised step order.")] = None,
    dsn: Annotated[
        str | None,
        typer.Option(
            help="Run against an existing server instead of an embedded cluster. Read-only "
            "unless --allow-writes; never changes its settings."
        ),
    ] = None,
    allow_writes: Annotated[
        bool,
        typer.Option(
            "--allow-writes", help="With --dsn: allow creating tables and write workloads."
        ),
    ] = False,
    pg_bin: Annotated[
        Path | None,
        typer.Option(
            "--pg-bin",
            help="PostgreSQL bin directory (default: pg_config, else the newest "
            "/usr/lib/postgresql/*/bin).",
        ),
    ] = None,
    run_as: Annotated[
        str | None,
        typer.Option(
            "--run-as",
            help="When root: the account that runs the embedded server (default: postgres).",
        ),
    ] = None,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            "--work-dir",
            help="Where the throw-away cluster's directory is created (default: $TMPDIR).",
        ),
    ] = None,
    results_dir: Annotated[
        Path,
        typer.Option("--results-dir", help="Where run folders are written ($PGSCOPE_RESULTS)."),
    ] = DEFAULT_RESULTS,
    no_xact_log: Annotated[
        bool,
        typer.Option(
            "--no-xact-log",
            help="Do not keep the per-transaction latency log (Parquet) of "
            "each step; percentiles are stored either way.",
        ),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print one JSON document (schema in docs/json.md) on stdout."),
    ] = False,
) -> None:
    """Run an experiment: sweep client counts (and variants), store everything, fit USL.

    \b
    Examples:
      pgscope run scaling --quick
      pgscope run scaling --clients 1,2,4,8 --duration 20 --repeats 3
      pgscope run my.toml --set shared_buffers=1GB
      pgscope run --script insert.sql --init-sql schema.sql --scale 0 --clients 1-8
      pgscope run --dsn "host=db1 dbname=bench user=me" --workload select-only
    """
    from pgscope.analyze.run import load_run
    from pgscope.render.console import ConsoleReporter, print_summary
    from pgscope.render.json_doc import run_document
    from pgscope.runner import RunOptions, execute
    from pgscope.spec import load_spec, parse_client_list, parse_setting

    overrides: dict[str, Any] = {}
    flags: dict[str, str] = {}

    def override(field: str, flag: str, value: Any) -> None:
        if value is not None:
            overrides[field] = value
            flags[field] = flag

    override(
        "clients",
        "--clients",
        None if clients is None else "auto" if clients == "auto" else parse_client_list(clients),
    )
    override("duration", "--duration", duration)
    override("warmup", "--warmup", warmup)
    override("repeats", "--repeats", repeats)
    override("scale", "--scale", scale)
    override("workload", "--workload", workload)
    override("protocol", "--protocol", protocol)
    override("order", "--order", order)
    override("seed", "--seed", seed)
    if script:
        override("scripts", "--script", [_absolute_script(s) for s in script])
        if workload is None:
            override("workload", "--script", None)
            overrides["workload"] = None
    if init_sql is not None:
        override("init_sql", "--init-sql", str(init_sql.expanduser().absolute()))
    settings = dict(parse_setting(s) for s in set_ or [])
    loaded = load_spec(
        recipe, quick=quick, overrides=overrides, override_flags=flags, extra_settings=settings
    )
    options = RunOptions(
        results_dir=results_dir,
        command_line=safe_command_line(["pgscope", *sys.argv[1:]]),
        pg_bin=pg_bin,
        dsn=dsn,
        allow_writes=allow_writes,
        run_as=run_as,
        work_dir=work_dir,
        keep_xact_logs=not no_xact_log,
    )
    err = _err()
    outcome = execute(loaded, options, ConsoleReporter(err))
    result = load_run(outcome.run_dir)
    document = run_document(result)
    (outcome.run_dir / "summary.json").write_text(json.dumps(document, indent=2, default=str))
    recorder = Console(record=True, width=110, file=io.StringIO())
    print_summary(recorder, result)
    (outcome.run_dir / "summary.txt").write_text(recorder.export_text())
    if as_json:
        _print_json(document)
    else:
        print_summary(_out(), result)
    if outcome.error is not None:
        if isinstance(outcome.error, Interrupted):
            kept = sum(1 for s in result.steps if s["status"] == "ok")
            outcome.error.add_note(f"kept {kept} finished steps in {outcome.run_dir}")
        raise outcome.error
    if outcome.status == "partial":
        raise typer.Exit(ExitCode.RUN_FAILED)


# ----------------------------------------------------------------------------------------------
# recipes, runs, report


@app.command()
def recipes(
    name: Annotated[str | None, typer.Argument(help="Show this recipe's spec in full.")] = None,
) -> None:
    """List the bundled recipes, or show one recipe's spec (its knobs, with comments)."""
    from pgscope.spec import recipe_names, recipe_path, recipe_summary

    if name is not None:
        typer.echo(recipe_path(name).read_text(), nl=False)
        return
    for recipe in recipe_names():
        typer.echo(f"{recipe:<12} {recipe_summary(recipe)}")


@app.command()
def runs(
    results_dir: Annotated[
        Path, typer.Option("--results-dir", help="Where run folders are.")
    ] = DEFAULT_RESULTS,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the runs in the results folder, newest first."""
    from pgscope.store import list_runs

    rows = list_runs(results_dir)
    if as_json:
        _print_json(rows)
        return
    if not rows:
        typer.echo(f"no runs in {results_dir}")
        return
    for row in rows:
        typer.echo(
            f"{row['run_id']:<44} {row['status']:<12} {row['steps_ok']:>3}/"
            f"{row['steps']:<3} steps  {row['recipe']}"
        )


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run folder (results/<run-id>).")],
    fmt: Annotated[str, typer.Option("--format", help="text or json.")] = "text",
) -> None:
    """Re-render a run's summary from its store, without running anything."""
    from pgscope.analyze.run import load_run
    from pgscope.render.console import print_summary
    from pgscope.render.json_doc import run_document

    if fmt not in ("text", "json"):
        raise UsageError(f"--format {fmt!r}: expected text or json")
    result = load_run(run_dir)
    if fmt == "json":
        _print_json(run_document(result))
    else:
        print_summary(_out(), result)


# ----------------------------------------------------------------------------------------------
# fit, doctor


@fit_app.command("usl")
def fit_usl_command(
    csv_file: Annotated[
        Path,
        typer.Argument(metavar="FILE.csv", help="Measurements with columns clients,throughput."),
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
    from pgscope.analyze.usl import fit_usl, read_csv

    if bootstrap < 0:
        raise UsageError(f"--bootstrap {bootstrap}: must be >= 0")
    clients, throughput = read_csv(str(csv_file))
    fit = fit_usl(clients, throughput, bootstrap=bootstrap)
    if as_json:
        _print_json(fit.to_json())
        return
    out = _out()
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
        shown = "-" if value is None else f"{value:.6g}"
        out.print(
            f"  {key:<6} {shown:>12}" + (f"   95% CI {ci[0]:.4g} – {ci[1]:.4g}" if ci else "")
        )
    out.print(f"  R²     {fit.r_squared:>12.4f}   CI method: {fit.ci_method}")
    aics = ", ".join(f"{n} {m.aic:.1f}" for n, m in fit.models.items())
    out.print(f"  AIC: {aics}")
    out.print(fit.describe())
    for warning in fit.warnings:
        out.print(f"warning: {warning}")


@app.command()
def doctor(
    pg_bin: Annotated[
        Path | None, typer.Option("--pg-bin", help="PostgreSQL bin directory.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Check what this machine can do: binaries, probes, root, bpftrace, perf, tracefs."""
    from pgscope.doctor import run_checks

    checks = run_checks(pg_bin)
    if as_json:
        _print_json({"checks": [c.to_json() for c in checks], "ok": all(c.ok for c in checks)})
        return
    out = _out()
    for check in checks:
        mark = "[green]ok[/green]  " if check.ok else "[red]MISSING[/red]"
        out.print(f"{mark} {check.name:<20} {check.detail}")
        if not check.ok and check.fix:
            out.print(f"        fix: {check.fix}   (needed for: {check.needed_for})")


# ----------------------------------------------------------------------------------------------
# entry point


def _one_line(message: str) -> str:
    return " ".join(message.split())


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    command = typer.main.get_command(app)
    try:
        result = command.main(args=args, prog_name="pgscope", standalone_mode=False)
        return int(result) if isinstance(result, int) else 0
    except PgscopeError as exc:
        if debug:
            traceback.print_exc()
        notes = "; ".join(getattr(exc, "__notes__", []))
        sys.stderr.write(f"pgscope: error: {exc}{'; ' + notes if notes else ''}\n")
        return int(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("pgscope: error: interrupted\n")
        return int(ExitCode.INTERRUPTED)
    except Exception as exc:
        # Click's usage errors (vendored by typer) carry exit_code and format_message().
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            ctx = getattr(exc, "ctx", None)
            where = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
            sys.stderr.write(f"pgscope: error: {_one_line(exc.format_message())}{where}\n")
            return int(ExitCode.USAGE)
        if debug:
            traceback.print_exc()
        sys.stderr.write(
            f"pgscope: error: internal error: {type(exc).__name__}: "
            f"{_one_line(str(exc))} (rerun with --debug for the traceback, and "
            f"please report it)\n"
        )
        return int(ExitCode.INTERNAL)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


def entry() -> None:
    """Console-script entry point: exit with main()'s code."""
    sys.exit(main())
