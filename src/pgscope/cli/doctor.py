"""`pgscope doctor`: what this machine can do, and the fix for what it cannot."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pgscope.cli.app import app, out_console, print_json
from pgscope.cli.options import JsonFlag, PgBin


@app.command()
def doctor(
    pg_bin: PgBin = None,
    clean: Annotated[
        bool,
        typer.Option(
            "--clean",
            help="Remove what killed runs left (cluster folders, servers still running from "
            "them, scratch folders), found by the marker each run leaves in its folders.",
        ),
    ] = False,
    work_dir: Annotated[
        list[Path] | None,
        typer.Option("--work-dir", help="Also look here for leftovers (a run's --work-dir)."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Check what this machine can do: binaries, probes, root, bpftrace, perf, tracefs; and
    find what killed runs left behind."""
    from pgscope.doctor import run_checks

    checks = run_checks(pg_bin, clean, work_dir or [])
    if as_json:
        print_json({"checks": [c.to_json() for c in checks], "ok": all(c.ok for c in checks)})
        return
    out = out_console()
    for check in checks:
        mark = "[green]ok[/green]  " if check.ok else "[red]MISSING[/red]"
        out.print(f"{mark} {check.name:<20} {check.detail}")
        if not check.ok and check.fix:
            out.print(f"        fix: {check.fix}   (needed for: {check.needed_for})")
