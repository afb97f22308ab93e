"""`pgscope observe`: diagnose a running server's own workload, read-only, every layer."""

from __future__ import annotations

import enum
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pgscope.cli.app import DEFAULT_RESULTS, app, err_console, out_console, print_json
from pgscope.cli.livewaits import LIVE_FLUSH_S, LiveWaits
from pgscope.cli.options import (
    DSN_SOURCES_HELP,
    REPOSITORY_HELP,
    DataDir,
    DsnFile,
    LiveFlag,
    ResultsDir,
    repository_params,
    resolve_dsn,
)
from pgscope.collect.sampling.samplecost import COST_HZ, SAMPLE_COST_MS

if TYPE_CHECKING:
    from pgscope.session import SessionTarget


class Sampler(enum.StrEnum):
    """The activity collector's sources (collect/sampling/activity.py `source`)."""

    auto = "auto"
    sql = "sql"
    memory = "memory"


@app.command()
def observe(
    dsn: Annotated[
        str | None,
        typer.Option(
            help="The server to observe (libpq connection string or URI). A role with "
            "pg_monitor is enough. " + DSN_SOURCES_HELP
        ),
    ] = None,
    dsn_file: DsnFile = None,
    data_dir: DataDir = None,
    pid: Annotated[
        int | None,
        typer.Option("--pid", help="The server's postmaster PID (it must run on this host)."),
    ] = None,
    duration: Annotated[
        float, typer.Option(help="Seconds to observe.", min=1, max=7 * 86400)
    ] = 60.0,
    window: Annotated[
        float,
        typer.Option(
            help="Seconds per window: each gets its commits/s, concurrency, AAS by wait "
            "class, top waits and queries.",
            min=1,
            max=3600,
        ),
    ] = 10.0,
    hz: Annotated[float, typer.Option(help="Wait samples per second.", min=0.1, max=1000)] = 50.0,
    sampler: Annotated[
        Sampler,
        typer.Option(
            help="Where wait samples come from. auto: memory where it can (root, the server "
            "on this host, the sampler built with pgscope), else sql, saying why. memory: a "
            "compiled reader of "
            f"the server's shared memory, {SAMPLE_COST_MS['memory']:.3f} ms of CPU per "
            "sample, none of it the server's. sql: the server reads its status array for each "
            f"sample (any server, pg_monitor; {SAMPLE_COST_MS['sql']:.3f} ms per sample; both "
            f"measured at {COST_HZ} Hz). Both agree with pg_wait_sampling within a "
            "total-variation distance of 0.05 (docs/benchmarks.md); the report's wait "
            "sampling layer says which ran.",
            case_sensitive=False,
        ),
    ] = Sampler.auto,
    trace: Annotated[
        bool,
        typer.Option(
            "--trace",
            help="Also trace the server's static probes with bpftrace (LWLock and lock waits, "
            "checkpoints). Root and a local server; every cluster of the same binary pays "
            "the probes' traps while it runs (the report shows what it cost).",
        ),
    ] = False,
    profile: Annotated[
        bool,
        typer.Option(
            "--profile",
            help="Also record on-CPU profiles of the server's processes with perf (root and "
            "a local server; the report shows what it cost).",
        ),
    ] = False,
    live: LiveFlag = False,
    push: Annotated[
        str | None,
        typer.Option(
            "--push",
            help="Also push the observation to this central repository as it runs: each "
            "window once closed, the analysis at the end (docs/repository.md). While the "
            "repository is out of reach the windows wait in the run's store and go when it "
            "is back; the observation never waits for it. " + REPOSITORY_HELP,
        ),
    ] = None,
    push_file: Annotated[
        Path | None,
        typer.Option("--push-file", help="Read --push's connection string from this file."),
    ] = None,
    push_wait: Annotated[
        float,
        typer.Option(
            "--push-wait",
            help="With --push: seconds to keep trying, once the observation is over, while "
            "the repository is out of reach (the run folder keeps everything: `pgscope push` "
            "sends the rest later).",
            min=0,
            max=3600,
        ),
    ] = 60.0,
    results_dir: ResultsDir = DEFAULT_RESULTS,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print the run's document (docs/json.md), as `run` does."),
    ] = False,
) -> None:
    """Diagnose what limits a running server's own workload, read-only, from every layer.

    Samples every session's wait event, reads pg_stat_database/WAL/bgwriter each second and
    pg_stat_statements and the table statistics at each window's edges, pg_locks once a
    second, and, where the server runs on this host, its CPU; with --trace and --profile (as
    root, local server) its static probes and CPU profile too. The time is cut into windows:
    per window commits/s, concurrency and AAS; findings are judged on the whole observation,
    an outlying window is marked, and where concurrency varied a USL fit reads the server's
    scalability curve without a load test. Windows share their edges, and each is closed as
    it ends: a full results disk (exit 4) or the server lost (exit 5) stops the observation
    within seconds, and it, or a kill, keeps every window closed before for `pgscope report`.

    Read-only: every session is opened with default_transaction_read_only=on and runs only
    SELECT, SHOW and SET of its own session parameters; no extension is created, no setting
    changed. The report says which grant or extension each missing layer needs.

    Windows of 10 s or more read commits/s well: sessions add their commit counts to
    pg_stat_database when idle, at most once a second, so short windows under a lock queue
    lag. --data-dir or --pid alone connects as postgres to database postgres over the
    server's socket; add --dsn to connect otherwise (it must be the same server). More:
    docs/observe.md.

    \b
    Examples:
      pgscope observe --dsn "host=db1 dbname=app user=monitor" --duration 600
      pgscope observe --data-dir /var/lib/postgresql/15/main --duration 300 --trace --profile
      pgscope observe --dsn "..." --duration 120 --window 5 --json > observation.json
      pgscope observe --dsn "..." --duration 86400 --push "host=fleet dbname=pgscope"
      pgscope report results/<run-id> --format html
    """
    from pgscope.analyze.load import load_analysis
    from pgscope.cli.title import safe_command_line
    from pgscope.collect import offered, registry
    from pgscope.collect.sampling.pgws import PgwsCollector
    from pgscope.drive.readonly import verify_read_only
    from pgscope.errors import EnvironmentProblem, PgscopeError, TargetError
    from pgscope.render.console import print_summary
    from pgscope.render.json_doc import run_document
    from pgscope.render.outputs import write_outputs
    from pgscope.session import collect
    from pgscope.signals import signals_deferred
    from pgscope.store import RunStore
    from pgscope.target.pgbin import find_binaries
    from pgscope.words import counted

    repository = repository_params(push, push_file, "--push", env=False, required=False)
    target = _target(dsn, dsn_file, data_dir, pid)
    assert target.conn is not None
    verify_read_only(target.conn, scripts=False)
    pg = find_binaries(None, need_server=False)
    err = err_console()

    def say(message: str) -> None:
        err.print(f"· {message}", highlight=False)

    selection = _selection(target, hz, trace, profile)
    selection["activity"]["source"] = sampler.value
    if live:  # the view reads the store each second
        selection["activity"]["flush_s"] = LIVE_FLUSH_S
    from pgscope.collect.base import CollectorEnv

    env = CollectorEnv(pg, target.kind, target.conn, os.geteuid() == 0)
    if PgwsCollector.check(env).ok:
        selection["pgws"] = {}
    where = (
        f"postmaster {target.local.pid} ({target.local.data_dir})"
        if target.local is not None
        else target.conn.conninfo()
    )
    pusher, pushed_to = None, ""
    if repository is not None:
        from pgscope.repository.live import LivePusher

        pusher, pushed_to = LivePusher(repository, say), repository.conninfo()
        pusher.check()  # a repository too new (or old) for this pgscope: said before observing
        say(f"pushing each window to the repository {pushed_to} as it closes")
    say(f"observing {where} for {duration:g} s in windows of {window:g} s, read-only")

    def progress(elapsed: float) -> None:
        if int(elapsed) % 30 == 0:
            say(f"observing: {elapsed:.0f}/{duration:.0f} s")

    with LiveWaits(live, duration, err, command="observe") as view:

        def opened(store: RunStore) -> None:
            view.opened(store)
            for name in ("usdt", "perf"):  # what the opt-in layers cost, for the report
                if name in selection:
                    store.add_event("cost", f"{name}: {registry()[name].cost}")
            if pusher is not None:
                pusher.start(store)

        result = collect(
            name="observe",
            selection=selection,
            target=target,
            pg=pg,
            duration_s=duration,
            results_dir=results_dir,
            command_line=safe_command_line(["pgscope", *sys.argv[1:]]),
            say=say,
            every_second=view.refresh if live else progress,
            on_store=opened,
            window_s=window,
            on_windows_closed=None if pusher is None else pusher.windows_closed,
            before_close=None if pusher is None else pusher.stop,
        )
    with signals_deferred() as late:
        analysis = load_analysis(result.run_dir)
        document = run_document(analysis)
        written: dict[str, Path] | None = None
        try:
            written = write_outputs(analysis, offered())
        except EnvironmentProblem:
            if result.fault is None:
                raise  # a full disk the observation itself did not meet
    if late:
        raise late[0]
    if written is not None:
        err.print(f"· report: {written['report.html']}", highlight=False)
    pushed_error = None
    if pusher is not None:
        try:
            # Interrupted: one try (whoever pressed Ctrl-C is waiting).
            pusher.finish(result.run_dir, document, 0 if result.interrupted else push_wait)
            say(f"pushed to the repository {pushed_to}")
        except PgscopeError as exc:
            pushed_error = exc
        finally:
            pusher.close()
    if as_json:
        print_json(document)
    else:
        print_summary(out_console(), analysis)
    if result.interrupted is not None:
        result.interrupted.add_note(f"kept what was observed in {result.run_dir}")
        raise result.interrupted
    if result.fault is not None:
        kept = f"kept the {counted(result.windows_closed, 'window')} closed before it in "
        kept += str(result.run_dir)
        if written is None:
            kept += f" (no room for its report: pgscope report {result.run_dir} reads it)"
        result.fault.add_note(kept)
        raise result.fault
    failed = result.collectors_failed.get("activity")
    if failed:
        raise TargetError(f"{failed}; kept what was observed in {result.run_dir}")
    if pushed_error is not None:
        raise pushed_error


def _selection(
    target: SessionTarget, hz: float, trace: bool, profile: bool
) -> dict[str, dict[str, Any]]:
    """Every collector that applies to a server pgscope does not own: the SQL ones always,
    host CPU where the server runs here, kernel tracing and profiles only when asked."""
    selection: dict[str, dict[str, Any]] = {
        "activity": {"hz": hz},
        "pgstats": {},
        "statements": {"wait_for_load": False, "follow_load": True},
        "pglocks": {},
        # The heaviest statements' estimated plans: where their execution goes, by cost.
        "explain": {},
    }
    if target.local is not None:
        selection["host"] = {}
        selection["serverlog"] = {}
    if trace:
        selection["usdt"] = {}
    if profile:
        selection["perf"] = {}
    return selection


def _target(
    dsn: str | None, dsn_file: Path | None, data_dir: Path | None, pid: int | None
) -> SessionTarget:
    """The server: by connection string, data directory or postmaster PID (or several, which
    must agree); a local one found by its port and start time when only --dsn is given."""
    from pgscope.collect.localserver import local_server_for
    from pgscope.drive.readonly import guarded
    from pgscope.errors import UsageError
    from pgscope.session import SessionTarget
    from pgscope.target.conn import ConnParams
    from pgscope.target.local import LocalServer

    text, source = resolve_dsn(dsn, dsn_file)
    if data_dir is not None and pid is not None:
        raise UsageError("--data-dir and --pid: give one of them")
    local = None
    if data_dir is not None:
        local = LocalServer.from_data_dir(data_dir.expanduser().absolute())
    elif pid is not None:
        local = LocalServer.from_data_dir(_data_dir_of(pid))
        if local.pid != pid:
            raise UsageError(f"--pid {pid}: not a postmaster (its server's is {local.pid})")
    if text is None and local is None:
        raise UsageError(
            "which server? give --dsn, --dsn-file, $PGSCOPE_DSN, --data-dir or --pid "
            "(see: pgscope observe --help)"
        )
    conn = ConnParams.from_dsn(text, source) if text is not None else local.conn()  # type: ignore[union-attr]
    conn = guarded(conn)  # every session pgscope opens is read-only, by the server's rule
    found = local_server_for(conn)
    if local is not None and found is not None and found.pid != local.pid:
        raise UsageError(
            f"the connection and the local server name different servers (postmasters "
            f"{found.pid} and {local.pid})"
        )
    return SessionTarget(conn, local or found)


def _data_dir_of(pid: int) -> Path:
    from pgscope.errors import TargetError

    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except FileNotFoundError:
        raise TargetError(f"--pid {pid}: no such process") from None
    except PermissionError:
        raise TargetError(
            f"--pid {pid}: cannot read its working directory (run as root or as the server's owner)"
        ) from None
    if comm != "postgres":
        raise TargetError(f"--pid {pid}: process {comm!r} is not a PostgreSQL server")
    return cwd
