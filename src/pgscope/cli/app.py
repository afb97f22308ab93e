"""The typer application and what every command module shares.

Command modules in this package register themselves on `app` when imported; `pgscope.cli`
imports them all, so a new command is a new module.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from pgscope import __version__
from pgscope.render.inert import InertConsole
from pgscope.words import inert

HELP = """Find out why PostgreSQL stops scaling, and prove it.

pgscope drives load with pgbench at growing client counts against a throw-away cluster it
starts itself (or an existing server with --dsn), records every measurement in a run folder
(results/<run-id>/run.duckdb), and fits the Universal Scalability Law to say where and why
throughput stops growing.

\b
Start here:
  pgscope doctor                      what this machine can measure
  pgscope recipes                     the bundled experiments
  pgscope run scaling --quick         a scalability sweep, about 3 minutes
  pgscope run logging --quick         a field case (also syncrep, checkpoint, cpus)
  pgscope observe --dsn ...           why a running server's own workload is slow, read-only
  pgscope sample --dsn ... --live     what a server's sessions wait on, read-only
  pgscope trace lwlock --dsn ...      LWLock wait histograms from the server's probes
  pgscope profile --data-dir ...      CPU flame graph of a server on this host
  pgscope fit usl data.csv            fit USL to your own measurements

\b
A fleet's runs in one PostgreSQL database (docs/repository.md):
  pgscope repository init --to ...    create it (schema pgscope, a push and a reader role)
  pgscope push results/<run-id> --to ...   copy runs there, one transaction each
  pgscope observe ... --push ...      push each window of an observation as it closes
  pgscope runs --from ... --since 7d  list them (also report, compare, pull --from)
  pgscope repository prune --to ... --older-than 180d   keep months, not forever
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


def out_console() -> Console:
    # Piped or redirected output gets room for the tables instead of 80 columns.
    return InertConsole(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 120)


def err_console() -> Console:
    return InertConsole(stderr=True, highlight=False, soft_wrap=True)


def echo(line: str) -> None:
    """A plain line on stdout, for the listings that are not rich text: inert, as the
    consoles' (a run's name or a table's in a store came from somewhere)."""
    typer.echo(inert(line))


def print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")
    sys.stdout.flush()  # a closed pipe shows here, inside the command, not at exit


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
) -> None:
    if version:
        typer.echo(f"pgscope {__version__}")
        raise typer.Exit(0)
