"""The runner: from a validated spec to a run folder, step by step, always tearing down.

Order of work: plan the steps -> create the run store -> bring up the target (embedded cluster
or existing server) -> validate every variant's settings -> initialise the workload's tables ->
run the steps (apply the variant, run pgbench, store progress live, then percentiles) ->
tear down. SIGINT and SIGTERM become exceptions in the main thread, so the same `finally`
blocks stop pgbench and the server on every path; rows already stored stay stored.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import random
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pgscope import __version__
from pgscope.collect.base import CollectorContext, CollectorEnv, StepInfo
from pgscope.collect.manager import CollectorSet
from pgscope.drive.actions import StepActions
from pgscope.drive.pgbench import (
    LatencyStats,
    Pgbench,
    ProgressRow,
    RunningPgbench,
    Workload,
    analyse_logs,
    archive_logs,
    follow,
)
from pgscope.errors import (
    EnvironmentProblem,
    Interrupted,
    RefusedError,
    RunFailed,
    SpecError,
    TargetError,
)
from pgscope.host import describe_host, usable_cores
from pgscope.proc import RunAs, server_account, spawn, stop_process
from pgscope.signals import signals_as_exceptions
from pgscope.spec import DEFINE_PREFIX, WRITE_WORKLOADS, LoadedSpec, Spec, setting_text
from pgscope.store import RunMeta, RunStore
from pgscope.target.conn import ConnParams
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.introspect import non_default_settings, server_version
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


@dataclass(frozen=True)
class PlannedStep:
    step_id: int
    variant: str
    clients: int
    repeat: int


class Reporter(Protocol):
    """Progress for the user while the run goes on (the console renderer implements it)."""

    def phase(self, message: str) -> None: ...
    def step_started(self, step: PlannedStep, total: int, seconds: float) -> None: ...
    def progress(self, step: PlannedStep, row: ProgressRow) -> None: ...
    def step_finished(
        self, step: PlannedStep, stats: LatencyStats | None, error: str | None
    ) -> None: ...


def plan_steps(spec: Spec, cores: int, seed: int) -> list[PlannedStep]:
    """Every (variant, clients) cell once per repeat block.

    With order="random", each block visits the variants in a fresh random order and, within
    a variant, the client counts in a fresh random order: drift over the run (caches, disk,
    a noisy neighbour) spreads over all cells instead of masquerading as an effect. Cells of
    one variant stay together within a block, so a variant needing a restart costs one
    restart per block, not one per step.
    """
    rng = random.Random(seed)
    variants = list(spec.variants)
    clients = spec.client_counts(cores)
    steps: list[PlannedStep] = []
    for repeat in range(1, spec.repeats + 1):
        block_variants = variants[:]
        if spec.order == "random":
            rng.shuffle(block_variants)
        for variant in block_variants:
            block_clients = clients[:]
            if spec.order == "random":
                rng.shuffle(block_clients)
            for n in block_clients:
                steps.append(PlannedStep(len(steps) + 1, variant, n, repeat))
    return steps


def effective_settings(spec: Spec, variant: str) -> dict[str, str]:
    """The server settings of a variant (its own over the spec's), without pgscope's keys."""
    merged = {**spec.settings, **spec.variants[variant]}
    return {
        name: setting_text(value)
        for name, value in merged.items()
        if not name.startswith("pgscope.")
    }


def variant_cpus(spec: Spec, variant: str) -> int | None:
    """How many CPUs the variant pins the server to (`pgscope.cpus`), if any."""
    value = {**spec.settings, **spec.variants[variant]}.get("pgscope.cpus")
    return int(value) if value is not None else None


def variant_defines(spec: Spec, variant: str) -> tuple[tuple[str, str], ...]:
    """pgbench variables of a variant (`pgscope.define.NAME`), as -D pairs."""
    merged = {**spec.settings, **spec.variants[variant]}
    return tuple(
        (key[len(DEFINE_PREFIX) :], setting_text(value))
        for key, value in sorted(merged.items())
        if key.startswith(DEFINE_PREFIX)
    )


def variant_instances(spec: Spec, variant: str) -> int:
    """How many clusters side by side the variant runs (`pgscope.instances`), 1 by default."""
    return int({**spec.settings, **spec.variants[variant]}.get("pgscope.instances", 1))


def cpu_split(pinned: int | None, available: list[int]) -> tuple[set[int] | None, set[int] | None]:
    """(server CPUs, pgbench CPUs): the server on the first `pinned`, pgbench on the rest
    where any remain (else wherever the scheduler puts it); None means unpinned."""
    if pinned is None:
        return None, None
    server = set(available[:pinned])
    rest = set(available[pinned:])
    return server, rest or None


def new_run_id(spec_name: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{spec_name}-{secrets.token_hex(2)}"


@dataclass
class RunOutcome:
    run_dir: Path
    status: str  # "complete", "partial" (some steps failed), "interrupted", "failed"
    error: Exception | None


@dataclass
class RunContext:
    """Everything one run works with, passed explicitly (no global state)."""

    loaded: LoadedSpec
    steps: list[PlannedStep]
    store: RunStore
    reporter: Reporter
    collectors: CollectorSet
    cores: int
    keep_xact_logs: bool
    cpu_list: list[int]  # the CPUs pgscope may use, in order
    cluster: EmbeddedCluster | None = None
    standbys: list[EmbeddedCluster] = field(default_factory=list)
    instances: list[EmbeddedCluster] = field(default_factory=list)  # beyond the first
    server: ExistingServer | None = None
    driver: Pgbench | None = None  # once the target is up

    @property
    def pgbench(self) -> Pgbench:
        assert self.driver is not None, "the target is not up yet"
        return self.driver

    @property
    def spec(self) -> Spec:
        return self.loaded.spec

    def target_alive(self) -> bool:
        if self.cluster is not None:
            return self.cluster.is_alive()
        return self.server is None or self.server.is_alive()


def execute(
    loaded: LoadedSpec, options: RunOptions, reporter: Reporter, seed: int | None = None
) -> RunOutcome:
    """Run the experiment. Returns the outcome; the run folder always holds what was measured.

    Errors before the store exists (bad binaries, unwritable folder, unreachable server) raise
    directly: there is nothing to keep yet.
    """
    spec = loaded.spec
    cores = usable_cores()
    most_pinned = max((variant_cpus(spec, v) or 0 for v in spec.variants), default=0)
    if most_pinned > cores:
        raise EnvironmentProblem(
            f"{loaded.source}: a variant pins the server to {most_pinned} CPUs but this host "
            f"lets pgscope use {cores}; lower pgscope.cpus or run on a bigger host"
        )
    most_instances = max(variant_instances(spec, v) for v in spec.variants)
    if most_instances > min(spec.client_counts(cores)):
        raise SpecError(
            f"{loaded.source}: a variant splits the load over {most_instances} instances but "
            f"a step has only {min(spec.client_counts(cores))} clients; every instance needs one"
        )
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
    if options.dsn:
        server = ExistingServer(ConnParams.from_dsn(options.dsn), options.allow_writes)
        _check_server_request(spec, server, options.allow_writes)
        server.check_reachable()
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
    _make_results_dir(options.results_dir)
    check_free_space(options.results_dir, MIN_FREE_RESULTS, "the results folder")
    if account is not None:
        work = options.work_dir or Path(tempfile.gettempdir())
        check_free_space(
            work, MIN_FREE_CLUSTER + spec.scale * 16 * 2**20, "the cluster's folder (--work-dir)"
        )
    store = RunStore.create(run_dir, meta)
    store.add_event("plan", f"{len(steps)} steps, seed {seed}, {cores} usable cores")
    env = CollectorEnv(pg, target_kind, server.conn if server else None, os.geteuid() == 0)
    error: Exception | None = None
    try:
        with signals_as_exceptions():
            collectors = CollectorSet(spec.collector_selection(), env, store, reporter.phase)
            ctx = RunContext(
                loaded,
                steps,
                store,
                reporter,
                collectors,
                cores,
                options.keep_xact_logs,
                sorted(os.sched_getaffinity(0)),
                server=server,
            )
            try:
                if account is not None:
                    ctx.cluster = _start_cluster(ctx, pg, account, options, env)
                    conn = ctx.cluster.conn
                else:
                    assert server is not None
                    conn = server.conn
                ctx.driver = Pgbench(pg, conn, server is not None and not server.allow_writes)
                _run_steps(ctx, env)
            finally:
                # Last registered runs first; each runs even if one before it raised (a full
                # disk can fail the collectors' last writes: the servers must stop anyway).
                with contextlib.ExitStack() as cleanup:
                    if ctx.cluster is not None:
                        cleanup.callback(ctx.cluster.teardown)
                        cleanup.callback(reporter.phase, "stopping the embedded cluster")
                    for other in [*ctx.standbys, *ctx.instances]:
                        cleanup.callback(other.teardown)
                    cleanup.callback(collectors.stop)
    except (Interrupted, TargetError, RefusedError, RunFailed) as exc:
        error = exc
    except BaseException as exc:
        full = disk_full(exc)
        with contextlib.suppress(Exception):  # the store itself may be on the full disk
            store.finish_run("failed", full or str(exc) or type(exc).__name__)
        with contextlib.suppress(Exception):
            store.close()
        if full:
            raise EnvironmentProblem(
                f"{full}; the run stopped, keeping what was written to {run_dir} before"
            ) from None
        raise
    _ingest_server_log(store, run_dir / "server.log")
    status = _final_status(store, error)
    store.finish_run(status, str(error) if error else None)
    store.close()
    return RunOutcome(run_dir, status, error)


def _start_cluster(
    ctx: RunContext, pg: PgBinaries, account: RunAs, options: RunOptions, env: CollectorEnv
) -> EmbeddedCluster:
    """Start the embedded cluster with benchmark defaults plus what collectors need, and check
    every variant's settings with the server's own parser before any load."""
    startup = {
        **benchmark_defaults(max(s.clients for s in ctx.steps)),
        **ctx.collectors.startup_settings(env),
    }
    cluster = EmbeddedCluster(
        pg, account, ctx.store.run_dir / "server.log", startup, options.work_dir
    )
    ctx.cluster = cluster  # so that teardown happens even if start fails half-way
    ctx.reporter.phase(f"starting an embedded PostgreSQL cluster as {account.name}")
    cluster.start()
    if ctx.spec.standbys:
        names = [f"s{i}" for i in range(1, ctx.spec.standbys + 1)]
        ctx.reporter.phase(f"starting {len(names)} streaming standbys ({', '.join(names)})")
        for name in names:
            standby = EmbeddedCluster.standby_of(cluster, name)
            ctx.standbys.append(standby)  # before start: teardown must find it either way
            standby.start()
        cluster.wait_streaming(names)
        ctx.store.add_event("standbys", f"{', '.join(names)} streaming")
    for variant in ctx.spec.variants:
        cluster.validate_settings(effective_settings(ctx.spec, variant), f"variant {variant!r}")
    return cluster


MIN_FREE_RESULTS = 64 * 2**20  # the store, logs and per-step transaction logs of a short run
MIN_FREE_CLUSTER = 256 * 2**20  # initdb, WAL, and pgbench's tables on top (per scale unit)


def _make_results_dir(folder: Path) -> None:
    """Create the results folder first: a folder that cannot exist (read-only parent, a
    pseudo file system such as /proc) is the error to report, not its free space."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot create run folder {folder}: {exc.strerror or exc}"
        ) from None


def check_free_space(folder: Path, needed: int, what: str) -> None:
    """Refuse to start when a folder's file system is nearly full: better now, in one line,
    than a failed write in the middle of a step."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return  # unknown: the write will say
    if free < needed:
        raise EnvironmentProblem(
            f"{what} {folder} has {free / 2**20:.0f} MB free; this run "
            f"needs at least {needed / 2**20:.0f} MB"
        )


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


def _check_server_request(spec: Spec, server: ExistingServer, allow_writes: bool) -> None:
    if any(variant_instances(spec, v) > 1 for v in spec.variants):
        raise RefusedError(
            "pgscope.instances starts clusters of its own; it cannot split a "
            "user's server: drop --dsn"
        )
    if any(variant_cpus(spec, v) for v in spec.variants):
        raise RefusedError(
            "pgscope.cpus pins the server's processes; pgscope does that only "
            "to an embedded cluster it owns: drop --dsn"
        )
    if spec.standbys:
        raise RefusedError(
            "standbys are started by pgscope next to an embedded cluster; they "
            "cannot be added to an existing server: drop --dsn"
        )
    server.refuse_settings({k: setting_text(v) for k, v in spec.settings.items()}, "the spec")
    for name, settings in spec.variants.items():
        server.refuse_settings(
            {k: setting_text(v) for k, v in settings.items()}, f"variant {name!r}"
        )
    if allow_writes:
        return
    if spec.workload in WRITE_WORKLOADS:
        raise RefusedError(
            f"workload {spec.workload} writes to the server; pgscope only reads "
            f"from an existing server unless you pass --allow-writes"
        )
    if spec.init_sql:
        raise RefusedError("init_sql runs arbitrary SQL on the server; pass --allow-writes")
    if spec.actions:
        raise RefusedError(
            "actions run arbitrary SQL on the server during each step; pass --allow-writes"
        )


def _final_status(store: RunStore, error: Exception | None) -> str:
    if isinstance(error, Interrupted):
        return "interrupted"
    if error is not None:
        return "failed"
    statuses = [s["status"] for s in store.steps()]
    return "complete" if statuses and all(s == "ok" for s in statuses) else "partial"


def _run_steps(ctx: RunContext, env: CollectorEnv) -> None:
    spec, store, reporter = ctx.spec, ctx.store, ctx.reporter
    conn = ctx.pgbench.conn
    allow_writes = ctx.server is None or ctx.server.allow_writes
    with conn.connect() as session:
        version, version_num = server_version(session)
    store.set_server(version, version_num)
    if spec.scale > 0:
        reporter.phase(f"initialising pgbench tables at scale {spec.scale}")
        if ctx.pgbench.initialise(spec.scale, allow_writes=allow_writes):
            store.add_event("init", f"pgbench -i -s {spec.scale}")
    init_sql = ctx.loaded.init_sql_path()
    if init_sql is not None:
        reporter.phase(f"running {init_sql.name}")
        _run_init_sql(ctx.pgbench.pg, conn, init_sql)
        store.add_event("init", f"init_sql {init_sql}")

    cluster = ctx.cluster
    collector_ctx = CollectorContext(
        env=env,
        conn=conn,
        store=store,
        run_dir=store.run_dir,
        postmaster_pid=lambda: cluster.postmaster_pid if cluster is not None else None,
        data_dir=cluster.data_dir if cluster is not None else None,
        server_version_num=version_num,
        say=reporter.phase,
    )
    scripts = tuple(ctx.loaded.scripts())
    started = False
    pinned: set[int] | None = None
    seconds = math.ceil(spec.warmup + spec.duration)
    captured: set[str] = set()
    failures = 0
    crashes = 0
    for step in ctx.steps:
        restarted = False
        if cluster is not None:
            restarted = cluster.apply_settings(effective_settings(spec, step.variant))
            if restarted:
                store.add_event("restart", f"variant {step.variant}", step.step_id)
                if ctx.standbys:  # synchronous commits would wait for them to reconnect
                    cluster.wait_streaming([s.standby_name for s in ctx.standbys])
                if started:  # collectors not yet started have nothing to re-attach
                    ctx.collectors.target_restarted()
        server_cpus, bench_cpus = cpu_split(variant_cpus(spec, step.variant), ctx.cpu_list)
        if cluster is not None and server_cpus != pinned:
            cluster.pin(server_cpus)
            pinned = server_cpus
            store.add_event(
                "pin",
                f"server on CPUs {sorted(server_cpus)}, pgbench on "
                f"{sorted(bench_cpus) if bench_cpus else 'any'}"
                if server_cpus
                else "server unpinned",
                step.step_id,
            )
        elif cluster is not None and restarted and server_cpus:
            cluster.pin(server_cpus)  # a new postmaster starts unpinned
        if not started:
            # After the first variant's settings, so its restart (if any) is no gap.
            ctx.collectors.start(collector_ctx)
            started = True
        if step.variant not in captured:
            with conn.connect() as session:
                store.add_settings(step.variant, non_default_settings(session))
            captured.add(step.variant)
        if cluster is not None:
            # Each step starts from a clean checkpoint, so the previous step's dirty pages
            # are not flushed on this step's time.
            with conn.connect() as session:
                session.execute("CHECKPOINT")
        drivers = [ctx.pgbench, *_activate_instances(ctx, step)]
        threads = spec.pgbench_threads(step.clients, ctx.cores)
        store.begin_step(
            step.step_id,
            step.variant,
            step.clients,
            step.repeat,
            threads,
            spec.duration,
            spec.warmup,
            restarted,
        )
        reporter.step_started(step, len(ctx.steps), seconds)
        info = StepInfo(step.step_id, step.variant, step.clients, step.repeat)
        ctx.collectors.step_started(info)
        try:
            workload = Workload(
                spec.workload, scripts, spec.protocol, variant_defines(spec, step.variant)
            )
            ok = _run_one_step(ctx, step, workload, seconds, bench_cpus, drivers)
        finally:
            ctx.collectors.step_finished(info)
            ctx.collectors.reap()
        if not ok:
            failures += 1
            if not ctx.target_alive():
                if cluster is None:
                    raise TargetError(
                        f"the server became unreachable during step "
                        f"{step.step_id}; pgscope stops rather than wait for a "
                        f"server it does not own"
                    )
                crashes += 1
                _recover(ctx, cluster, step, crashes)
    if failures == len(ctx.steps):
        raise RunFailed(
            f"all {failures} steps failed; see the step errors in {store.run_dir} "
            f"(pgscope report {store.run_dir})"
        )


def _activate_instances(ctx: RunContext, step: PlannedStep) -> list[Pgbench]:
    """Make exactly the step's variant's extra instances run, with its settings, each fresh
    from a CHECKPOINT; stop (but keep) the others. Returns their drivers."""
    cluster = ctx.cluster
    wanted = variant_instances(ctx.spec, step.variant) - 1
    if cluster is None or (wanted == 0 and not ctx.instances):
        return []
    settings = effective_settings(ctx.spec, step.variant)
    while len(ctx.instances) < wanted:
        number = len(ctx.instances) + 2
        ctx.reporter.phase(f"starting instance {number} beside the first")
        instance = cluster.sibling(ctx.store.run_dir / f"server-{number}.log")
        ctx.instances.append(instance)  # before start: teardown must find it either way
        instance.start()
        driver = Pgbench(ctx.pgbench.pg, instance.conn, read_only=False)
        if ctx.spec.scale > 0:
            driver.initialise(ctx.spec.scale, allow_writes=True)
        init_sql = ctx.loaded.init_sql_path()
        if init_sql is not None:
            _run_init_sql(ctx.pgbench.pg, instance.conn, init_sql)
        ctx.store.add_event("instance", f"instance {number} started and initialised", step.step_id)
    drivers = []
    for index, instance in enumerate(ctx.instances):
        if index >= wanted:
            instance.stop()
            continue
        instance.resume()
        instance.apply_settings(settings)
        with instance.connect() as session:
            session.execute("CHECKPOINT")
        drivers.append(Pgbench(ctx.pgbench.pg, instance.conn, read_only=False))
    return drivers


MAX_CRASHES = 3  # an embedded server that keeps dying is a problem to report, not to retry


def _recover(ctx: RunContext, cluster: EmbeddedCluster, step: PlannedStep, crashes: int) -> None:
    """The embedded server died during `step` (killed, crashed): record it, start it again
    (PostgreSQL recovers from its WAL), and let the run go on with the next step."""
    reason = cluster.exit_reason()
    ctx.store.add_event("server-died", f"during step {step.step_id}: {reason}", step.step_id)
    if crashes > MAX_CRASHES:
        raise TargetError(
            f"the embedded server died {crashes} times (last: {reason}); see "
            f"{ctx.store.run_dir / 'server.log'}"
        )
    ctx.reporter.phase(
        f"the server died during step {step.step_id} ({reason}); restarting it and going on"
    )
    cluster.resume()
    if ctx.standbys:
        cluster.wait_streaming([s.standby_name for s in ctx.standbys])
    ctx.store.add_event("server-restarted", "after crash recovery", step.step_id)
    ctx.collectors.target_restarted()


def split_clients(clients: int, instances: int) -> list[int]:
    """Clients per instance, as even as can be: 8 over 3 -> [3, 3, 2]."""
    base, extra = divmod(clients, instances)
    return [base + (1 if i < extra else 0) for i in range(instances)]


def _run_one_step(
    ctx: RunContext,
    step: PlannedStep,
    workload: Workload,
    seconds: int,
    bench_cpus: set[int] | None,
    drivers: list[Pgbench],
) -> bool:
    """One step: pgbench against each active instance at once (one instance, usually), then
    statistics over every transaction of every instance."""
    store, reporter, warmup = ctx.store, ctx.reporter, ctx.spec.warmup
    step_dir = store.run_dir / "steps" / f"{step.step_id:04d}"
    shares = split_clients(step.clients, len(drivers))

    def on_progress(index: int, row: ProgressRow) -> None:
        store.add_progress(
            step.step_id,
            row.ts_us,
            row.tps,
            row.latency_ms,
            row.latency_stddev_ms,
            row.failed,
            instance=index + 1,
        )
        if index == 0:
            reporter.progress(step, row)

    actions = StepActions(ctx.pgbench.conn, ctx.spec.actions)
    actions.start()
    runs: list[RunningPgbench] = []
    try:
        for index, (driver, clients) in enumerate(zip(drivers, shares, strict=True)):
            prefix = "xact" if index == 0 else f"xact-{index + 1}"
            runs.append(
                driver.start(
                    workload,
                    clients=clients,
                    threads=ctx.spec.pgbench_threads(clients, ctx.cores),
                    seconds=seconds,
                    log_prefix=step_dir / prefix,
                    cpus=bench_cpus,
                )
            )
        results = follow(runs, on_progress)
    except Interrupted:
        for run in runs:
            run.finish()
        store.finish_step(step.step_id, "interrupted", "run interrupted during this step", {})
        raise
    finally:
        for done in actions.finish():
            store.add_event("action", done.describe(), step.step_id, ts_us=done.started_us)
    log_files = [f for result in results for f in result.log_files()]
    stats, per_second = analyse_logs(log_files, warmup)
    store.add_latency_seconds(
        step.step_id,
        [
            (s.second_us, s.xacts, s.failed, s.p50_ms, s.p95_ms, s.p99_ms, s.max_ms)
            for s in per_second
        ],
    )
    if len(results) > 1:
        for index, (result, clients) in enumerate(zip(results, shares, strict=True)):
            store.add_instance_result(
                step.step_id, index + 1, clients, result.summary.get("tps"), result.error
            )
    archive = step_dir / "xact.parquet"
    if ctx.keep_xact_logs:
        archived = archive_logs(log_files, archive)
    else:
        archived = 0
        for log in log_files:
            log.unlink()
    errors = [
        f"instance {i + 1}: {r.error}" if len(results) > 1 else r.error
        for i, r in enumerate(results)
        if r.error
    ]
    error = "; ".join(e for e in errors if e) or None
    if error is None and stats is None:
        error = "pgbench completed no transaction in the measured window"
    pgbench_tps = [r.summary.get("tps") for r in results]
    values: dict[str, object] = {
        "pgbench_tps": sum(t for t in pgbench_tps if t is not None) if any(pgbench_tps) else None,
        "xact_log": str(archive.relative_to(store.run_dir)) if archived else None,
    }
    if stats is not None:
        values.update(
            window_start_us=stats.window_start_us,
            window_end_us=stats.window_end_us,
            tps=stats.tps,
            xacts=stats.xacts,
            failed=stats.failed,
            latency_mean_ms=stats.mean_ms,
            p50_ms=stats.p50_ms,
            p90_ms=stats.p90_ms,
            p95_ms=stats.p95_ms,
            p99_ms=stats.p99_ms,
            p999_ms=stats.p999_ms,
            max_ms=stats.max_ms,
        )
    store.finish_step(step.step_id, "ok" if error is None else "failed", error, values)
    reporter.step_finished(step, stats, error)
    return error is None


def _run_init_sql(pg: PgBinaries, conn: ConnParams, path: Path) -> None:
    """Run a SQL file with psql: statement by statement (VACUUM and CREATE INDEX
    CONCURRENTLY cannot run in the one transaction a multi-statement query would be), with
    psql's own parsing of quoting and meta-commands, stopping at the first error."""
    argv = [
        str(pg.path("psql")),
        "-X",
        "-q",
        "-v",
        "ON_ERROR_STOP=1",
        "-f",
        str(path),
        conn.conninfo(),
    ]
    proc = spawn(argv, env=conn.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=3600)
    except BaseException:
        stop_process(proc, signal.SIGINT, grace_s=5)
        raise
    if proc.returncode != 0:
        lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
        reason = next((ln for ln in lines if "ERROR" in ln or "FATAL" in ln), None)
        if reason is None:
            reason = lines[-1] if lines else f"psql exited with {proc.returncode}"
        raise TargetError(f"init_sql failed: {reason}")
