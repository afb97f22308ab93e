"""The loop over the planned steps: each step's variant applied to the servers, collectors
started once, failed steps counted, a crashed embedded server restarted."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import psycopg

from pgscope.collect.base import CollectorContext, CollectorEnv, StepInfo
from pgscope.drive.pgbench import BUILTIN_PRIVILEGES, Workload
from pgscope.errors import RunFailed, TargetError
from pgscope.runner.context import RunContext
from pgscope.runner.initialise import initialise_target
from pgscope.runner.instances import activate_instances
from pgscope.runner.plan import PlannedStep
from pgscope.runner.step import run_step
from pgscope.runner.variants import cpu_split, effective_settings, variant_cpus, variant_defines
from pgscope.store import now_us
from pgscope.target.embedded import EmbeddedCluster
from pgscope.target.introspect import non_default_settings
from pgscope.words import n_clients

MAX_CRASHES = 3  # an embedded server that keeps dying is a problem to report, not to retry


def run_steps(ctx: RunContext, env: CollectorEnv) -> None:
    """Initialise the target, then run every planned step in order. Raises RunFailed when
    every step failed (a step whose workload's transactions errored did not), TargetError
    when a server pgscope does not own became unreachable."""
    spec, store, reporter = ctx.spec, ctx.store, ctx.reporter
    conn = ctx.pgbench.conn
    version_num = initialise_target(ctx)
    if ctx.servers.server is not None and spec.workload in BUILTIN_PRIVILEGES:
        # A role without them would see every client aborted: said now, with the GRANT.
        ctx.servers.server.check_privileges(
            BUILTIN_PRIVILEGES[spec.workload], f"workload {spec.workload}"
        )

    cluster = ctx.servers.cluster
    collector_ctx = CollectorContext(
        env=env,
        conn=conn,
        store=store,
        run_dir=store.run_dir,
        postmaster_pid=lambda: cluster.postmaster_pid if cluster is not None else None,
        data_dir=cluster.data_dir if cluster is not None else None,
        server_version_num=version_num,
        say=reporter.phase,
        other_postmasters=lambda: [
            pid
            for other in (*ctx.servers.standbys, *ctx.servers.instances)
            if (pid := other.postmaster_pid) is not None
        ],
    )
    scripts = tuple(ctx.loaded.scripts())
    state = _Prepared()
    seconds = math.ceil(spec.warmup + spec.duration)
    failures = 0
    crashes = 0
    peaks: dict[str, tuple[float, int] | None] = {}
    for step in ctx.steps:
        if step.open_loop and step.rate is None:
            resolved = _resolve(ctx, step, peaks)
            if resolved is None:
                failures += 1
                continue
            step = resolved
        try:
            restarted, bench_cpus = _prepare(ctx, step, collector_ctx, state)
        except TargetError as exc:
            if cluster is None:
                raise
            # Not even a connection after an earlier failure (a server restarting in a loop
            # after each PANIC): said with the server's own words, the summary kept.
            complaint = cluster.complaint()
            raise TargetError(
                str(exc) if complaint in str(exc) else f"{exc}; server log: {complaint}"
            ) from None
        except psycopg.Error as exc:
            # The server failed before the load (a PANIC in the CHECKPOINT, a crash while
            # reading settings): the step's fault, recorded, and the run goes on if it can.
            failures += 1
            _fail_before_load(ctx, step, exc)
            if cluster is not None and not cluster.is_alive():
                crashes += 1
                _recover(ctx, cluster, step, crashes)
            elif cluster is None and not ctx.servers.target_alive():
                raise TargetError(
                    f"the server became unreachable before step {step.step_id}; pgscope stops "
                    f"rather than wait for a server it does not own"
                ) from None
            continue
        drivers = [ctx.pgbench, *activate_instances(ctx, step)]
        _begin(ctx, step, restarted)
        reporter.step_started(step, len(ctx.steps), seconds)
        info = StepInfo(step.step_id, step.variant, step.clients, step.repeat)
        ctx.collectors.step_started(info)
        try:
            workload = Workload(
                spec.workload,
                scripts,
                spec.protocol,
                variant_defines(spec, step.variant),
                spec.max_tries,
                spec.connect_per_transaction,
                step.rate,
                spec.latency_limit_ms() if step.rate is not None else None,
            )
            status = run_step(ctx, step, workload, seconds, bench_cpus, drivers)
        finally:
            ctx.collectors.step_finished(info)
            ctx.collectors.reap()
        # A step whose transactions errored ("errors") measured what the workload does: a
        # result, not a failure of the run.
        if status == "failed":
            failures += 1
            if not ctx.servers.target_alive():
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


def _resolve(
    ctx: RunContext, step: PlannedStep, peaks: dict[str, tuple[float, int] | None]
) -> PlannedStep | None:
    """An open-loop step's rate in tps, from its variant's peak: the highest mean tps of the
    sweep's cells, measured before any rate (recorded as an event once per variant). None,
    the step recorded as failed, when the sweep measured no peak."""
    if step.variant not in peaks:
        rows = ctx.store.query(
            "SELECT clients, avg(tps) AS tps FROM steps WHERE variant = ? AND status = 'ok' "
            "AND rate IS NULL AND tps > 0 GROUP BY clients ORDER BY tps DESC, clients LIMIT 1",
            [step.variant],
        )
        peaks[step.variant] = (float(rows[0]["tps"]), int(rows[0]["clients"])) if rows else None
        if rows:
            ctx.store.add_event(
                "peak",
                f"variant {step.variant}: the sweep's peak is {rows[0]['tps']:,.0f} tps at "
                f"{n_clients(rows[0]['clients'])}; its offered rates follow",
                step.step_id,
            )
    peak = peaks[step.variant]
    assert step.offered is not None
    rate = step.offered.resolve(peak[0] if peak else None)
    if peak is None or rate is None:
        error = (
            f"the closed-loop sweep of variant {step.variant} measured no throughput, so "
            f"{step.offered.label} cannot be offered"
        )
        _begin(ctx, step, restarted=False)
        ctx.store.finish_step(step.step_id, "failed", error, {})
        ctx.store.add_event("step-failed", error, step.step_id)
        ctx.reporter.step_finished(step, None, error, "failed")
        return None
    return step.resolved(rate)


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
    ctx.servers.wait_standbys()
    ctx.store.add_event("server-restarted", "after crash recovery", step.step_id)
    ctx.collectors.target_restarted()


@dataclass
class _Prepared:
    """What earlier steps' preparation did, for the next one's."""

    started: bool = False  # the collectors
    pinned: set[int] | None = None  # the server's CPUs
    captured: set[str] = field(default_factory=set)  # variants whose settings are stored


def _prepare(
    ctx: RunContext, step: PlannedStep, collector_ctx: CollectorContext, state: _Prepared
) -> tuple[bool, set[int] | None]:
    """Everything before a step's load: its variant's settings, CPU pinning, collectors
    started once, settings captured, a checkpoint. Returns whether the server restarted for
    the settings, and the CPUs for pgbench."""
    spec, store, conn, cluster = ctx.spec, ctx.store, ctx.pgbench.conn, ctx.servers.cluster
    restarted = False
    if cluster is not None:
        restarted = cluster.apply_settings(effective_settings(spec, step.variant))
        if restarted:
            store.add_event("restart", f"variant {step.variant}", step.step_id)
            ctx.servers.wait_standbys()
            if state.started:  # collectors not yet started have nothing to re-attach
                ctx.collectors.target_restarted()
    server_cpus, bench_cpus = cpu_split(variant_cpus(spec, step.variant), ctx.cpu_list)
    if cluster is not None and server_cpus != state.pinned:
        cluster.pin(server_cpus)
        state.pinned = server_cpus
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
    if not state.started:
        # After the first variant's settings, so its restart (if any) is no gap.
        ctx.collectors.start(collector_ctx)
        state.started = True
    if step.variant not in state.captured:
        with conn.connect() as session:
            store.add_settings(step.variant, non_default_settings(session))
        state.captured.add(step.variant)
    if cluster is not None:
        # Each step starts from a clean checkpoint, so the previous step's dirty pages
        # are not flushed on this step's time. Recorded, so that the report marks it as
        # pgscope's own, not the server's.
        with conn.connect() as session:
            issued = now_us()
            session.execute("CHECKPOINT")
            took_ms = (now_us() - issued) / 1000
        store.add_event(
            "pgscope-checkpoint",
            f"CHECKPOINT before step {step.step_id}, took {took_ms:,.0f} ms",
            step.step_id,
            ts_us=issued,
        )
    return restarted, bench_cpus


def _begin(ctx: RunContext, step: PlannedStep, restarted: bool) -> None:
    """The step's row in the store, as planned; its end fills in the rest."""
    spec = ctx.spec
    ctx.store.begin_step(
        step.step_id,
        step.variant,
        step.clients,
        step.repeat,
        spec.pgbench_threads(step.clients, ctx.cores),
        spec.duration,
        spec.warmup,
        restarted,
        rate=step.rate,
        rate_share=step.offered.share_of_peak if step.offered is not None else None,
        latency_limit_ms=spec.latency_limit_ms() if step.open_loop else None,
    )


def _fail_before_load(ctx: RunContext, step: PlannedStep, exc: psycopg.Error) -> None:
    """Record `step` as failed before its load began, with the server's own words."""
    cluster = ctx.servers.cluster
    lines = str(exc).strip().splitlines()
    reason = exc.diag.message_primary or (lines[0] if lines else type(exc).__name__)
    if cluster is not None:
        reason = f"{reason}; server log: {cluster.complaint()}"
    error = f"the server failed before the load: {reason}"
    _begin(ctx, step, restarted=False)
    ctx.store.finish_step(step.step_id, "failed", error, {})
    ctx.store.add_event("step-failed", error, step.step_id)
    ctx.reporter.step_finished(step, None, error, "failed")
