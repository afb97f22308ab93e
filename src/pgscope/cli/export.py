"""`pgscope export`: a run's store as CSV or Parquet files, one per table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pgscope.cli.app import app, echo, print_json
from pgscope.cli.options import JsonFlag


@app.command()
def export(
    run_dir: Annotated[Path, typer.Argument(help="A run folder (results/<run-id>).")],
    fmt: Annotated[str, typer.Option("--format", help="csv (with a header) or parquet.")] = "csv",
    out: Annotated[
        Path | None,
        typer.Option("--out", help="The folder to write to (default: RUN_DIR/export)."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Write every table of a run's store to a file of its own (<table>.csv or .parquet), for
    tools that do not read DuckDB. The store is only read; docs/store.md says what each
    table holds.

    \b
    Examples:
      pgscope export results/20261121-113841-scaling-5b4b
      pgscope export results/20261121-113841-scaling-5b4b --format parquet --out /tmp/run
      pgscope export results/20261121-113841-scaling-5b4b --json | jq -r '.files[].path'
    """
    from pgscope.export import DEFAULT_FOLDER, export_run
    from pgscope.words import counted

    written = export_run(run_dir, fmt, out)
    if as_json:
        print_json(
            {
                "run_dir": str(run_dir),
                "format": fmt,
                "out": str(out or run_dir / DEFAULT_FOLDER),
                "files": [{"table": w.table, "path": str(w.path), "rows": w.rows} for w in written],
            }
        )
        return
    for w in written:
        echo(f"{w.path}  {counted(w.rows, 'row')}")
