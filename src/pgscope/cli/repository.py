"""`pgscope push`, `pgscope pull` and `pgscope repository init|prune`: a fleet's runs in one
PostgreSQL database (docs/repository.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pgscope.cli.app import DEFAULT_RESULTS, app, echo, err_console, print_json
from pgscope.cli.options import (
    REPOSITORY_ENV,
    REPOSITORY_HELP,
    JsonFlag,
    ResultsDir,
    parse_when,
    repository_params,
)

if TYPE_CHECKING:
    from pgscope.store import RunStore

repository_app = typer.Typer(
    help="A central repository for a fleet: create it, keep it (docs/repository.md).",
    no_args_is_help=True,
)
app.add_typer(repository_app, name="repository")

ToRepository = Annotated[
    str | None,
    typer.Option("--to", help=f"The repository (also ${REPOSITORY_ENV}). " + REPOSITORY_HELP),
]
ToFile = Annotated[
    Path | None,
    typer.Option("--to-file", help="Read --to's connection string from this file."),
]


def _say(message: str) -> None:
    err_console().print(f"· {message}", highlight=False)


@app.command()
def push(
    runs: Annotated[list[Path], typer.Argument(help="Run folders (results/<run-id>).")],
    to: ToRepository = None,
    to_file: ToFile = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print what each push did (run_id, state, rows, tables, seconds, server) "
            "(docs/json.md).",
        ),
    ] = False,
) -> None:
    """Copy runs into a central repository: every table of each run's store, and its
    analysis (the summary.json its folder has, which its report shows; a folder without one
    is analysed first), filed under the server it measured.

    Each run goes in one transaction: a push that fails or is killed leaves nothing of it,
    and a run already there is not sent again (pushing twice changes nothing). Only the run
    folder is read: the server a run measured is never connected to. The repository must
    exist (`pgscope repository init`); the role needs pgscope_push.

    \b
    Examples:
      pgscope push results/20261121-113841-scaling-5b4b --to "host=fleet dbname=pgscope"
      PGSCOPE_REPOSITORY="service=fleet" pgscope push results/*
    """
    from pgscope.repository.connection import connect
    from pgscope.repository.push import push as push_run
    from pgscope.repository.push import scratch
    from pgscope.store import RunStore

    params = repository_params(to, to_file, "--to", env=True, required=True)
    assert params is not None
    session, _ = connect(params, writing=True, application_name="pgscope push")
    done: list[dict[str, Any]] = []
    try:
        for run_dir in runs:
            with scratch() as fifos:
                # Read as any reader reads a store (confined to it), but for the one folder
                # its CSV goes through.
                store = RunStore.open(run_dir, writable=fifos)
                try:
                    document = _document(run_dir, store)
                    pushed = push_run(
                        session, store, scratch=fifos, document=document, final=True, say=_say
                    )
                finally:
                    store.close()
            entry = {
                "run_id": pushed.run_id,
                "run_dir": str(run_dir),
                "state": pushed.state,
                "rows": pushed.rows,
                "tables": pushed.tables,
                "seconds": round(pushed.seconds, 3),
                "server": {
                    "server_id": pushed.server.server_id,
                    "system_identifier": None
                    if pushed.server.system_identifier is None
                    else str(pushed.server.system_identifier),
                    "host": pushed.server.host,
                    "port": pushed.server.port,
                },
            }
            done.append(entry)
            if not as_json:
                where = f"{pushed.server.host}:{pushed.server.port or ''}".rstrip(":")
                if pushed.state == "already":
                    echo(f"{pushed.run_id}: already in the repository, nothing sent")
                else:
                    echo(
                        f"{pushed.run_id}: pushed {pushed.rows:,} rows of {pushed.tables} "
                        f"tables in {pushed.seconds:.1f} s (server {where})"
                    )
    finally:
        session.close()
    if as_json:
        print_json(done)


def _document(run_dir: Path, store: RunStore) -> dict[str, Any]:
    """The run's analysis: its summary.json, when it is this pgscope's document of this run;
    else analysed now (a run killed before writing one, or one of another version)."""
    from pgscope.analyze.model import from_document
    from pgscope.files import read_regular

    run_id = store.run_row()["run_id"]
    try:
        document = json.loads(read_regular(run_dir / "summary.json"))
        if isinstance(document, dict) and document.get("run_id") == run_id:
            from_document(document)  # a document this pgscope reads: it renders the report
            return document
    except (OSError, ValueError):
        pass
    _say(f"{run_id}: no summary.json of this version: analysing the run first")
    from pgscope.analyze.load import load_analysis
    from pgscope.render.json_doc import run_document

    return run_document(load_analysis(run_dir))


@app.command()
def pull(
    run_id: Annotated[str, typer.Argument(help="A run's id in the repository.")],
    from_: Annotated[
        str | None,
        typer.Option("--from", help=f"The repository (also ${REPOSITORY_ENV}). " + REPOSITORY_HELP),
    ] = None,
    from_file: Annotated[
        Path | None,
        typer.Option("--from-file", help="Read --from's connection string from this file."),
    ] = None,
    results_dir: ResultsDir = DEFAULT_RESULTS,
    as_json: JsonFlag = False,
) -> None:
    """Write a run from the repository back into a run folder (results/<run-id>): its store,
    every table as pushed, and its summary.json. `pgscope report` and `export` then read it
    as any run folder (report analyses it again with this pgscope).

    \b
    Example:
      pgscope pull 20261121-113841-scaling-5b4b --from "host=fleet dbname=pgscope"
    """
    from pgscope.files import write_atomic
    from pgscope.repository.connection import connect
    from pgscope.repository.read import document, find_run, materialise

    params = repository_params(from_, from_file, "--from", env=True, required=True)
    assert params is not None
    session, _ = connect(params, writing=False)
    try:
        run = find_run(session, run_id)
        run_dir = materialise(session, run, results_dir / run.run_id)
        doc = document(session, run)
    finally:
        session.close()
    if doc is not None:
        write_atomic(run_dir / "summary.json", json.dumps(doc, indent=2, default=str))
    if as_json:
        print_json(
            {"run_id": run.run_id, "run_dir": str(run_dir), "complete": run.state == "complete"}
        )
        return
    echo(str(run_dir))


@repository_app.command("init")
def init(
    to: ToRepository = None,
    to_file: ToFile = None,
    push_role: Annotated[
        str, typer.Option("--push-role", help="The role that pushes: it may only insert.")
    ] = "pgscope_push",
    read_role: Annotated[
        str, typer.Option("--read-role", help="The role that reads: it may only select.")
    ] = "pgscope_read",
    as_json: JsonFlag = False,
) -> None:
    """Create the repository in a database (the schema pgscope, versioned) and its two
    roles, or upgrade an older one in place; one that is already this version is left as it
    is. Run it as the role that will own the repository: one that may create a schema in the
    database and roles (CREATEROLE), or create the roles first. The roles cannot log in: give
    them to the login roles that push and read (GRANT pgscope_push TO collector).

    \b
    Example:
      pgscope repository init --to "host=fleet dbname=pgscope user=pgscope_owner"
    """
    from pgscope.repository.connection import open_session
    from pgscope.repository.schema import init as create

    params = repository_params(to, to_file, "--to", env=True, required=True)
    assert params is not None
    session = open_session(params, "pgscope repository init")
    try:
        done = create(session, push_role, read_role)
    finally:
        session.close()
    where = params.conninfo()
    if as_json:
        print_json(
            {
                "repository": where,
                "version": done.after.version,
                "store_version": done.after.store_version,
                "before": None
                if done.before is None
                else {"version": done.before.version, "store_version": done.before.store_version},
                "push_role": push_role,
                "read_role": read_role,
                "roles_created": list(done.roles_created),
            }
        )
        return
    if done.before is None:
        what = "created"
    elif done.before == done.after:
        what = "already up to date"
    else:
        what = f"upgraded from version {done.before.version} (store {done.before.store_version})"
    echo(
        f"repository {what} at {where}: version {done.after.version}, store version "
        f"{done.after.store_version}"
    )
    echo(
        f"roles: {push_role} pushes (insert only), {read_role} reads"
        + (f" (created: {', '.join(done.roles_created)})" if done.roles_created else "")
        + f"; give them to login roles: GRANT {push_role} TO <login>;"
    )


@repository_app.command("prune")
def prune(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            help="Remove the runs that started before this: an age (90d, 12w) or a UTC date "
            "(2026-01-01).",
        ),
    ],
    to: ToRepository = None,
    to_file: ToFile = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would go; remove nothing.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Remove the runs that started before a cutoff, whole: their rows in every table,
    their analysis; the time series' monthly partitions that end by the cutoff are dropped
    (the cheap way out for months of history). One transaction, as the repository's owner.

    \b
    Example:
      pgscope repository prune --to "host=fleet dbname=pgscope" --older-than 180d
    """
    from pgscope.repository.connection import connect
    from pgscope.repository.prune import prune as remove

    cutoff = parse_when(older_than, "--older-than")
    params = repository_params(to, to_file, "--to", env=True, required=True)
    assert params is not None
    session, _ = connect(params, writing=True, application_name="pgscope prune")
    try:
        done = remove(session, cutoff, dry_run=dry_run)
    finally:
        session.close()
    if as_json:
        print_json(
            {
                "cutoff": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(cutoff / 1e6)),
                "dry_run": dry_run,
                "runs": done.runs,
                "partitions": done.partitions,
                "rows": done.rows,
            }
        )
        return
    verb = "would remove" if dry_run else "removed"
    echo(
        f"{verb} {len(done.runs)} runs started before "
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(cutoff / 1e6))} UTC "
        f"({len(done.partitions)} partitions dropped whole"
        + ("" if dry_run else f", {done.rows:,} rows deleted from the others")
        + ")"
    )
