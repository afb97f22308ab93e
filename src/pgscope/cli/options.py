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
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from pgscope.target.conn import ConnParams

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


def resolve_dsn(
    dsn: str | None,
    dsn_file: Path | None,
    *,
    flag: str = "--dsn",
    env: str | None = DSN_ENV,
) -> tuple[str | None, str]:
    """The connection string and where it came from ("--dsn", "--dsn-file PATH",
    "$PGSCOPE_DSN"); (None, "") when none was given. `flag` names the option (--to, --from:
    its file is FLAG-file), `env` the variable read when neither is given (None: none). The
    variable is taken out of the environment once read: no child (pgbench, psql, a server)
    inherits its password."""
    from pgscope.errors import InputFileError, UsageError
    from pgscope.spec import not_a_file

    from_env = os.environ.pop(env, None) if env else None
    if dsn is not None and dsn_file is not None:
        raise UsageError(f"{flag} and {flag}-file: give one of them")
    if dsn is not None:
        return dsn, flag
    if dsn_file is not None:
        where = f"{flag}-file {dsn_file}"
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
        return from_env.strip(), f"${env}"
    return None, ""


# -- a central repository: --to (push, repository init/prune), --from (runs, report, compare,
# pull), observe's --push ------------------------------------------------------------------

REPOSITORY_ENV = "PGSCOPE_REPOSITORY"
REPOSITORY_HELP = (
    "A libpq connection string or URI of the repository's database (docs/repository.md); TLS "
    "as libpq's keywords in it (sslmode=verify-full sslrootcert=...). Keep its password out "
    "of the command line: a -file option, libpq's PGPASSWORD, ~/.pgpass or a service file."
)

FromRepository = Annotated[
    str | None,
    typer.Option(
        "--from",
        help="Read from this central repository instead of a results folder. " + REPOSITORY_HELP,
    ),
]
"""--from of a command that reads runs: runs, report, compare."""

FromFile = Annotated[
    Path | None,
    typer.Option("--from-file", help="Read --from's connection string from this file."),
]


def repository_params(
    dsn: str | None, dsn_file: Path | None, flag: str, *, env: bool, required: bool
) -> ConnParams | None:
    """The repository's connection, from FLAG, FLAG-file or (`env`) $PGSCOPE_REPOSITORY;
    None when none was given and none is `required`."""
    from pgscope.errors import UsageError
    from pgscope.target.conn import ConnParams

    text, source = resolve_dsn(dsn, dsn_file, flag=flag, env=REPOSITORY_ENV if env else None)
    if text is None:
        if required:
            where = f"{flag}, {flag}-file" + (f" or ${REPOSITORY_ENV}" if env else "")
            raise UsageError(f"which repository? give {where} (see: docs/repository.md)")
        return None
    return ConnParams.from_dsn(text, source)


def parse_when(text: str, flag: str) -> int:
    """A moment as epoch microseconds: an age back from now (`90d`, `12h`, `2w`, `30min`)
    or a UTC date or time (`2026-11-01`, `2026-11-01T12:00`)."""
    import calendar
    import re
    import time
    from datetime import datetime

    from pgscope.errors import UsageError

    units = {"s": 1, "min": 60, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    age = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|min|m|h|d|w)\s*", text)
    if age:
        return int((time.time() - float(age[1]) * units[age[2]]) * 1e6)
    try:
        moment = datetime.fromisoformat(text.strip().removesuffix("Z"))
    except ValueError:
        raise UsageError(
            f"{flag} {text!r}: expected an age (90d, 12h, 2w, 30min) or a UTC date "
            f"(2026-11-01) or time (2026-11-01T12:00)"
        ) from None
    if moment.tzinfo is not None:
        return int(moment.timestamp() * 1e6)
    return int(calendar.timegm(moment.timetuple()) * 1e6 + moment.microsecond)
