"""`pgscope sample`: wait-event sampling of any server, read-only, for a fixed time."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pgscope.cli.app import DEFAULT_RESULTS, app, err_console, out_console, print_json
from pgscope.cli.livewaits import LIVE_FLUSH_S, LiveWaits
from pgscope.cli.options import DSN_SOURCES_HELP, DsnFile, LiveFlag, ResultsDir, resolve_dsn
from pgscope.cli.title import safe_command_line
from pgscope.files import write_atomic

if TYPE_CHECKING:  # the types only: every command's start pays for what it imports
    from pgscope.analyze.model import RunAnalysis


@app.command()
def sample(
    dsn: Annotated[
        str | None,
        typer.Option(
            help="The server to sample (libpq connection string or URI). Needs pg_monitor. "
            + DSN_SOURCES_HELP
        ),
    ] = None,
    dsn_file: DsnFile = None,
    duration: Annotated[float, typer.Option(help="Seconds to sample.", min=0.5)] = 30.0,
    hz: Annotated[float, typer.Option(help="Samples per second.", min=0.1, max=1000)] = 50.0,
    live: LiveFlag = False,
    no_pgws: Annotated[
        bool,
        typer.Option("--no-pgws", help="Do not read pg_wait_sampling even where it is installed."),
    ] = False,
    results_dir: ResultsDir = DEFAULT_RESULTS,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the profile as JSON (schema in docs/json.md).")
    ] = False,
) -> None:
    """Sample what a server's sessions are doing: the wait profile of active time.

    Read-only: it runs SELECTs on pg_stat_activity (and pg_wait_sampling's views where that
    extension is installed) and nothing else. Everything lands in a run folder that
    `pgscope report` re-renders.

    \b
    Examples:
      pgscope sample --dsn "host=db1 dbname=app user=monitor" --duration 60
      pgscope sample --dsn postgresql://monitor@db1/app --live --duration 600
      pgscope sample --dsn "..." --hz 100 --json > profile.json
    """
    from pgscope.analyze.load import load_analysis
    from pgscope.collect.base import CollectorEnv
    from pgscope.collect.sampling.pgws import PgwsCollector
    from pgscope.drive.readonly import guarded
    from pgscope.errors import TargetError, UsageError
    from pgscope.render.waits import print_waits
    from pgscope.session import SessionTarget, collect
    from pgscope.target.conn import ConnParams
    from pgscope.target.pgbin import find_binaries

    dsn, dsn_source = resolve_dsn(dsn, dsn_file)
    if dsn is None:
        raise UsageError("which server? give --dsn, --dsn-file or $PGSCOPE_DSN")
    # Read-only by the server's rule, as observe's sessions are; and reached once before a
    # run folder exists, so an unreachable server is exit 5 and leaves nothing behind.
    conn = guarded(ConnParams.from_dsn(dsn, dsn_source))
    conn.connect().close()
    pg = find_binaries(None, need_server=False)
    selection: dict[str, dict[str, Any]] = {"activity": {"hz": hz, "reconnect_s": 0}}
    if live:  # the view reads the store each second
        selection["activity"]["flush_s"] = LIVE_FLUSH_S
    env = CollectorEnv(pg, "server", conn, os.geteuid() == 0)
    err = err_console()
    if not no_pgws and PgwsCollector.check(env).ok:
        selection["pgws"] = {}
        err.print(
            "· pg_wait_sampling is installed: reading it too, for comparison", highlight=False
        )
    command_line = safe_command_line(["pgscope", *sys.argv[1:]])

    def say(message: str) -> None:
        err.print(f"· {message}", highlight=False)

    with LiveWaits(live, duration, err) as view:
        result = collect(
            name="sample",
            selection=selection,
            target=SessionTarget(conn, None),
            pg=pg,
            duration_s=duration,
            results_dir=results_dir,
            command_line=command_line,
            say=say,
            every_second=view.refresh if live else None,
            on_store=view.opened,
        )
    run = load_analysis(result.run_dir)
    write_atomic(result.run_dir / "summary.json", json.dumps(_document(run), indent=2))
    if as_json:
        print_json(_document(run))
    elif run.waits is not None:
        out = out_console()
        print_waits(out, run.waits, [])
        out.print(f"run folder: {result.run_dir}", highlight=False)
    failed = result.collectors_failed.get("activity")
    if result.interrupted is not None:
        result.interrupted.add_note(f"kept {_samples(run)} samples in {result.run_dir}")
        raise result.interrupted
    if result.fault is not None:  # the results disk filled up: the session stopped
        result.fault.add_note(f"kept {_samples(run)} samples in {result.run_dir}")
        raise result.fault
    if failed:
        raise TargetError(f"{failed}; kept {_samples(run)} samples in {result.run_dir}")


def _samples(run: RunAnalysis) -> int:
    return int(run.waits.overall.samples) if run.waits is not None else 0


def _document(run: RunAnalysis) -> dict[str, Any]:
    document: dict[str, Any] = {
        "run_dir": run.run_dir,
        "status": run.status,
        "server_version": run.target.server_version,
    }
    if run.waits is not None:
        document.update(run.waits.to_json())
    else:
        document.update(profile=[], samples=0, achieved_hz=0.0)
    document["collectors"] = run.environment.collectors
    return document
