"""`pgscope run`: an experiment from a recipe or spec file, with flag overrides."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from pgscope.cli.app import DEFAULT_RESULTS, app, err_console, out_console, print_json
from pgscope.cli.options import (
    DSN_SOURCES_HELP,
    DsnFile,
    JsonFlag,
    PgBin,
    ResultsDir,
    resolve_dsn,
)
from pgscope.cli.specflags import spec_overrides
from pgscope.cli.title import safe_command_line
from pgscope.errors import (
    EnvironmentProblem,
    InputFileError,
    Interrupted,
    RunFailed,
    UsageError,
)


@app.command()
def run(
    recipe: Annotated[
        str | None,
        typer.Argument(
            help="A bundled recipe name (see `pgscope recipes`) or a spec file (.toml); "
            "default: scaling.",
            show_default=False,
        ),
    ] = None,
    again: Annotated[
        Path | None,
        typer.Option(
            "--again",
            help="Run a run folder's experiment again: its spec.toml, as that run ran it "
            "(variants, client counts, durations, order and seed, its copies of the scripts "
            "and init SQL). Flags given too apply on top.",
        ),
    ] = None,
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
    max_tries: Annotated[
        int | None,
        typer.Option(
            "--max-tries",
            help="pgbench --max-tries: tries of a transaction that fails with a serialization "
            "or deadlock error (default 1: never retried; 0: until it succeeds or the step ends).",
        ),
    ] = None,
    connect: Annotated[
        bool,
        typer.Option(
            "--connect",
            help="pgbench -C: open a new connection for each transaction, as an application "
            "without a connection pool does.",
        ),
    ] = False,
    order: Annotated[
        str | None,
        typer.Option(help="Step order: random (interleaved, the default) or sequential."),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed for the randomised step order.")] = None,
    dsn: Annotated[
        str | None,
        typer.Option(
            help="Run against an existing server instead of an embedded cluster. Read-only "
            "unless --allow-writes; never changes its settings. " + DSN_SOURCES_HELP
        ),
    ] = None,
    dsn_file: DsnFile = None,
    allow_writes: Annotated[
        bool,
        typer.Option(
            "--allow-writes", help="With --dsn: allow creating tables and write workloads."
        ),
    ] = False,
    pg_bin: PgBin = None,
    run_as: Annotated[
        str | None,
        typer.Option(
            "--run-as",
            help="When root: the account that runs the embedded server, pgbench and psql "
            "(your scripts and init SQL never run as root; default: postgres, or nobody on a "
            "--dsn run where there is no postgres).",
        ),
    ] = None,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            "--work-dir",
            help="Where the throw-away cluster's directory is created (default: $TMPDIR).",
        ),
    ] = None,
    results_dir: ResultsDir = DEFAULT_RESULTS,
    action: Annotated[
        list[str] | None,
        typer.Option(
            help="SQL run AT seconds into every step, as AT:SQL (e.g. '20:CHECKPOINT'); "
            "repeatable; replaces the spec's actions.",
        ),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option(
            "--rate",
            help="Open loop: offered rates, after the closed-loop sweep: tps (2000,4000), "
            "shares of the sweep's peak (20%,50%), or ranges (20%-120% every 20%, "
            "20%-120%/10%, 1000-5000/1000). pgbench -R schedules each transaction at its "
            "time whether or not the last returned, and latency counts from that time.",
        ),
    ] = None,
    rate_clients: Annotated[
        int | None,
        typer.Option(
            "--rate-clients",
            help="Clients that drive the rates, a pool (default: the sweep's highest client "
            "count, whose closed-loop latency the run then has beside them).",
        ),
    ] = None,
    slo: Annotated[
        list[str] | None,
        typer.Option(
            "--slo",
            help="A latency objective for the rates, pNN<LATENCY (p99<10ms, p99.9<50ms); "
            "repeatable. The run reports the highest rate meeting each (the capacity) with "
            "its 95% interval over repeats; the largest latency is pgbench's --latency-limit.",
        ),
    ] = None,
    collectors: Annotated[
        str | None,
        typer.Option(
            help="Collectors to run, comma-separated, with default options (see "
            "`pgscope doctor`); replaces the spec's selection.",
        ),
    ] = None,
    no_collectors: Annotated[
        bool, typer.Option("--no-collectors", help="Run no collector: load and timing only.")
    ] = False,
    plan: Annotated[
        bool,
        typer.Option(
            "--plan",
            help="Check the experiment and show its steps and how "
            "long they take, without running anything.",
        ),
    ] = False,
    no_xact_log: Annotated[
        bool,
        typer.Option(
            "--no-xact-log",
            help="Do not keep the per-transaction latency log (Parquet) of "
            "each step; percentiles are stored either way.",
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Run an experiment: sweep client counts (and variants), store everything, fit USL.

    \b
    Examples:
      pgscope run scaling --quick
      pgscope run scaling --clients 1,2,4,8 --duration 20 --repeats 3
      pgscope run my.toml --set shared_buffers=1GB
      pgscope run --script insert.sql --init-sql schema.sql --scale 0 --clients 1-8
      pgscope run --dsn "host=db1 dbname=bench user=me" --workload select-only
      pgscope run capacity --quick --slo 'p99<10ms'
      pgscope run scaling --rate 20%-120% --slo 'p99<5ms' --slo 'p50<1ms'
      pgscope run --again results/20261124-071918-lookup-df88
    """
    from pgscope.analyze.load import load_analysis
    from pgscope.cli.progress import ConsoleReporter
    from pgscope.collect import offered
    from pgscope.render.console import print_summary
    from pgscope.render.json_doc import run_document
    from pgscope.render.outputs import write_outputs
    from pgscope.runner.run import RunOptions, execute
    from pgscope.signals import signals_deferred
    from pgscope.spec import load_spec, parse_setting
    from pgscope.target.conn import ConnParams

    err = err_console()
    dsn, dsn_source = resolve_dsn(dsn, dsn_file)
    if dsn is not None and dsn_source != "--dsn":
        # Not on the command line: say which server, or a forgotten variable runs elsewhere.
        shown = ConnParams.from_dsn(dsn, dsn_source).conninfo()
        err.print(f"· server from {dsn_source}: {shown}", highlight=False, markup=False)
    # The command's parameters, by the names specflags.FLAGS declares.
    overrides, flags = spec_overrides(locals())
    settings = dict(parse_setting(s) for s in set_ or [])
    if again is not None:
        if recipe is not None:
            raise UsageError(f"--again {again} and {recipe}: give one of them")
        if quick:
            raise UsageError("--again and --quick: the run's spec.toml is already as it ran")
        recipe = str(kept_spec(again))
        note = _target_note(again, dsn)
        if note:
            err.print(f"· {note}", highlight=False, markup=False)
    try:
        loaded = load_spec(
            recipe or "scaling",
            quick=quick,
            overrides=overrides,
            override_flags=flags,
            extra_settings=settings,
            kept_in=again,
        )
    except InputFileError as exc:
        if again is None:
            raise
        # A kept copy gone from inputs/: the folder cannot run as it ran.
        raise InputFileError(f"--again {again}: {exc}") from None
    target = ConnParams.from_dsn(dsn, dsn_source) if dsn is not None else None
    if plan:
        from pgscope.host import usable_cores
        from pgscope.runner.preflight import check_request

        # The real run's refusals, said here too: a plan the run would refuse is no plan.
        check_request(loaded, usable_cores(), target, allow_writes)
        _show_plan(loaded, target, as_json)
        return
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
    outcome = execute(loaded, options, ConsoleReporter(err))
    try:
        # A Ctrl-C while analysing and writing the summary (a second or two) waits for it: the
        # data is safe, and a run without its summary is one a user cannot read. A second
        # Ctrl-C stops at once.
        with signals_deferred() as late:
            result = load_analysis(outcome.run_dir)
            document = run_document(result)
            written = write_outputs(result, offered())
        if late:
            raise late[0]
    except (Interrupted, EnvironmentProblem) as exc:
        exc.add_note(
            f"everything measured is in {outcome.run_dir} (pgscope report {outcome.run_dir} "
            f"--format html writes the report again if it is missing)"
        )
        raise
    err.print(f"· report: {written['report.html']}", highlight=False)
    try:
        if as_json:
            print_json(document)
        else:
            print_summary(out_console(), result)
    except Interrupted as exc:
        exc.add_note(
            f"while printing the summary; the run and its report are in {outcome.run_dir} "
            f"(pgscope report {outcome.run_dir} prints it again)"
        )
        raise
    if outcome.error is not None:
        if isinstance(outcome.error, Interrupted):
            kept = sum(1 for s in result.steps if s.status == "ok")
            outcome.error.add_note(f"kept {kept} finished steps in {outcome.run_dir}")
        raise outcome.error
    if outcome.status == "partial":
        # Steps whose workload's transactions errored are results, not failures.
        failed = [s for s in result.steps if s.status not in ("ok", "errors")]
        first = failed[0]
        raise RunFailed(
            f"{len(failed)} of {len(result.steps)} steps failed (first: step "
            f"{first.step_id}, {first.error or first.status}); the others' "
            f"measurements are in {outcome.run_dir}"
        )


def kept_spec(run_dir: Path) -> Path:
    """The spec.toml of a run folder `pgscope run` wrote, or a one-line error (exit 3) saying
    why `run_dir` is not one."""
    from pgscope.runner.reproduce import SPEC_FILE
    from pgscope.spec import not_a_file
    from pgscope.store import STORE_FILE

    if not run_dir.is_dir():
        problem = not_a_file(run_dir) if run_dir.exists() else "no such folder"
        raise InputFileError(f"--again {run_dir}: {problem}; expected a run folder")
    if not (run_dir / STORE_FILE).is_file():
        raise InputFileError(f"--again {run_dir}: not a pgscope run folder (no {STORE_FILE})")
    path = run_dir / SPEC_FILE
    if path.is_symlink():  # a folder from elsewhere may point it at any file
        raise InputFileError(f"--again {run_dir}: its {SPEC_FILE} is a symbolic link: not read")
    if not path.is_file():
        raise InputFileError(
            f"--again {run_dir}: the folder has no {SPEC_FILE} (only `pgscope run` keeps one, "
            f"since pgscope 0.1.0): it cannot be run again"
        )
    return path


def _target_note(run_dir: Path, dsn: str | None) -> str | None:
    """What to know when --again runs elsewhere than the run did: pgscope never connects to a
    server the command line does not name, so a `--dsn` run is repeated on one only with
    `--dsn` again."""
    from pgscope.store import RunStore

    store = RunStore.open(run_dir)
    try:
        run = store.run_row()
    finally:
        store.close()
    if run["target_kind"] == "server" and dsn is None:
        return (
            f"{run_dir.name} ran on {run['target_conninfo']}; this run starts an embedded "
            f"cluster (pass --dsn to run there again)"
        )
    if run["target_kind"] == "embedded" and dsn is not None:
        return f"{run_dir.name} ran on an embedded cluster; this run uses the server of --dsn"
    return None


def _show_plan(loaded: Any, target: Any, as_json: bool) -> None:
    """The steps an experiment would run, in order, and an estimate of its time."""
    from pgscope.host import usable_cores
    from pgscope.runner.plan import plan_steps
    from pgscope.runner.run import run_selection
    from pgscope.spec import rates_label, setting_text
    from pgscope.words import counted, n_clients

    spec = loaded.spec
    cores = usable_cores()
    steps = plan_steps(spec, cores, spec.seed if spec.seed is not None else 0)
    per_step = spec.warmup + spec.duration + STEP_OVERHEAD_S
    estimate = len(steps) * per_step
    document = {
        "recipe": spec.name,
        "source": loaded.source,
        "workload": spec.workload_label(),
        "scale": spec.scale,
        "protocol": spec.protocol,
        "target": "embedded" if target is None else target.conninfo(),
        "steps": len(steps),
        "estimated_seconds": round(estimate),
        "clients": spec.client_counts(cores),
        "repeats": spec.repeats,
        "seconds_per_step": spec.warmup + spec.duration,
        "connect_per_transaction": spec.connect_per_transaction,
        # Everything a variant sets, pgscope's own keys (pins, pgbench variables) included.
        "variants": {
            v: {k: setting_text(x) for k, x in {**spec.settings, **spec.variants[v]}.items()}
            for v in spec.variants
        },
        "collectors": sorted(
            run_selection(spec, target is not None, lambda _: None, loaded.own_collectors)
        ),
        "rates": [r.label for r in spec.offered_rates()],
        "rate_clients": spec.rate_clients,
        "slo": spec.slo,
        "order": [
            {
                "step_id": s.step_id,
                "variant": s.variant,
                "clients": s.clients,
                "repeat": s.repeat,
                **({"rate": s.offered.label} if s.offered is not None else {}),
            }
            for s in steps
        ],
    }
    if as_json:
        print_json(document)
        return
    out = out_console()
    out.print(
        f"{spec.name}: {counted(len(steps), 'step')} of {spec.warmup + spec.duration:g} s, "
        f"about {f'{estimate:.0f} s' if estimate < 90 else f'{estimate / 60:.0f} min'} "
        f"plus set-up",
        highlight=False,
    )
    out.print(
        f"workload {document['workload']} at scale {spec.scale}, protocol {spec.protocol}; "
        f"target {document['target'] if target is not None else 'an embedded cluster'}",
        highlight=False,
        markup=False,
    )
    out.print(
        f"clients {', '.join(map(str, spec.client_counts(cores)))}; repeats "
        f"{spec.repeats}; order {spec.order}; collectors "
        f"{', '.join(document['collectors']) or 'none'}",
        highlight=False,
    )
    if spec.connect_per_transaction:
        out.print("connections: a new one for each transaction (pgbench -C)", highlight=False)
    if spec.rates:
        who = n_clients(spec.rate_client_count(cores))
        objectives = f"; objectives {', '.join(spec.slo)}" if spec.slo else ""
        out.print(
            f"then open loop (pgbench -R): offered {rates_label(spec.offered_rates())}, by "
            f"{who}{objectives}",
            highlight=False,
            markup=False,
        )
    for variant, settings in document["variants"].items():
        shown = ", ".join(f"{k}={v}" for k, v in settings.items()) or "server defaults"
        out.print(f"variant {variant}: {shown}", highlight=False, markup=False)


STEP_OVERHEAD_S = 1.5  # a checkpoint, pgbench's start and the step's analysis, measured here
