"""Options that several commands share, each declared once as a typed alias.

A command uses one as its parameter's annotation and keeps its default in the signature:
`as_json: JsonFlag = False`. Where an option means something different in one command, that
command declares it itself: `--dsn` (the server to run against, to sample, or to trace),
`--duration` and `--hz` (their own units and bounds), `--json` where the help says what the
document holds (sample, trace, profile, fit usl, report, recipes, runs), `--results-dir` of
`runs` (read, not written).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

JsonFlag = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON document (schema in docs/json.md) on stdout."),
]
"""--json where the document needs no more words: run, compare, doctor."""

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

LiveFlag = Annotated[
    bool,
    typer.Option(
        "--live",
        help="A top-like view refreshed each second: AAS by class, top waits, top "
        "queries over the last 10 s.",
    ),
]
"""--live, the waits of the last seconds redrawn while collecting: sample, observe."""

PgBin = Annotated[
    Path | None,
    typer.Option(
        "--pg-bin",
        help="PostgreSQL bin directory (default: pg_config, else the newest "
        "/usr/lib/postgresql/*/bin).",
    ),
]
"""--pg-bin, resolved by target.pgbin.find_binaries: run, doctor."""

# -- the server's connection string: --dsn, --dsn-file or $PGSCOPE_DSN -------------------------

DSN_ENV = "PGSCOPE_DSN"
DSN_SOURCES_HELP = (
    f"Also from --dsn-file or ${DSN_ENV}. A password on the command line is visible to other "
    "users of this host (ps: at least while pgscope starts, and in any command that passed "
    "it on) and stays in shell history: put it in --dsn-file, $PGSCOPE_DSN, or libpq's "
    "PGPASSWORD, ~/.pgpass or a service file instead."
)
"""The end of every --dsn help that --dsn-file and $PGSCOPE_DSN also feed: run, sample."""

DsnFile = Annotated[
    Path | None,
    typer.Option(
        "--dsn-file",
        help="Read the connection string (--dsn) from this file, e.g. one only you can read "
        "(chmod 600): its password then never appears in a process list.",
    ),
]
"""--dsn-file of a command that takes --dsn: run, sample."""


def resolve_dsn(dsn: str | None, dsn_file: Path | None) -> tuple[str | None, str]:
    """The connection string and where it came from ("--dsn", "--dsn-file PATH",
    "$PGSCOPE_DSN"); (None, "") when none was given. $PGSCOPE_DSN is taken out of the
    environment once read: no child (pgbench, psql, a server) inherits its password."""
    from pgscope.errors import InputFileError, UsageError
    from pgscope.spec import not_a_file

    from_env = os.environ.pop(DSN_ENV, None)
    if dsn is not None and dsn_file is not None:
        raise UsageError("--dsn and --dsn-file: give one of them")
    if dsn is not None:
        return dsn, "--dsn"
    if dsn_file is not None:
        where = f"--dsn-file {dsn_file}"
        problem = not_a_file(dsn_file)
        if problem:
            raise InputFileError(f"{where}: {problem}")
        try:
            data = dsn_file.read_bytes()
        except OSError as exc:
            raise InputFileError(f"{where}: cannot read it: {exc.strerror or exc}") from None
        # Undecodable bytes stay as surrogates: the connection string's parser names them.
        text = data.decode("utf-8", errors="surrogateescape").strip()
        if not text:
            raise UsageError(f"{where}: the file is empty; expected a connection string")
        return text, where
    if from_env and from_env.strip():
        return from_env.strip(), f"${DSN_ENV}"
    return None, ""
