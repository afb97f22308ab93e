"""`pgscope recipes`, `pgscope runs` and `pgscope report`: what exists, and re-rendering it."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from pgscope.cli.app import DEFAULT_RESULTS, app, echo, out_console, print_json
from pgscope.errors import EnvironmentProblem, UsageError


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
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the list as JSON, newest first: name, date, target, workload, "
            "clients, best tps, verdict and more per run (docs/json.md).",
        ),
    ] = False,
) -> None:
    """List the runs in the results folder, newest first: when, what (name and workload),
    where (the target), the client counts, the best cell's throughput and the verdict."""
    from pgscope.store import list_runs

    rows = [_listed(row) for row in list_runs(results_dir)]
    if as_json:
        print_json(rows)
        return
    if not rows:
        echo(f"no runs in {results_dir}")
        return
    header = ("date (UTC)", "name", "target", "workload", "clients", "best tps", "verdict")
    lines = [header] + [
        (
            "-" if row["date"] is None else row["date"][:16].replace("T", " "),
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
    # On a terminal a line ends at its edge (the verdict cut short); piped, it is whole.
    room = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    for line in lines:
        cells = [
            cell.rjust(width) if i == 5 else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=False))
        ]
        text = "  ".join([*cells, line[-1]])
        if room is not None and len(text) > room:
            text = text[: room - 1] + "…"
        echo(text)


def _listed(row: dict[str, Any]) -> dict[str, Any]:
    """A run as `runs` lists it: the store's summary row, with what a reader asks first."""
    from pgscope.labels import driven_workload, shown_conninfo

    spec = row.pop("spec", {})
    kind, conninfo = row.pop("target_kind", None), row.pop("target_conninfo", None)
    started, best = row.get("started_us"), row.pop("best_tps", None)
    return {
        # An unreadable store still has its folder's name: DATE-TIME-NAME-HEX.
        "name": row["recipe"] or "-".join(row["run_id"].split("-")[2:-1]) or row["run_id"],
        "date": None
        if started is None
        else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started / 1e6)),
        "target": "embedded" if kind == "embedded" else shown_conninfo(conninfo) or kind or None,
        "workload": driven_workload(spec),
        "scale": spec.get("scale"),
        "clients": row.pop("clients", []),
        "best_tps": None if best is None else round(best, 1),
        "verdict": _verdict(Path(row["run_dir"])),
        **row,
    }


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
    run_dir: Annotated[Path, typer.Argument(help="A run folder (results/<run-id>).")],
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="text (console summary), json (the document of docs/json.md) or "
            "html (rewrites report.html and prints its path).",
        ),
    ] = "text",
    as_json: Annotated[
        bool, typer.Option("--json", help="The same as --format json, as in every command.")
    ] = False,
) -> None:
    """Re-analyse a run from its store and render it, without running anything.

    \b
    Examples:
      pgscope report results/20261121-113841-scaling-5b4b
      pgscope report results/20261121-113841-scaling-5b4b --format html
      pgscope report results/20261121-113841-scaling-5b4b --json | jq .diagnosis
    """
    from pgscope.analyze.load import load_analysis
    from pgscope.render.console import print_summary
    from pgscope.render.json_doc import run_document

    if fmt not in ("text", "json", "html"):
        raise UsageError(f"--format {fmt!r}: expected text, json or html")
    if as_json and fmt == "html":
        raise UsageError("--json and --format html: choose one")
    if as_json:
        fmt = "json"
    result = load_analysis(run_dir)
    if fmt == "json":
        print_json(run_document(result))
    elif fmt == "html":
        from pgscope.collect import offered
        from pgscope.render.outputs import write_outputs

        try:
            written = write_outputs(result, offered())
        except EnvironmentProblem as exc:
            exc.add_note(f"the run itself is intact in {run_dir / 'run.duckdb'}")
            raise
        print(written["report.html"])
    else:
        print_summary(out_console(), result)
