"""`pgscope profile`: CPU (and off-CPU) profile of a server on this host, for a fixed time."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from pgscope.cli.app import DEFAULT_RESULTS, app, err_console, out_console, print_json
from pgscope.cli.options import DataDir, ResultsDir
from pgscope.cli.title import safe_command_line
from pgscope.files import write_atomic


def _postmaster_of(pid: int) -> Path:
    """The data directory of the server that `pid` (its postmaster or one of its processes)
    belongs to: a postmaster's working directory is its data directory, whose postmaster.pid
    names it (read as --data-dir reads it: no link followed, never a FIFO)."""
    from pgscope.errors import PgscopeError, UsageError
    from pgscope.target.local import LocalServer

    for candidate in (pid, _parent(pid)):
        if candidate is None:
            continue
        try:
            data_dir = Path(f"/proc/{candidate}/cwd").resolve(strict=True)
            if LocalServer.from_data_dir(data_dir).pid == candidate:
                return data_dir
        except (OSError, PgscopeError):
            continue
    raise UsageError(f"--pid {pid}: not a running PostgreSQL server process on this host")


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


@app.command()
def profile(
    data_dir: DataDir = None,
    pid: Annotated[
        int | None,
        typer.Option(help="Instead of --data-dir: the postmaster's PID (or one of its backends')."),
    ] = None,
    duration: Annotated[float, typer.Option(help="Seconds to profile.", min=1, max=86400)] = 30.0,
    off_cpu: Annotated[
        bool,
        typer.Option(
            "--off-cpu", help="Also trace where processes wait off CPU (bpftrace; more costly)."
        ),
    ] = False,
    hz: Annotated[
        int, typer.Option(help="On-CPU samples per second per CPU.", min=1, max=5000)
    ] = 99,
    results_dir: ResultsDir = DEFAULT_RESULTS,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON summary (top functions, files) on stdout.")
    ] = False,
) -> None:
    """Profile every process of a PostgreSQL server on this host: kernel and user stacks.

    On CPU: perf samples cpu-clock at --hz with frame-pointer call chains, of the postmaster
    and every process it forks while profiling, and nothing else. With --off-cpu, bpftrace
    also records where they sleep (latches, semaphores, fsync, client reads) and for how long.
    Needs root. The run folder gets, per kind (cpu, offcpu): folded stacks (`.folded`), a
    speedscope file (`.speedscope.json`, open it at speedscope.app) and an interactive flame
    graph (`.html`, works offline).

    \b
    Examples:
      pgscope profile --data-dir /var/lib/postgresql/15/main --duration 30
      pgscope profile --pid 4242 --duration 10 --off-cpu
      pgscope profile --data-dir /srv/pg --duration 60 --hz 199 --json
    """
    from pgscope.analyze.load import load_profiles
    from pgscope.analyze.profile import summarize
    from pgscope.errors import TargetError, UsageError
    from pgscope.render.flame import write_profile_files
    from pgscope.session import SessionTarget, collect
    from pgscope.target.local import LocalServer
    from pgscope.target.pgbin import find_binaries

    if (data_dir is None) == (pid is None):
        raise UsageError("give exactly one of --data-dir and --pid (see: pgscope profile --help)")
    if pid is not None:
        data_dir = _postmaster_of(pid)
    assert data_dir is not None
    local = LocalServer.from_data_dir(data_dir.expanduser().absolute())
    pg = find_binaries(None, need_server=False)
    selection: dict[str, dict[str, Any]] = {"perf": {"hz": hz}}
    if off_cpu:
        selection["offcpu"] = {}
    err = err_console()

    def say(message: str) -> None:
        err.print(f"· {message}", highlight=False)

    def progress(elapsed: float) -> None:
        if int(elapsed) % 10 == 0 or elapsed >= duration:
            say(f"profiling: {elapsed:.0f}/{duration:.0f} s")

    say(f"profiling PID {local.pid} ({local.data_dir}) and its children for {duration:g} s")
    result = collect(
        name="profile",
        selection=selection,
        target=SessionTarget(None, local),
        pg=pg,
        duration_s=duration,
        results_dir=results_dir,
        command_line=safe_command_line(["pgscope", *sys.argv[1:]]),
        say=say,
        every_second=progress,
    )
    say("writing folded stacks, speedscope files and flame graphs")
    document: dict[str, Any] = {"run_dir": str(result.run_dir.resolve()), "profiles": {}}
    kinds = ["cpu", "offcpu"] if off_cpu else ["cpu"]
    profiles, collectors = load_profiles(result.run_dir, kinds)
    for kind, title in (("cpu", "On-CPU profile"), ("offcpu", "Off-CPU time")):
        if kind not in profiles:
            continue
        prof = profiles[kind]
        files = write_profile_files(
            prof, result.run_dir, kind, f"{title}: PID {local.pid} ({local.data_dir})"
        )
        document["profiles"][kind] = {
            **summarize(prof),
            "files": dict(zip(("folded", "speedscope", "html"), map(str, files), strict=True)),
        }
    document["collectors"] = collectors
    write_atomic(result.run_dir / "summary.json", json.dumps(document, indent=2, default=str))
    if as_json:
        print_json(document)
    else:
        _print(document, result.unavailable)
    if result.interrupted is not None:
        result.interrupted.add_note(f"kept the profile in {result.run_dir}")
        raise result.interrupted
    if result.fault is not None:  # the results disk filled up: the session stopped
        result.fault.add_note(f"kept the profile in {result.run_dir}")
        raise result.fault
    if result.collectors_failed:
        reasons = "; ".join(f"{n}: {r}" for n, r in result.collectors_failed.items())
        raise TargetError(f"{reasons}; kept what was recorded in {result.run_dir}")


def _print(document: dict[str, Any], unavailable: dict[str, str]) -> None:
    out = out_console()
    for name, reason in unavailable.items():
        out.print(f"{name}: unavailable: {reason}", highlight=False)
    for kind, summary in document["profiles"].items():
        unit = summary["unit"]
        out.print(
            f"[bold]{kind}[/bold]: {summary['total']:,} {unit}; "
            f"kernel {summary['kernel_share']:.1%}"
            f", in kernel locks {summary['kernel_lock_share']:.1%}; by role: "
            + ", ".join(
                f"{r} {v / (summary['total'] or 1):.0%}" for r, v in summary["by_role"].items()
            )
        )
        if summary["wait_sites"]:
            for site in summary["wait_sites"][:10]:
                out.print(f"  {site['share']:7.2%}  {site['site']}", highlight=False, markup=False)
        else:
            for f in summary["top_self"][:10]:
                out.print(
                    f"  {f['self_share']:7.2%} self {f['total_share']:7.2%} total  {f['name']}",
                    highlight=False,
                    markup=False,
                )
        for label, path in summary["files"].items():
            out.print(f"  {label}: {path}", highlight=False)
    out.print(f"run folder: {document['run_dir']}", highlight=False)
