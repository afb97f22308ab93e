"""Options that several commands share, each declared once as a typed alias.

A command uses one as its parameter's annotation and keeps its default in the signature:
`as_json: JsonFlag = False`. Where an option means something different in one command, that
command declares it itself: `--dsn` (the server to run against, to sample, or to trace),
`--duration` and `--hz` (their own units and bounds), `--json` where the help says what the
document holds (sample, trace, profile, fit usl, report), `--results-dir` of `runs` (read,
not written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

JsonFlag = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON document (schema in docs/json.md) on stdout."),
]
"""--json where the document needs no more words: run, runs, compare, doctor."""

ResultsDir = Annotated[
    Path,
    typer.Option("--results-dir", help="Where run folders are written ($PGSCOPE_RESULTS)."),
]
"""--results-dir of a command that writes a run folder: run, sample, trace, profile."""

DataDir = Annotated[
    Path | None,
    typer.Option("--data-dir", help="The server's data directory (it must be running here)."),
]
"""--data-dir of a server on this host: trace, profile."""

PgBin = Annotated[
    Path | None,
    typer.Option(
        "--pg-bin",
        help="PostgreSQL bin directory (default: pg_config, else the newest "
        "/usr/lib/postgresql/*/bin).",
    ),
]
"""--pg-bin, resolved by target.pgbin.find_binaries: run, doctor."""
