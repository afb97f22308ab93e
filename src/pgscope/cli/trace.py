"""`pgscope trace`: one bpftrace program on the static probes of a server on this host."""

from __future__ import annotations

import json
import os
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from pgscope.cli.app import DEFAULT_RESULTS, app, err_console, out_console, print_json
from pgscope.cli.options import DataDir, ResultsDir
from pgscope.cli.title import safe_command_line
from pgscope.files import write_atomic

if TYPE_CHECKING:
    from pgscope.analyze.usdt import Bucket, Checkpoint, LatencySummary, TraceSummary
    from pgscope.session import SessionTarget


class TraceProgram(StrEnum):
    lwlock = "lwlock"
    locks = "locks"
    checkpoint = "checkpoint"
    io = "io"


@app.command()
def trace(
    program: Annotated[
        TraceProgram,
        typer.Argument(
            help="lwlock: LWLock waits by tranche; locks: heavyweight lock waits by type; "
            "checkpoint: each checkpoint's phases; io: smgr latency, hits, WAL, transactions."
        ),
    ],
    data_dir: DataDir = None,
    dsn: Annotated[
        str | None,
        typer.Option(
            help="The server by connection string: it must run on this host (found by its "
            "port and start time). With --data-dir too, it must be the same server."
        ),
    ] = None,
    duration: Annotated[float, typer.Option(help="Seconds to trace.", min=1, max=86400)] = 10.0,
    hold_time: Annotated[
        bool,
        typer.Option(
            "--hold-time",
            help="lwlock only: also time how long locks are held (a trap per acquisition "
            "and release: costly, for short diagnostic traces).",
        ),
    ] = False,
    results_dir: ResultsDir = DEFAULT_RESULTS,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print the result as JSON (docs/collector-usdt.md)."),
    ] = False,
) -> None:
    """Trace PostgreSQL's static probes with bpftrace, aggregated in the kernel.

    Every process of the server counts, including backends that start while tracing, and no
    other server's: other clusters on the host run the same binary and are filtered out in
    the kernel (they do pay the probes' traps while the trace runs). Needs root, bpftrace
    and a PostgreSQL built with --enable-dtrace (`pgscope doctor` checks). Each second's
    figures land in a run folder that `pgscope report` and DuckDB read.

    \b
    Examples:
      pgscope trace lwlock --data-dir /var/lib/postgresql/15/main --duration 10
      pgscope trace locks --dsn "host=/var/run/postgresql dbname=app" --duration 60
      pgscope trace checkpoint --data-dir /srv/pg --duration 600 --json
      pgscope trace io --data-dir /srv/pg --duration 5
    """
    from pgscope.analyze.load import load_trace
    from pgscope.errors import TargetError, UsageError
    from pgscope.session import collect
    from pgscope.target.pgbin import find_binaries

    if hold_time and program is not TraceProgram.lwlock:
        raise UsageError("--hold-time goes with the lwlock program only")
    target = _target(data_dir, dsn)
    assert target.local is not None
    options: dict[str, Any] = {"programs": [program.value]}
    if hold_time:
        options["lwlock_hold"] = True
    err = err_console()

    def say(message: str) -> None:
        err.print(f"· {message}", highlight=False)

    def progress(elapsed: float) -> None:
        if int(elapsed) % 10 == 0 or elapsed >= duration:
            say(f"tracing: {elapsed:.0f}/{duration:.0f} s")

    say(
        f"tracing {program.value} in the cluster of postmaster {target.local.pid} "
        f"({target.local.data_dir}) for {duration:g} s"
    )
    result = collect(
        name=f"trace-{program.value}",
        selection={"usdt": options},
        target=target,
        pg=find_binaries(None, need_server=False),
        duration_s=duration,
        results_dir=results_dir,
        command_line=safe_command_line(["pgscope", *sys.argv[1:]]),
        say=say,
        every_second=progress,
    )
    summary, collectors = load_trace(result.run_dir, program.value)
    document = {
        "run_dir": str(result.run_dir.resolve()),
        "status": result.status,
        "postmaster_pid": target.local.pid,
        "data_dir": str(target.local.data_dir),
        "duration_s": duration,
        **summary.to_json(),
        "collectors": collectors,
    }
    write_atomic(result.run_dir / "summary.json", json.dumps(document, indent=2, default=str))
    if as_json:
        print_json(document)
    else:
        out = out_console()
        print_summary(out, summary)
        out.print(f"run folder: {result.run_dir}", highlight=False)
    if result.interrupted is not None:
        result.interrupted.add_note(f"kept what was traced in {result.run_dir}")
        raise result.interrupted
    if result.fault is not None:  # the results disk filled up: the session stopped
        result.fault.add_note(f"kept what was traced in {result.run_dir}")
        raise result.fault
    if result.collectors_failed:
        reasons = "; ".join(f"{n}: {r}" for n, r in result.collectors_failed.items())
        raise TargetError(f"{reasons}; kept what was recorded in {result.run_dir}")


def _target(data_dir: Path | None, dsn: str | None) -> SessionTarget:
    """--data-dir needs no connection (tracing reads processes, not SQL); --dsn alone is
    traceable only when the server runs here, which its port and start time tell."""
    from pgscope.collect.localserver import local_server_for
    from pgscope.errors import TargetError, UsageError
    from pgscope.session import SessionTarget
    from pgscope.target.conn import ConnParams
    from pgscope.target.local import LocalServer

    if data_dir is None and dsn is None:
        raise UsageError(
            "give --data-dir or --dsn: which server to trace (see: pgscope trace --help)"
        )
    local = LocalServer.from_data_dir(data_dir.expanduser().absolute()) if data_dir else None
    if dsn is None:
        return SessionTarget(None, local)
    conn = ConnParams.from_dsn(dsn)
    found = local_server_for(conn)
    if found is None:
        why = "" if os.geteuid() == 0 else " (as non-root, other users' servers are invisible)"
        raise TargetError(
            f"--dsn {conn.conninfo()}: the server does not run on this host{why}: no local "
            f"postmaster has its port and start time, and tracing needs its processes; run "
            f"pgscope on the database host, or give --data-dir"
        )
    if local is not None and found.pid != local.pid:
        raise UsageError(
            f"--dsn and --data-dir name different servers (postmasters {found.pid} and {local.pid})"
        )
    return SessionTarget(conn, local or found)


# -- console rendering (formatting only: the numbers come from analyze.usdt) ---------------


def _duration(ns: float | None) -> str:
    if ns is None:
        return "-"
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def _bucket(bucket: Bucket | None) -> str:
    if bucket is None:
        return "-"
    return f"[{_duration(bucket.lo_ns)}, {_duration(bucket.hi_ns)})"


def _histogram(out: Console, title: str, buckets: list[Bucket] | tuple[Bucket, ...]) -> None:
    """bpftrace's own look: one line per log2 bucket, bars scaled to the largest."""
    if not buckets:
        return
    out.print(title, highlight=False)
    peak = max(b.count for b in buckets) or 1
    for b in buckets:
        bar = "@" * round(40 * b.count / peak)
        out.print(f"  {_bucket(b):>24} {b.count:>9} |{bar:<40}|", highlight=False)


def _latency_table(title: str, rows: list[LatencySummary], object_label: str) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False)
    for name, justify in (
        (object_label, "left"),
        ("mode", "left"),
        ("count", "right"),
        ("total", "right"),
        ("mean", "right"),
        ("p50 in", "right"),
        ("p99 in", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for s in rows:
        table.add_row(
            s.object or s.event,
            s.mode or "-",
            f"{s.count:,}",
            _duration(s.total_ns),
            _duration(s.mean_ns),
            _bucket(s.quantile_bucket(0.5)),
            _bucket(s.quantile_bucket(0.99)),
        )
    return table


def _print_checkpoint(out: Console, ckpt: Checkpoint) -> None:
    when = time.strftime("%H:%M:%S", time.gmtime(ckpt.start_us / 1e6))
    total = ckpt.total_ns
    out.print(
        f"checkpoint at {when} UTC ({ckpt.flags_text or 'no flags'}), {ckpt.status}: total "
        f"{_duration(total)}; wrote {ckpt.buffers_written} of {ckpt.buffers_to_write} dirty "
        f"buffers ({ckpt.buffers_total} in shared_buffers); flushing took "
        f"{_duration(ckpt.flush_ns)} of it",
        highlight=False,
    )
    for phase in ckpt.phases:
        share = f"{100 * phase.duration_ns / total:5.1f}%" if total else ""
        out.print(f"  {phase.name:<10} {_duration(phase.duration_ns):>12} {share}", highlight=False)
    if ckpt.unaccounted_ns is not None:
        out.print(f"  {'(between)':<10} {_duration(ckpt.unaccounted_ns):>12}", highlight=False)
    _histogram(out, "  per-buffer flush latency", ckpt.flush_buckets)


EVENT_TITLES = {
    "lwlock_wait": "LWLock waits",
    "lwlock_hold": "LWLock holds",
    "lock_wait": "lock waits",
    "smgr_read": "block reads (smgr)",
    "smgr_write": "block writes (smgr)",
    "wal_dirty_write": "dirty WAL buffer writes by backends",
}


def print_summary(out: Console, summary: TraceSummary) -> None:
    out.print(f"{summary.program}: {summary.covered_s:.1f} s traced", highlight=False)
    labels = {"lwlock": "tranche", "locks": "lock type", "io": "operation"}
    if summary.program in labels:
        if not summary.latency:
            out.print("no events: nothing waited (or did I/O) while tracing", highlight=False)
        events = list(dict.fromkeys(s.event for s in summary.latency))
        for event in events:
            rows = [s for s in summary.latency if s.event == event]
            out.print(_latency_table(EVENT_TITLES.get(event, event), rows, labels[summary.program]))
        for s in summary.latency[:3]:
            _histogram(out, f"{s.event} {s.object or ''} {s.mode or ''}".strip(), s.buckets)
    if summary.program == "checkpoint":
        if not summary.checkpoints:
            out.print("no checkpoint started while tracing", highlight=False)
        for ckpt in summary.checkpoints:
            _print_checkpoint(out, ckpt)
    for name, total in summary.counters.items():
        rate = summary.rate(name)
        out.print(f"{name:<28} {total:>12,}  ({rate or 0:,.1f}/s)", highlight=False)
    if summary.buffer_hit_ratio is not None:
        out.print(
            f"{'buffer hit ratio':<28} {100 * summary.buffer_hit_ratio:>11.2f}%", highlight=False
        )
