"""A run's analysis from its store: the one place that reads a run store for analysis.

Each section of the model (`model.py`) is read here once, by the section's own analysis
(waits, pgstats, timeline, usdt, profile); then the facts are computed from the model alone
and the rules judge them. Renderers, `compare` and the facts never open a store.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import duckdb

from pgscope.analyze import (
    account,
    capacity,
    compare,
    heldlocks,
    observation,
    pgstats,
    profile,
    statements,
    timeline,
    usdt,
    waits,
)
from pgscope.analyze.absence import Absence, absent_evidence
from pgscope.analyze.diagnose import (
    diagnose,
    judge_knee,
    judge_window,
    with_capacity,
    without_steps,
)
from pgscope.analyze.facts import extract, read_evidence
from pgscope.analyze.facts.windows import worst_window_sheet
from pgscope.analyze.model import (
    Checkpoints,
    Cpu,
    Environment,
    FactSheet,
    HostCell,
    KneeJudgement,
    Latency,
    Locks,
    ProfileCell,
    RunAnalysis,
    Setting,
    Step,
    StepCheckpoint,
    Target,
    Timeline,
    TracedCell,
    Variants,
    WalDevice,
)
from pgscope.analyze.scaling import ScalingAnalysis, analyse
from pgscope.errors import InputFileError
from pgscope.labels import shown_conninfo
from pgscope.store import RunStore
from pgscope.words import n_clients

MAX_FLAMES = 3  # per kind: beyond that the report gets long and heavy (~300 kB each)


def load_analysis(run_dir: Path, *, bootstrap: int = 500) -> RunAnalysis:
    """A run's analysis and diagnosis; a damaged store is a one-line error."""
    try:
        measured, evidence = _read(run_dir, bootstrap)
    except duckdb.Error as exc:
        reason = " ".join(str(exc).split())[:200]
        raise InputFileError(
            f"{run_dir}: the run store is damaged or from an unknown version: {reason}"
        ) from None
    sheets = extract(measured, evidence)
    absence = absent_evidence(measured)
    diagnosis = diagnose(sheets, absence=absence, accounts=measured.accounts)
    if measured.capacity is not None:
        diagnosis.knees = _knees(measured, sheets, absence)
        diagnosis.verdict = with_capacity(diagnosis.verdict, measured.capacity, diagnosis.knees)
    if measured.session:
        entries = measured.waits.overall.entries[:3] if measured.waits else []
        verdict = without_steps(measured.command, [(e.label, e.share) for e in entries])
        diagnosis = dataclasses.replace(diagnosis, verdict=verdict)
    window = worst_window_sheet(measured)
    if window is not None and measured.observation is not None:
        worst = measured.observation.worst_window
        assert worst is not None
        diagnosis.worst_window = judge_window(window, worst, diagnosis)
    return dataclasses.replace(measured, facts=sheets, diagnosis=diagnosis)


def _knees(measured: RunAnalysis, sheets: list[FactSheet], absence: Absence) -> list[KneeJudgement]:
    """Each variant's knee cell judged by the rules: the lowest rate the server did not keep
    up with, or, where it kept up with all, the highest."""
    assert measured.capacity is not None
    out = []
    for variant in measured.capacity.variants:
        judged = [c for c in variant.cells if c.achieved_tps is not None]
        if not judged:
            continue
        beyond = variant.knee.first_beyond
        cell = next((c for c in judged if c.rate == beyond), judged[-1])
        sheet = next(
            (
                s
                for s in sheets
                if (s.variant, s.clients, s.rate) == (cell.variant, cell.clients, cell.rate)
            ),
            None,
        )
        if sheet is not None:
            out.append(judge_knee(sheet, cell, beyond is not None, measured.accounts, absence))
    return out


def _read(run_dir: Path, bootstrap: int) -> tuple[RunAnalysis, dict[str, Any]]:
    """The run's sections, and what each family of facts reads of its own."""
    store = RunStore.open(run_dir)
    try:
        return _sections(store, run_dir, bootstrap), read_evidence(store)
    finally:
        store.close()


def _sections(store: RunStore, run_dir: Path, bootstrap: int) -> RunAnalysis:
    db = store.db
    run = store.run_row()
    rows = store.steps()
    killed = run["status"] == "running"
    for row in rows:
        if row["variant"] == observation.VARIANT and row["status"] == "running":
            # Never closed: the observation ended before its figures were filled in.
            row["status"] = observation.CUT
            row["error"] = row["error"] or "not closed: the observation ended first"
    if killed:
        # The writer is gone (it holds a lock while alive): killed without cleanup.
        run["status"] = "interrupted"
        closed = [r for r in rows if r["variant"] == observation.VARIANT]
        closed = [r for r in closed if r["status"] != observation.CUT]
        run["status_reason"] = run["status_reason"] or (
            f"the observation ended without finishing (killed?); the {len(closed)} windows "
            f"closed before are kept"
            if run["recipe"] == "observe"
            else "the run ended without finishing"
        )
    spec: dict[str, Any] = json.loads(run["spec_json"] or "{}")
    declared = list(spec.get("variants") or {})
    growth = _latency_growth(db)
    objectives = capacity.objective_results(
        store.query("SELECT * FROM step_objectives ORDER BY step_id, objective")
    )
    scaling = analyse(rows, bootstrap=bootstrap, variant_order=declared)
    # Before the fits lose their draws: the knee's predicted band is drawn from them.
    open_loop = capacity.analyse(rows, objectives, growth, scaling, list(spec.get("slo") or []))
    scaling = _without_draws(scaling)
    steps = [_step(r, objectives.get(r["step_id"], []), growth.get(r["step_id"])) for r in rows]
    programs = _traced_programs(db)
    environment = _environment(store, run, spec)
    observed = observation.read(db, environment.collectors)
    section = statements.read(db)
    counters = pgstats.per_step(db)
    return RunAnalysis(
        run_id=str(run["run_id"]),
        run_dir=str(run_dir.resolve()),
        status=str(run["status"]),
        status_reason=run["status_reason"],
        recipe=run["recipe"],
        command_line=run["command_line"],
        pgscope_version=run["pgscope_version"],
        target=Target(
            run["target_kind"], shown_conninfo(run["target_conninfo"]), run["server_version"]
        ),
        started_us=run["started_us"],
        ended_us=run["ended_us"],
        environment=environment,
        steps=steps,
        scalability=scaling,
        waits=waits.analyse(db),
        counters=counters,
        timeline=Timeline(_marked(timeline.series(db), observed), timeline.dips(db)),
        locks=_locks(db, steps, programs),
        checkpoints=_checkpoints(db, steps, programs),
        cpu=_cpu(store, scaling, open_loop),
        variants=_variants([r for r in rows if r["rate"] is None], spec, declared),
        statements=section,
        held_locks=heldlocks.read(db),
        observation=observed,
        accounts=_accounts(db, steps, section, run["target_kind"], observed),
        # pgscope's load on a server it did not start: an observation's is the server's own.
        xids=pgstats.xid_use(counters)
        if run["target_kind"] == "server" and observed is None
        else None,
        capacity=open_loop,
    )


def _accounts(
    db: duckdb.DuckDBPyConnection,
    steps: list[Step],
    section: statements.Statements,
    target_kind: str | None,
    observed: observation.Observation | None,
) -> list[account.Account]:
    """Where active time went: per cell of a run; per window and over the whole of an
    observation. None without wait samples."""
    if not waits.has_samples(db):
        return []
    texts = {int(q): t for q, t in section.texts.items()}
    for q, t in db.execute("SELECT query_id, query FROM activity_queries ORDER BY 1, 2").fetchall():
        texts.setdefault(int(q), str(t))
    closed = account.closed_branches(db, section, target_kind)
    measured = [s for s in steps if s.status in ("ok", "errors", "mixed") and _window(s)]
    if not steps:  # `sample`, `trace`, `profile`: the whole session
        return [account.build(db, None, section, texts, "whole", None, None, None, closed)]
    if observed is not None:
        read = account.Steps.read(db, [s.step_id for s in measured])
        windows = [
            account.build(db, [s.step_id], section, texts, "window", s.variant, s.clients,
                          s.step_id, closed, None, read)
            for s in measured
        ]  # fmt: skip
        whole = [s.step_id for s in measured]
        if not whole:
            return windows
        return [
            account.build(db, whole, section, texts, "whole", None, None, None, closed, None, read),
            *windows,
        ]
    by_cell: dict[tuple[str, int, float | None], list[int]] = defaultdict(list)
    for s in measured:
        by_cell[(s.variant, s.clients, s.rate)].append(s.step_id)
    return [
        account.build(db, ids, section, texts, "cell", variant, clients, None, closed, rate)
        for (variant, clients, rate), ids in by_cell.items()
    ]


def _marked(series: timeline.Series, observed: observation.Observation | None) -> timeline.Series:
    """An observation's outlying windows, marked on the timeline where they begin."""
    if observed is None or not observed.outliers:
        return series
    marks = [
        ((w.start_us - series.t0_us) / 1e6, "outlier", f"outlier: window {w.step_id} — {w.outlier}")
        for w in observed.windows
        if w.outlier and w.start_us is not None
    ]
    return dataclasses.replace(series, markers=sorted([*series.markers, *marks]))


def _without_draws(scaling: ScalingAnalysis) -> ScalingAnalysis:
    # The bands are drawn (scaling.curves); the draws behind them would only weigh the JSON.
    scaling.fits = {v: dataclasses.replace(f, draws=None) for v, f in scaling.fits.items()}
    return scaling


def _latency_growth(db: duckdb.DuckDBPyConnection) -> dict[int, float]:
    """Each step's median latency's rise per second of its measured window (ms/s): the
    least-squares slope of its whole seconds' medians, where it has three or more. About 0
    for a server keeping up; an open-loop backlog makes it the lag added each second."""
    rows = db.execute(
        "SELECT l.step_id, regr_slope(l.p50_ms, l.second_us / 1e6), count(*) "
        "FROM latency_seconds l JOIN steps s USING (step_id) "
        "WHERE l.p50_ms IS NOT NULL AND l.second_us >= s.window_start_us "
        "AND l.second_us + 1000000 <= s.window_end_us GROUP BY l.step_id"
    ).fetchall()
    return {int(i): float(slope) for i, slope, n in rows if slope is not None and n >= 3}


def _step(
    row: dict[str, Any], objectives: list[capacity.ObjectiveResult], growth: float | None
) -> Step:
    return Step(
        step_id=row["step_id"],
        variant=row["variant"],
        clients=row["clients"],
        repeat=row["repeat"],
        status=row["status"],
        error=row["error"],
        tps=row["tps"],
        xacts=row["xacts"],
        failed_xacts=row["failed"],
        latency_ms=Latency(
            row["latency_mean_ms"],
            row["p50_ms"],
            row["p90_ms"],
            row["p95_ms"],
            row["p99_ms"],
            row["p999_ms"],
            row["max_ms"],
        ),
        started_us=row["started_us"],
        ended_us=row["ended_us"],
        window_start_us=row["window_start_us"],
        window_end_us=row["window_end_us"],
        succeeded_xacts=row["succeeded"],
        failed_serialization=row["failed_serialization"],
        failed_deadlock=row["failed_deadlock"],
        failed_other=row["failed_other"],
        retried_xacts=row["retried"],
        retries=row["retries"],
        workload_error=row["workload_error"],
        reconnects=row["reconnects"],
        connection_ms=row["connection_ms"],
        rate=row["rate"],
        schedule=capacity.schedule_of(row, objectives),
        latency_growth_ms_per_s=growth,
    )


def _environment(store: RunStore, run: dict[str, Any], spec: dict[str, Any]) -> Environment:
    settings: dict[str, list[Setting]] = {}
    for row in store.query(
        "SELECT variant, name, setting, unit, source FROM settings ORDER BY variant, name"
    ):
        settings.setdefault(row["variant"], []).append(
            Setting(row["name"], row["setting"], row["unit"], row["source"])
        )
    collectors = store.query("SELECT * FROM collectors ORDER BY name")
    gaps = store.query("SELECT * FROM collector_gaps ORDER BY start_us")
    host = dict(json.loads(run["host_json"] or "{}"))
    return Environment(host, settings, spec, collectors, gaps, _wal_device(store))


def _wal_device(store: RunStore) -> WalDevice | None:
    rows = store.query(
        "SELECT folder, device, write_bytes_per_s, flush_seconds FROM wal_device ORDER BY ts_us"
    )
    return WalDevice(**rows[-1]) if rows else None


def _variants(rows: list[dict[str, Any]], spec: dict[str, Any], declared: list[str]) -> Variants:
    baseline = spec.get("baseline") or next(iter(declared), None)
    comparisons = compare.compare_variants(rows, baseline)
    return Variants(comparisons[0].baseline if comparisons else baseline, comparisons)


def _window(step: Step) -> tuple[int, int] | None:
    start = step.window_start_us or step.started_us
    end = step.window_end_us or step.ended_us
    return (start, end) if start is not None and end is not None and end > start else None


def _traced_programs(db: duckdb.DuckDBPyConnection) -> set[str]:
    """The usdt programs that traced during the run (none without the usdt collector)."""
    if not usdt.has_usdt(db):
        return set()
    return {r[0] for r in db.execute("SELECT DISTINCT program FROM usdt_seconds").fetchall()}


def _locks(db: duckdb.DuckDBPyConnection, steps: list[Step], programs: set[str]) -> Locks:
    if not usdt.has_usdt(db):
        return Locks(False, [], [], [])
    by_cell: dict[tuple[str, int, float | None], list[Step]] = defaultdict(list)
    for step in steps:
        if step.ok and _window(step):
            by_cell[(step.variant, step.clients, step.rate)].append(step)
    cells = []
    for (variant, clients, rate), members in by_cell.items():
        seconds, xacts = 0.0, 0.0
        lwlocks: list[list[usdt.LatencySummary]] = []
        lock_waits: list[list[usdt.LatencySummary]] = []
        for step in members:
            start, end = _window(step) or (0, 0)
            covered = usdt.covered_seconds(db, "lwlock", start, end) or usdt.covered_seconds(
                db, "locks", start, end
            )
            seconds += covered
            xacts += (step.tps or 0.0) * covered
            lwlocks.append(usdt.latency(db, "lwlock_wait", start, end))
            lock_waits.append(usdt.latency(db, "lock_wait", start, end))
        cells.append(
            TracedCell(
                variant,
                clients,
                seconds,
                round(xacts),
                _pooled(lwlocks),
                _pooled(lock_waits),
                rate,
            )
        )
    cells.sort(key=lambda c: (c.variant, c.rate is not None, c.rate or 0.0, c.clients))
    return Locks(
        bool(programs & {"lwlock", "locks"}),
        usdt.latency(db, "lwlock_wait"),
        usdt.latency(db, "lock_wait"),
        cells,
    )


def _pooled(groups: list[list[usdt.LatencySummary]]) -> list[usdt.LatencySummary]:
    """Summaries of several windows added up per (event, object, mode)."""
    totals: dict[tuple[str, str | None, str | None], list[int]] = {}
    buckets: dict[tuple[str, str | None, str | None], dict[tuple[int, int], int]] = {}
    for group in groups:
        for s in group:
            key = (s.event, s.object, s.mode)
            count_total = totals.setdefault(key, [0, 0])
            count_total[0] += s.count
            count_total[1] += s.total_ns
            hist = buckets.setdefault(key, {})
            for b in s.buckets:
                hist[(b.lo_ns, b.hi_ns)] = hist.get((b.lo_ns, b.hi_ns), 0) + b.count
    pooled = [
        usdt.LatencySummary(
            key[0],
            key[1],
            key[2],
            count,
            total,
            tuple(usdt.Bucket(lo, hi, n) for (lo, hi), n in sorted(buckets[key].items())),
        )
        for key, (count, total) in totals.items()
    ]
    return sorted(pooled, key=lambda s: (-s.total_ns, s.event, s.object or "", s.mode or ""))


def _checkpoints(
    db: duckdb.DuckDBPyConnection, steps: list[Step], programs: set[str]
) -> Checkpoints:
    if not usdt.has_usdt(db):
        return Checkpoints(False, [])
    own = _own_checkpoints(db, steps)
    items = []
    for ckpt in usdt.checkpoints(db):
        before = next(
            (step_id for issued, until, step_id in own if issued <= ckpt.start_us <= until), None
        )
        step = next(
            (
                s
                for s in steps
                if s.started_us is not None
                and s.ended_us is not None
                and s.started_us <= ckpt.start_us < s.ended_us
            ),
            None,
        )
        items.append(
            StepCheckpoint(
                step.step_id if step else None,
                step.variant if step else None,
                step.clients if step else None,
                ckpt,
                before,
            )
        )
    return Checkpoints("checkpoint" in programs, items)


def _own_checkpoints(
    db: duckdb.DuckDBPyConnection, steps: list[Step]
) -> list[tuple[int, int, int]]:
    """(issued, until, step) of each CHECKPOINT pgscope ran before a step: a checkpoint that
    starts from its issue to that step's start (a minute, if the step never started) is it."""
    started = {s.step_id: s.started_us for s in steps}
    return [
        (int(issued), int(started.get(step_id) or issued + 60_000_000), int(step_id))
        for issued, step_id in db.execute(
            "SELECT ts_us, step_id FROM events WHERE kind = 'pgscope-checkpoint' ORDER BY ts_us"
        ).fetchall()
    ]


def _cpu(
    store: RunStore, scaling: ScalingAnalysis, open_loop: capacity.CapacityAnalysis | None
) -> Cpu:
    walsender = waits.backend_cpu_aas(store.db, "walsender")
    host: list[HostCell] = []
    for row in store.query(
        "SELECT s.variant, s.clients, s.rate, avg(h.busy) AS busy, "
        "avg(h.iowait_share) AS iowait, "
        "avg(h.steal_share) AS steal, avg(h.server_share) AS server, "
        "avg(h.client_share) AS client, avg(h.own_share) AS own, "
        "avg(h.other_share) AS other, max(h.cpus) AS cpus "
        "FROM host_cpu h "
        "JOIN steps s ON h.ts_us >= s.window_start_us AND h.ts_us < s.window_end_us "
        "GROUP BY ALL ORDER BY ALL"
    ):
        if row["busy"] is None:
            continue
        host.append(
            HostCell(
                row["variant"],
                row["clients"],
                row["busy"],
                row["iowait"],
                row["steal"],
                row["server"],
                row["client"],
                row["cpus"],
                walsender.get((row["variant"], row["clients"], row["rate"])),
                row["own"],
                row["other"],
                row["rate"],
            )
        )
    if not store.has_table("profile_stacks"):
        return Cpu(host, [], None, [])
    cells = []
    rated = [c.as_cell() for v in (open_loop.variants if open_loop else []) for c in v.cells]
    for cell in [*scaling.cells, *rated]:
        steps = profile.steps_of(store, cell.variant, cell.clients, cell.rate)
        cpu = profile.load_profile(store, "cpu", steps) if steps else None
        if cpu is not None and cpu.total:
            cells.append(
                ProfileCell(
                    cell.variant,
                    cell.clients,
                    profile.function_table(cpu),
                    profile.hot_spot(cpu, profile.SPIN_FUNCTIONS),
                    profile.hot_spot(cpu, profile.SNAPSHOT_FUNCTIONS),
                    cell.rate,
                )
            )
    whole = profile.load_profile(store, "cpu", None)
    return Cpu(
        host,
        cells,
        profile.function_table(whole) if whole.total else None,
        _flames(store, scaling),
    )


def _flames(store: RunStore, scaling: ScalingAnalysis) -> list[profile.FlameGraph]:
    """Per kind: each variant's flame graph (the first few), and what changed from the first
    to the last variant, or, with one variant, from its lowest to its highest client count."""
    graphs: list[profile.FlameGraph] = []
    variants = scaling.variants()
    clients = sorted({c.clients for c in scaling.cells})
    for kind, what in (("cpu", "On-CPU"), ("offcpu", "Off-CPU (where processes sleep)")):
        loaded = []
        for variant in variants[:MAX_FLAMES]:
            prof = profile.load_profile(
                store, kind, profile.steps_of(store, variant), label=variant
            )
            if prof.total:
                loaded.append(prof)
                graphs.append(profile.flame_graph(prof, f"{what} profile, variant {variant}"))
        pair = None
        if len(loaded) >= 2:
            pair = loaded[0], loaded[-1]
        elif len(loaded) == 1 and len(clients) >= 2:
            low, high = (
                profile.load_profile(
                    store, kind, profile.steps_of(store, variants[0], n), label=n_clients(n)
                )
                for n in (clients[0], clients[-1])
            )
            if low.total and high.total:
                pair = low, high
        if pair is not None:
            a, b = pair
            graphs.append(profile.diff_flame_graph(a, b, f"{what}: {a.label} → {b.label}"))
    return graphs


# ---------------------------------------------------------------------------------------------
# Standalone sessions (`pgscope trace`, `pgscope profile`): what one program or profiler saw


def _collectors(store: RunStore) -> list[dict[str, Any]]:
    return store.query(
        "SELECT name, available, reason, status, error FROM collectors ORDER BY name"
    )


def load_trace(run_dir: Path, program: str) -> tuple[usdt.TraceSummary, list[dict[str, Any]]]:
    """What the usdt program `program` recorded over a whole session, and the collectors."""
    store = RunStore.open(run_dir)
    try:
        return usdt.trace_summary(store.db, program), _collectors(store)
    finally:
        store.close()


def load_profiles(
    run_dir: Path, kinds: list[str]
) -> tuple[dict[str, profile.Profile], list[dict[str, Any]]]:
    """A session's whole profile of each kind ("cpu", "offcpu"), and the collectors."""
    store = RunStore.open(run_dir)
    try:
        return (
            {kind: profile.load_profile(store, kind, label=kind) for kind in kinds},
            _collectors(store),
        )
    finally:
        store.close()
