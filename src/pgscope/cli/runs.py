"""`pgscope recipes`, `pgscope runs` and `pgscope report`: what exists, and re-rendering it."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pgscope.cli.app import DEFAULT_RESULTS, app, echo, err_console, out_console, print_json
from pgscope.cli.options import FromFile, FromRepository, parse_when, repository_params
from pgscope.errors import EnvironmentProblem, UsageError

if TYPE_CHECKING:
    from pgscope.analyze.model import RunAnalysis


@app.command()
def recipes(
    name: Annotated[str | None, typer.Argument(help="Show this recipe's spec in full.")] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the list (name, summary, path) or, with NAME, the recipe with its spec "
            "as parsed from its TOML (docs/json.md).",
        ),
    ] = False,
) -> None:
    """List the bundled recipes, or show one recipe's spec (its knobs, with comments)."""
    import tomllib

    from pgscope.spec import recipe_names, recipe_path, recipe_summary

    def entry(recipe: str) -> dict[str, str]:
        path = recipe_path(recipe)
        return {"name": recipe, "summary": recipe_summary(recipe), "path": str(path)}

    if name is not None:
        text = recipe_path(name).read_text()
        if as_json:
            print_json({**entry(name), "spec": tomllib.loads(text)})
        else:
            typer.echo(text, nl=False)
        return
    if as_json:
        print_json([entry(recipe) for recipe in recipe_names()])
        return
    for recipe in recipe_names():
        typer.echo(f"{recipe:<12} {recipe_summary(recipe)}")


@app.command()
def runs(
    results_dir: Annotated[
        Path, typer.Option("--results-dir", help="Where run folders are.")
    ] = DEFAULT_RESULTS,
    from_: FromRepository = None,
    from_file: FromFile = None,
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            help="With --from: a server's runs only, by host, host:port or system identifier.",
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="With --from: runs started since then, an age (7d, 12h) or a UTC date "
            "(2026-11-01) or time (2026-11-01T12:00).",
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="With --from: runs started before then (as --since)."),
    ] = None,
    verdict: Annotated[
        str | None,
        typer.Option(
            "--verdict",
            help="With --from: runs whose verdict has these words, or with this finding "
            "(its id: lwlock-hotspot).",
        ),
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            "--limit", help="With --from: at most this many, newest first (0: all).", min=0
        ),
    ] = 100,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the list as JSON, newest first: name, date, target, workload, "
            "clients, best tps, verdict and more per run; with --from, the server each "
            "measured (docs/json.md).",
        ),
    ] = False,
) -> None:
    """List the runs in the results folder, newest first: when, what (name and workload),
    where (the target), the client counts, the best cell's throughput and the verdict.

    With --from, the runs of a central repository (docs/repository.md), each with the server
    it measured, filtered by server, date and verdict.

    \b
    Examples:
      pgscope runs
      pgscope runs --from "host=fleet dbname=pgscope" --since 7d --server db1
      pgscope runs --from "host=fleet dbname=pgscope" --verdict lwlock-hotspot --json
    """
    params = repository_params(from_, from_file, "--from", env=False, required=False)
    if params is None:
        given = [f for f, v in (("--server", server), ("--since", since), ("--until", until),
                               ("--verdict", verdict)) if v is not None]  # fmt: skip
        if given:
            raise UsageError(f"{', '.join(given)}: with --from only (a repository's runs)")
        from pgscope.store import list_runs

        rows = [_listed(row) for row in list_runs(results_dir)]
        where = str(results_dir)
    else:
        from pgscope.repository.connection import connect
        from pgscope.repository.listing import Filters
        from pgscope.repository.listing import list_runs as stored_runs

        filters = Filters(
            server=server,
            since_us=None if since is None else parse_when(since, "--since"),
            until_us=None if until is None else parse_when(until, "--until"),
            verdict=verdict,
            limit=limit or None,
        )
        session, _ = connect(params, writing=False)
        try:
            rows = stored_runs(session, filters)
        finally:
            session.close()
        where = f"the repository {params.conninfo()}"
    if as_json:
        print_json(rows)
        return
    if not rows:
        echo(f"no runs in {where}")
        return
    header: tuple[str, ...] = ("date (UTC)", "name", "target", "workload", "clients")
    header += ("best tps", "verdict")
    if params is not None:
        header = ("date (UTC)", "server", *header[1:])
    lines = [header] + [
        (
            "-" if row["date"] is None else row["date"][:16].replace("T", " "),
            *([_server(row["server"])] if params is not None else []),
            row["name"],
            row["target"] or "-",
            row["workload"] or "-",
            _client_ranges(row["clients"]) or "-",
            "-" if row["best_tps"] is None else f"{row['best_tps']:,.0f}",
            _short_verdict(row),
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    tps_column = header.index("best tps")
    # On a terminal a line ends at its edge (the verdict cut short); piped, it is whole.
    room = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    for line in lines:
        cells = [
            cell.rjust(width) if i == tps_column else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=False))
        ]
        text = "  ".join([*cells, line[-1]])
        if room is not None and len(text) > room:
            text = text[: room - 1] + "…"
        echo(text)


def _server(server: dict[str, Any]) -> str:
    return f"{server['host']}:{server['port']}" if server.get("port") else str(server["host"])


def _listed(row: dict[str, Any]) -> dict[str, Any]:
    """A run folder as `runs` lists it, with the verdict its summary.json gives."""
    from pgscope.labels import listed_run

    return listed_run(row, _verdict(Path(row["run_dir"])))


def _verdict(run_dir: Path) -> str | None:
    """The verdict the run's summary.json gives (None: no summary was written)."""
    from pgscope.files import read_regular

    try:  # a link planted in its place is not followed
        document = json.loads(read_regular(run_dir / "summary.json"))
    except (OSError, ValueError):
        return None
    verdict = document.get("verdict") if isinstance(document, dict) else None
    return verdict if isinstance(verdict, str) else None


def _short_verdict(row: dict[str, Any]) -> str:
    """The verdict's first sentence; a run that did not complete says so first."""
    verdict = (row["verdict"] or "").split(". ")[0].rstrip(".")
    if row["status"] == "complete":
        return verdict or "no summary"
    reason = row.get("status_reason") or verdict
    return f"{row['status']}: {reason}" if reason else row["status"]


def _client_ranges(counts: list[int]) -> str:
    """[1, 2, 3, 4, 8] -> "1-4, 8"."""
    spans: list[list[int]] = []
    for n in sorted(set(counts)):
        if spans and spans[-1][-1] == n - 1:
            spans[-1].append(n)
        else:
            spans.append([n])
    return ", ".join(str(s[0]) if len(s) == 1 else f"{s[0]}-{s[-1]}" for s in spans)


@app.command()
def report(
    run_dir: Annotated[
        Path,
        typer.Argument(help="A run folder (results/<run-id>); with --from, a run's id."),
    ],
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="text (console summary), json (the document of docs/json.md) or "
            "html (rewrites report.html and prints its path; with --from, writes --out).",
        ),
    ] = "text",
    as_json: Annotated[
        bool, typer.Option("--json", help="The same as --format json, as in every command.")
    ] = False,
    from_: FromRepository = None,
    from_file: FromFile = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="With --from and --format html: the file to write (default: <run-id>.html here).",
        ),
    ] = None,
    reanalyse: Annotated[
        bool,
        typer.Option(
            "--reanalyse",
            help="With --from: analyse the run's rows again with this pgscope, instead of "
            "rendering the analysis its push stored.",
        ),
    ] = False,
) -> None:
    """Re-analyse a run from its store and render it, without running anything.

    With --from, a run of a central repository (docs/repository.md): rendered from the
    analysis its push stored (the run folder's summary.json), the same report as from the
    folder; an observation whose last window has not arrived yet (or --reanalyse) is
    analysed from its rows in the repository.

    \b
    Examples:
      pgscope report results/20261121-113841-scaling-5b4b
      pgscope report results/20261121-113841-scaling-5b4b --format html
      pgscope report results/20261121-113841-scaling-5b4b --json | jq .diagnosis
      pgscope report 20261121-113841-scaling-5b4b --from "host=fleet dbname=pgscope"
    """
    from pgscope.render.console import print_summary
    from pgscope.render.json_doc import run_document

    if fmt not in ("text", "json", "html"):
        raise UsageError(f"--format {fmt!r}: expected text, json or html")
    if as_json and fmt == "html":
        raise UsageError("--json and --format html: choose one")
    if as_json:
        fmt = "json"
    params = repository_params(from_, from_file, "--from", env=False, required=False)
    if params is None:
        given = [f for f, v in (("--out", out), ("--reanalyse", reanalyse or None)) if v]
        if given:
            raise UsageError(f"{', '.join(given)}: with --from only (a repository's run)")
        from pgscope.analyze.load import load_analysis

        result = load_analysis(run_dir)
    else:
        if out is not None and fmt != "html":
            raise UsageError("--out: with --format html only")
        from pgscope.repository.connection import connect

        session, _ = connect(params, writing=False)
        try:
            result = stored_analysis(session, str(run_dir), reanalyse)
        finally:
            session.close()
    if fmt == "json":
        print_json(run_document(result))
    elif fmt == "html":
        from pgscope.collect import offered

        if params is not None:
            from pgscope.files import write_atomic
            from pgscope.render.html import report_html

            target = out if out is not None else Path(f"{result.run_id}.html")
            print(write_atomic(target, report_html(result, offered())))
            return
        from pgscope.render.outputs import write_outputs

        try:
            written = write_outputs(result, offered())
        except EnvironmentProblem as exc:
            exc.add_note(f"the run itself is intact in {run_dir / 'run.duckdb'}")
            raise
        print(written["report.html"])
    else:
        print_summary(out_console(), result)


def stored_analysis(session: Any, name: str, reanalyse: bool = False) -> RunAnalysis:
    """A repository's run as an analysis: the one its push stored, or (`reanalyse`, or an
    observation whose analysis has not arrived) this pgscope's, from its rows there."""
    import tempfile

    from pgscope.analyze.load import load_analysis
    from pgscope.analyze.model import from_document
    from pgscope.repository.read import document, find_run, materialise

    run = find_run(session, name)
    doc = None if reanalyse else document(session, run)
    if doc is not None:
        try:
            return from_document(doc)
        except ValueError as exc:
            err_console().print(
                f"· {run.run_id}: its stored analysis is not this version's ({exc}): "
                f"analysing its rows again",
                highlight=False,
            )
    elif not reanalyse:
        err_console().print(
            f"· {run.run_id}: still arriving (no analysis stored yet): analysing its rows so far",
            highlight=False,
        )
    with tempfile.TemporaryDirectory(prefix="pgscope-pulled-") as scratch:
        return load_analysis(materialise(session, run, Path(scratch) / run.run_id))
