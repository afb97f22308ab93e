"""`pgscope recipes`, `pgscope runs` and `pgscope report`: what exists, and re-rendering it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pgscope.cli.app import DEFAULT_RESULTS, app, out_console, print_json
from pgscope.cli.options import JsonFlag
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
    as_json: JsonFlag = False,
) -> None:
    """List the runs in the results folder, newest first."""
    from pgscope.store import list_runs

    rows = list_runs(results_dir)
    if as_json:
        print_json(rows)
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
