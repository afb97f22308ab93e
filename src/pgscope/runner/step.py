"""One step: pgbench run against the active instances, its transactions measured and stored."""

from __future__ import annotations

from pgscope.drive.actions import StepActions
from pgscope.drive.pgbench import (
    Pgbench,
    ProgressRow,
    RunningPgbench,
    ScheduleStats,
    SecondStats,
    StepRun,
    Workload,
    analyse_logs,
    analyse_schedule,
    archive_logs,
    follow,
)
from pgscope.errors import Interrupted
from pgscope.runner.context import RunContext
from pgscope.runner.instances import split_clients
from pgscope.runner.plan import PlannedStep


def run_step(
    ctx: RunContext,
    step: PlannedStep,
    workload: Workload,
    seconds: int,
    bench_cpus: set[int] | None,
    drivers: list[Pgbench],
) -> str:
    """One step: pgbench against each active instance at once (one instance, usually), then
    statistics over every transaction of every instance. Returns the step's status."""
    store, reporter = ctx.store, ctx.reporter
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
    return _measure(ctx, step, results, shares)


def _measure(ctx: RunContext, step: PlannedStep, results: list[StepRun], shares: list[int]) -> str:
    """Statistics of the step from every instance's transaction log, stored with the step's
    end; the logs archived (or removed). Returns the step's status: "ok"; "errors" when the
    load ran and its transactions errored (pgbench aborted its clients on an ERROR the
    workload's own SQL raised, or every transaction of the window failed): a result to
    diagnose; "failed" when pgbench, the server or pgscope failed and nothing was measured."""
    store, reporter, warmup = ctx.store, ctx.reporter, ctx.spec.warmup
    step_dir = store.run_dir / "steps" / f"{step.step_id:04d}"
    log_files = [f for result in results for f in result.log_files()]
    rated = step.rate is not None
    stats, per_second, outcomes = analyse_logs(log_files, warmup, rated)
    schedule: ScheduleStats | None = None
    if rated and stats is not None:
        schedule = analyse_schedule(
            log_files,
            (stats.window_start_us, stats.window_end_us),
            ctx.spec.latency_limit_ms(),
            tuple(ctx.spec.objectives()),
        )
    store.add_latency_seconds(
        step.step_id,
        [(*_second(s), s.lag_ms, s.skipped) for s in per_second],
    )
    if schedule is not None:
        store.add_step_objectives(
            step.step_id,
            [
                (o.name, o.quantile, o.threshold_ms, o.above, o.scheduled, o.latency_ms)
                for o in schedule.objectives
            ],
        )
    if len(results) > 1:
        for index, (result, clients) in enumerate(zip(results, shares, strict=True)):
            store.add_instance_result(
                step.step_id, index + 1, clients, result.summary.get("tps"), result.error
            )
    archive = step_dir / "xact.parquet"
    if ctx.keep_xact_logs:
        archived = archive_logs(log_files, archive, rated)
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
    workload_error = next((r.workload_error for r in results if r.workload_error), None)
    faults = [r for r in results if r.error and not r.workload_error]
    if faults:
        status = "failed"
    elif workload_error is not None:
        status = "errors"
    elif stats is None and outcomes.failed and not outcomes.succeeded:
        status = "errors"
        error = (
            f"no transaction succeeded in the measured window: {outcomes.failed} failed "
            f"({outcomes.serialization} serialization, {outcomes.deadlock} deadlock, "
            f"{outcomes.other} other)"
        )
    elif stats is None:
        status = "failed"
        error = "pgbench completed no transaction in the measured window"
    else:
        status = "ok"
    pgbench_tps = [r.summary.get("tps") for r in results]
    # Per transaction, over every instance's transactions.
    connection = [
        (ms, r.summary.get("xacts", 0.0))
        for r, clients in zip(results, shares, strict=True)
        if (ms := r.connection_ms_per_xact(clients)) is not None
    ]
    ended = sum(x for _, x in connection)
    values: dict[str, object] = {
        "pgbench_tps": sum(t for t in pgbench_tps if t is not None) if any(pgbench_tps) else None,
        "xact_log": str(archive.relative_to(store.run_dir)) if archived else None,
        "window_start_us": outcomes.window_start_us,
        "window_end_us": outcomes.window_end_us,
        "succeeded": outcomes.succeeded,
        "failed_serialization": outcomes.serialization,
        "failed_deadlock": outcomes.deadlock,
        "failed_other": outcomes.other,
        "retried": outcomes.retried,
        "retries": outcomes.retries,
        "workload_error": workload_error,
        "reconnects": ctx.spec.connect_per_transaction,
        "connection_ms": sum(ms * x for ms, x in connection) / ended if ended else None,
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
    if schedule is not None:
        values.update(
            lag_mean_ms=schedule.lag_mean_ms,
            lag_p99_ms=schedule.lag_p99_ms,
            lag_max_ms=schedule.lag_max_ms,
            service_p50_ms=schedule.service_p50_ms,
            service_p99_ms=schedule.service_p99_ms,
            skipped=schedule.skipped,
            late=schedule.late,
            served=schedule.served,
        )
    store.finish_step(step.step_id, status, None if status == "ok" else error, values)
    quoted = f'"{workload_error}"'
    shown = f"the workload's SQL failed: {quoted}" if workload_error else error
    reporter.step_finished(step, stats, shown if status != "ok" else None, status)
    return status


def _second(s: SecondStats) -> tuple[object, ...]:
    return (s.second_us, s.xacts, s.failed, s.p50_ms, s.p95_ms, s.p99_ms, s.max_ms)
