"""One run, from a validated spec to its run folder: preflight, the store, the servers, the
steps, and the run's final status, on every way out."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgscope import __version__, leftovers
from pgscope.collect import registry
from pgscope.collect.base import CollectorEnv
from pgscope.collect.manager import CollectorSet
from pgscope.collect.roles import postmasters_of
from pgscope.drive.loaduser import LoadUser, load_account
from pgscope.drive.pgbench import Pgbench
from pgscope.drive.readonly import check_script_reads, verify_read_only
from pgscope.errors import EnvironmentProblem, Interrupted, RefusedError, RunFailed, TargetError
from pgscope.host import describe_host, usable_cores
from pgscope.proc import RunAs, server_account
from pgscope.runner.context import Reporter, RunContext
from pgscope.runner.loop import run_steps
from pgscope.runner.plan import plan_steps
from pgscope.runner.preflight import (
    check_folders,
    check_request,
    check_role,
    check_tables,
    validate_variants,
)
from pgscope.runner.reproduce import keep_spec, keep_versions
from pgscope.runner.topology import Topology
from pgscope.signals import received, signals_as_exceptions, signals_deferred
from pgscope.spec import LoadedSpec, Spec
from pgscope.store import RunMeta, RunStore
from pgscope.target.conn import ConnParams
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import PgBinaries, find_binaries
from pgscope.target.server import ExistingServer
from pgscope.target.serverlog import checkpoint_events


@dataclass(frozen=True)
class RunOptions:
    """How to run (not what): these never change the experiment's meaning."""

    results_dir: Path
    command_line: str
    pg_bin: Path | None = None
    dsn: str | None = None
    allow_writes: bool = False
    run_as: str | None = None
    work_dir: Path | None = None
    keep_xact_logs: bool = True


@dataclass
class RunOutcome:
    run_dir: Path
    # "complete" (every step ok or "errors"), "partial" (some steps failed), "interrupted",
    # "failed"
    status: str
    error: Exception | None


def new_run_id(spec_name: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{spec_name}-{secrets.token_hex(2)}"


def execute(
    loaded: LoadedSpec, options: RunOptions, reporter: Reporter, seed: int | None = None
) -> RunOutcome:
    """Run the experiment. Returns the outcome; the run folder always holds what was measured.

    Errors before the store exists (bad binaries, unwritable folder, unreachable server) raise
    directly: there is nothing to keep yet.
    """
    spec = loaded.spec
    cores = usable_cores()
    target = ConnParams.from_dsn(options.dsn) if options.dsn else None
    check_request(loaded, cores, target, options.allow_writes)
    if spec.seed is not None:
        seed = spec.seed
    elif seed is None:
        seed = secrets.randbelow(2**31)
    steps = plan_steps(spec, cores, seed)
    target_kind = "server" if options.dsn else "embedded"
    pg = find_binaries(options.pg_bin, need_server=target_kind == "embedded")
    pg.path("pgbench")  # fail now, not after initdb, when pgbench is missing
    server: ExistingServer | None = None
    account: RunAs | None = None
    power: str | None = None
    if target is not None:
        server = ExistingServer(target, options.allow_writes)
        server.check_reachable()
        if not options.allow_writes:
            verify_read_only(server.conn, scripts=bool(loaded.scripts()))
            power = check_role(server, loaded.scripts())
            if loaded.scripts():  # reads only, by PostgreSQL's parser and catalog
                check_script_reads(server.conn, [script.path for script in loaded.scripts()])
            check_tables(server, spec.scale)
        if power is not None:
            power = (
                f"{power}; the built-in {spec.workload} workload runs under the read-only "
                f"guard only (a user script would be refused)"
            )
            reporter.phase(power)
    else:
        account = server_account(options.run_as)

    run_id = new_run_id(spec.name)
    run_dir = options.results_dir / run_id
    meta = RunMeta(
        run_id,
        spec.name,
        loaded.source,
        loaded.toml_text,
        spec.model_dump_json(),
        options.command_line,
        __version__,
        target_kind,
        server.conn.conninfo() if server else "embedded",
        describe_host(),
    )
    work_parent = options.work_dir or Path(tempfile.gettempdir())
    cluster_dir = work_parent if account is not None else None
    check_folders(options.results_dir, cluster_dir, spec.scale)
    store = RunStore.create(run_dir, meta)
    try:
        keep_spec(run_dir, loaded, cores, seed, options.command_line)
    except BaseException as exc:
        _fail(store, run_dir, exc)
        raise
    store.add_event("plan", f"{len(steps)} steps, seed {seed}, {cores} usable cores")
    if power is not None:
        store.add_event("privileges", power)
    for leftover in leftovers.find([work_parent, Path(tempfile.gettempdir())]):
        reporter.phase(f"removing what a killed run left: {leftover.describe()}")
        leftovers.remove(leftover)
        store.add_event("cleanup", f"removed {leftover.describe()}")
    env = CollectorEnv(pg, target_kind, server.conn if server else None, os.geteuid() == 0)
    error: Exception | None = None
    try:
        with signals_as_exceptions():
            collectors = CollectorSet(
                run_selection(spec, server is not None, reporter.phase, loaded.own_collectors),
                env,
                store,
                reporter.phase,
            )
            with (
                LoadUser.private(load_account(options.run_as), work_parent) as load_user,
                Topology(reporter.phase, store, server) as servers,
            ):
                ctx = RunContext(
                    loaded,
                    steps,
                    store,
                    reporter,
                    collectors,
                    cores,
                    options.keep_xact_logs,
                    sorted(os.sched_getaffinity(0)),
                    servers,
                )
                try:
                    if account is not None:
                        _start_cluster(ctx, pg, account, options, env)
                    ctx.driver = Pgbench(
                        pg, servers.conn, server is not None and not server.allow_writes, load_user
                    )
                    run_steps(ctx, env)
                finally:
                    # While the servers they watch are still up; the servers stop even if
                    # this raised (a full disk can fail the collectors' last writes).
                    collectors.stop()
    except (Interrupted, TargetError, RefusedError, RunFailed) as exc:
        error = exc
    except Exception as exc:
        signalled = received()
        if signalled is None:
            _fail(store, run_dir, exc)
            raise
        # A signal whose exception a library replaced by its own (DuckDB: "Query
        # interrupted" while analysing a step's log): still a Ctrl-C, not an internal error.
        signalled.add_note(f"(it arrived as: {type(exc).__name__}: {exc})")
        error = signalled
    except BaseException as exc:
        _fail(store, run_dir, exc)
        raise
    # The run's last writes are not cut short: a signal now is kept, and returned as the
    # run's error when it had none (the steps were all measured).
    with signals_deferred() as late:
        _ingest_server_log(store, run_dir / "server.log")
        status = _final_status(store, error)
        store.finish_run(status, str(error) if error else None)
        run = store.run_row()
        store.close()
        with contextlib.suppress(EnvironmentProblem):  # the store has them too
            keep_versions(run_dir, run["server_version"], run["server_version_num"], _pgbench(pg))
    return RunOutcome(run_dir, status, error or (late[0] if late else None))


def _pgbench(pg: PgBinaries) -> str | None:
    """pgbench's version, as it says it (None when it cannot say)."""
    try:
        return pg.version("pgbench") or None
    except (OSError, subprocess.SubprocessError, EnvironmentProblem):
        return None


def run_selection(
    spec: Spec, on_users_server: bool, say: Callable[[str], None], own: bool = True
) -> dict[str, dict[str, Any]]:
    """The collectors to run (`run --plan` lists them too). On a user's server, those that
    attach to its processes or its binary (kernel tracing, profiles) run only when the user
    named them (`--collectors`, a [collectors] table of their spec file): by default they
    would cost every cluster of that binary, not only the target. `own` False: the selection
    is not the user's (a received run folder's spec.toml under `run --again`), and names
    none of those on their server: only their own --collectors does."""
    selection = spec.collector_selection()
    known = registry()
    if on_users_server and spec.collectors is None:
        # Those that run only on clusters pgscope starts (they write to the server) are no
        # default on a user's: `--plan` listed the WAL probe, which the run then called
        # unavailable. Named by the user, the run says why not.
        for name in [n for n in selection if n in known and known[n].embedded_only]:
            del selection[name]
    if not on_users_server or (spec.collectors is not None and own):
        return selection
    for name in [n for n in selection if n in known and known[n].intrusive]:
        del selection[name]
        if spec.collectors is not None:
            say(
                f"{name}: named by the run folder's spec.toml, not by you: not run on a server "
                f"pgscope did not start (kernel tracing and profiles run there only when the "
                f"command line names them: --collectors ...,{name})"
            )
            continue
        say(
            f"{name}: not by default on a server pgscope did not start (it attaches to the "
            f"server's binary: every cluster of it would pay); --collectors ...,{name} runs it"
        )
    return selection


def _fail(store: RunStore, run_dir: Path, exc: BaseException) -> None:
    """The run failed on an unexpected error: recorded as failed; a full disk said as such."""
    full = disk_full(exc)
    with contextlib.suppress(Exception):  # the store itself may be on the full disk
        store.finish_run("failed", full or str(exc) or type(exc).__name__)
    with contextlib.suppress(Exception):
        store.close()
    if full:
        raise EnvironmentProblem(
            f"{full}; the run stopped, keeping what was written to {run_dir} before"
        ) from None


def _start_cluster(
    ctx: RunContext, pg: PgBinaries, account: RunAs, options: RunOptions, env: CollectorEnv
) -> EmbeddedCluster:
    """Start the embedded cluster with benchmark defaults plus what collectors need, and check
    every variant's settings with the server's own parser before any load."""
    startup = {
        **benchmark_defaults(max(s.clients for s in ctx.steps)),
        **ctx.collectors.startup_settings(env),
    }
    cluster = ctx.servers.start_embedded(pg, account, startup, options.work_dir, ctx.spec.standbys)
    _warn_bystanders(ctx, pg, cluster)
    validate_variants(cluster, ctx.spec)
    return cluster


def _warn_bystanders(ctx: RunContext, pg: PgBinaries, cluster: EmbeddedCluster) -> None:
    """Kernel tracing attaches to the binary, not to one cluster: every other cluster of the
    same binary pays the probe traps while this run traces. Say so, with the cost."""
    if not any(c.name == "usdt" for c in ctx.collectors.active):
        return  # perf samples only the processes it is given; bpftrace uprobes patch the file
    ours = {cluster.postmaster_pid, *(s.postmaster_pid for s in ctx.servers.standbys)}
    others = [p for p in postmasters_of(pg.path("postgres")) if p not in ours]
    if others:
        message = (
            f"{len(others)} other cluster(s) run {pg.path('postgres')} (postmaster PID "
            f"{', '.join(map(str, others))}) and hit the same probe sites while this run "
            f"traces them (usdt): its default programs cost such a bystander "
            f"nothing measurable, its io and lwlock_hold programs 22% and 59% of its tps "
            f"(docs/benchmarks.md)"
        )
        ctx.reporter.phase(message)
        ctx.store.add_event("bystanders", message)


def disk_full(exc: BaseException) -> str | None:
    """A one-line account of a write that failed because the disk is full, else None."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return f"the disk is full: {exc.filename or ''} {exc.strerror}".strip()
    text = str(exc)
    if "No space left on device" in text or "ENOSPC" in text:
        return "the disk is full: " + " ".join(text.split())[:200]
    return None


def _ingest_server_log(store: RunStore, log: Path) -> None:
    """Checkpoint starts and ends from the embedded server's log, as events of the step
    they fall in (none for a user's server: pgscope does not read its log)."""
    windows = store.query("SELECT step_id, started_us, ended_us FROM steps")
    for event in checkpoint_events(log):
        step_id = next(
            (
                w["step_id"]
                for w in windows
                if w["started_us"] <= event.ts_us <= (w["ended_us"] or event.ts_us)
            ),
            None,
        )
        store.add_event(event.kind, event.detail, step_id, ts_us=event.ts_us)


def _final_status(store: RunStore, error: Exception | None) -> str:
    if isinstance(error, Interrupted):
        return "interrupted"
    if error is not None:
        return "failed"
    # A step whose workload's own transactions errored is a result: the run measured it.
    statuses = [s["status"] for s in store.steps()]
    return "complete" if statuses and all(s in ("ok", "errors") for s in statuses) else "partial"
