"""Facts: the run's evidence as named numbers, each with its unit and where it came from.

The diagnosis (`diagnose.py`) reads nothing else: its rules name facts. Facts are computed
per cell (a variant at one client count) as pure functions of the run's analysis
(`model.RunAnalysis`), never from the store; each variant's highest client count is its
`peak` cell, where the rules look unless they say otherwise. A last sheet holds facts about the
variants against each other. A fact that a missing collector would have given is simply
absent; rules that need it say so instead of guessing.

Shares are fractions of 1 (of active time, of samples, of CPU).
"""

from __future__ import annotations

import statistics
from typing import Any

from pgscope.analyze.connfacts import connection_facts
from pgscope.analyze.lockfacts import lock_facts
from pgscope.analyze.model import Fact, FactSheet, RunAnalysis
from pgscope.analyze.observation import VARIANT as VARIANT_OBSERVED
from pgscope.analyze.pgstats import StepStats
from pgscope.analyze.scaling import Cell
from pgscope.analyze.spinfacts import hot_spot_facts
from pgscope.analyze.usdt import LatencySummary
from pgscope.analyze.waits import Profile
from pgscope.analyze.workfacts import work_facts
from pgscope.words import n_clients

__all__ = ["Fact", "FactSheet", "extract"]

# Groups of wait events the rules speak of. The keys are fact names (`wait.<group>`).
WAIT_GROUPS: dict[str, tuple[str, ...]] = {
    "row_lock": ("Lock:transactionid", "Lock:tuple"),
    "object_lock": (
        "Lock:relation",
        "Lock:advisory",
        "Lock:extend",
        "Lock:object",
        "Lock:page",
        "Lock:userlock",
        "Lock:frozenid",
        "Lock:virtualxid",
    ),
    "advisory_lock": ("Lock:advisory",),
    "commit_flush": (
        "IO:WALSync",
        "IO:WALWrite",
        "LWLock:WALWrite",
        "IO:WALInitSync",
        "IO:WALInitWrite",
    ),
    # Writing WAL out, whether a commit waits for it or a backend for room in the WAL
    # buffers (full of WAL not yet written: WALBufMapping).
    "wal_io": (
        "IO:WALWrite",
        "IO:WALSync",
        "LWLock:WALWrite",
        "LWLock:WALBufMapping",
        "IO:WALInitWrite",
        "IO:WALInitSync",
    ),
    "syncrep": ("IPC:SyncRep",),
    "datafile_read": ("IO:DataFileRead", "IO:DataFilePrefetch"),
    "client_read": ("Client:ClientRead",),
    "client_write": ("Client:ClientWrite",),
}
# Functions on the statement-logging path (its user-space part, and this kernel's pipe write).
LOGGING_FUNCTIONS = frozenset(
    {
        "errfinish",
        "EmitErrorReport",
        "send_message_to_server_log",
        "write_pipe_chunks",
        "write_syslogger_file",
        "pipe_write_[k]",
        "anon_pipe_write_[k]",
    }
)
# PostgreSQL's default block size: a full-page image is at most one block of WAL.
BLOCK_BYTES = 8192
LOGGING_SETTINGS = (
    "log_statement",
    "log_duration",
    "log_min_duration_statement",
    "log_min_duration_sample",
    "log_statement_sample_rate",
)


def extract(analysis: RunAnalysis) -> list[FactSheet]:
    """One sheet per cell (variants in order, client counts ascending), then one for the run
    (variant comparisons)."""
    sheets: list[FactSheet] = []
    for variant in analysis.scalability.variants():
        own = [c for c in analysis.scalability.cells if c.variant == variant]
        measured = [c for c in own if c.tps_mean]
        # A cell whose every step errored (the workload's SQL raised an error) has no tps, but
        # what failed is its finding: it gets a sheet, with the failure facts.
        cells = [c for c in own if c.tps_mean or c.errored_steps]
        peak = max((c.clients for c in cells), default=None)
        sheets += [_cell_sheet(analysis, variant, measured, c, c.clients == peak) for c in cells]
    _loss_facts(sheets)
    sheets.append(_run_sheet(analysis))
    return sheets


def _variant_settings(analysis: RunAnalysis, variant: str) -> dict[str, Any]:
    spec = analysis.environment.spec
    return {**(spec.get("settings") or {}), **(spec.get("variants") or {}).get(variant, {})}


def _cell_sheet(
    analysis: RunAnalysis, variant: str, cells: list[Cell], cell: Cell, peak: bool
) -> FactSheet:
    n = cell.clients
    sheet = FactSheet(variant, n, peak=peak)
    sheet.add("tps", cell.tps_mean, "tps", "pgbench", f"mean tps at {n_clients(n)}")
    sheet.add("p95_ms", cell.p95_ms, "ms", "pgbench", f"p95 latency at {n_clients(n)}")
    sheet.add(
        "clients",
        n,
        "clients",
        "spec",
        "the highest client count measured" if peak else "the client count of this cell",
    )
    protocol = analysis.environment.spec.get("protocol")
    if protocol is not None:  # pgbench drove the load: advice reads how
        prepared = 1.0 if protocol == "prepared" else 0.0
        sheet.add("pgbench.prepared", prepared, "yes/no", "spec", "pgbench ran with -M prepared")
    if cell.tps_mean:
        _scaling_facts(sheet, analysis, variant, [c for c in cells if c.clients <= n])
    _failure_facts(sheet, analysis, variant, n)
    profile = _wait_facts(sheet, analysis, variant, n)
    pinned = _variant_settings(analysis, variant).get("pgscope.cpus")
    _host_facts(sheet, analysis, variant, n, int(pinned) if pinned is not None else None)
    _counter_facts(sheet, analysis, variant, n)
    _dip_facts(sheet, analysis, variant)
    _checkpoint_facts(sheet, analysis, variant)
    _profile_facts(sheet, analysis, variant, n)
    hot_spot_facts(sheet, analysis, variant, n)
    _traced_lock_facts(sheet, analysis, variant, n, profile)
    work_facts(sheet, analysis, variant, n)
    connection_facts(sheet, analysis, variant, n)
    lock_facts(sheet, analysis, variant, n)
    return sheet


def _scaling_facts(
    sheet: FactSheet, analysis: RunAnalysis, variant: str, cells: list[Cell]
) -> None:
    """How this cell compares with the variant's cells up to it, and the variant's fit."""
    if len(cells) >= 2:
        low, high = cells[0], cells[-1]
        assert low.tps_mean is not None and high.tps_mean is not None
        per_client_low = low.tps_mean / low.clients
        sheet.add(
            "scaling.efficiency",
            high.tps_mean / (per_client_low * high.clients),
            "share",
            "pgbench",
            f"tps at {n_clients(high.clients)} as a share of {high.clients}× "
            f"the per-client tps at {low.clients}",
        )
        best = max(cells, key=lambda c: c.tps_mean or 0.0)
        sheet.add(
            "scaling.best_clients",
            best.clients,
            "clients",
            "pgbench",
            "the client count with the highest mean tps",
        )
        sheet.add(
            "scaling.drop_after_best",
            1 - high.tps_mean / (best.tps_mean or high.tps_mean),
            "share",
            "pgbench",
            f"how far tps at {n_clients(high.clients)} is below the best",
        )
    fit = analysis.scalability.fits.get(variant)
    if fit is not None:
        # A coefficient like κ, not a share: the fit lets it pass 1 (throughput falling from
        # the first client), where "131% serialised" would mean nothing.
        sheet.add("usl.sigma", fit.sigma, "coefficient", "usl", "USL contention σ")
        sheet.add("usl.kappa", fit.kappa, "coefficient", "usl", "USL coherency κ")
        if fit.n_star is not None:
            sheet.add("usl.n_star", fit.n_star, "clients", "usl", "USL peak N*")


def _failure_facts(sheet: FactSheet, analysis: RunAnalysis, variant: str, n: int) -> None:
    """How the cell's transactions ended (pgbench's transaction log, after each one's last
    try): the shares that failed, by kind, and that needed retries, over the cell's steps;
    attempted against effective (succeeded) throughput; and the steps whose clients pgbench
    aborted on an error of the workload's own SQL, with the server's message. The largest
    cause is `xact.cause.<kind>` (serialization, deadlock, other, workload_error), named in
    its label: a finding's title quotes it."""
    steps = [s for s in analysis.steps if s.variant == variant and s.clients == n]
    measured = [s for s in steps if s.status in ("ok", "errors")]
    counted = [(s, a) for s in measured if (a := s.attempted_xacts) is not None]
    source = "pgbench log"
    attempted = sum(a for _, a in counted)
    causes: list[tuple[float, str, str]] = []  # (share, kind, in words)
    if attempted:

        def share(values: list[int | None]) -> float:
            return sum(v or 0 for v in values) / attempted

        succeeded = sum(s.succeeded_xacts or 0 for s, _ in counted)
        kinds = {
            "serialization": share([s.failed_serialization for s, _ in counted]),
            "deadlock": share([s.failed_deadlock for s, _ in counted]),
            "other": share([s.failed_other for s, _ in counted]),
        }
        of = f"share of those attempted at {n_clients(n)}"
        sheet.add(
            "xact.failed_share",
            1 - succeeded / attempted,
            "share",
            source,
            f"transactions that failed (after their last try), {of}",
        )
        sheet.add(
            "xact.serialization_share",
            kinds["serialization"],
            "share",
            source,
            f"transactions that failed on a serialization error (SQLSTATE 40001), {of}",
        )
        sheet.add(
            "xact.deadlock_share",
            kinds["deadlock"],
            "share",
            source,
            f"transactions that failed on a deadlock (SQLSTATE 40P01), {of}",
        )
        sheet.add(
            "xact.retried_share",
            share([s.retried_xacts for s, _ in counted]),
            "share",
            source,
            f"transactions that needed more than one try (pgbench --max-tries), {of}",
        )
        causes += [
            (kinds["serialization"], "serialization", "serialization failures"),
            (kinds["deadlock"], "deadlock", "deadlocks"),
            (kinds["other"], "other", "other errors"),
        ]
        rates = [
            (a / seconds, (s.succeeded_xacts or 0) / seconds)
            for s, a in counted
            if s.window_start_us is not None
            and s.window_end_us is not None
            and (seconds := (s.window_end_us - s.window_start_us) / 1e6) > 0
        ]
        if rates:
            sheet.add(
                "xact.attempted_tps",
                statistics.fmean(r[0] for r in rates),
                "tps",
                source,
                f"transactions attempted per second (succeeded or failed) at {n_clients(n)}",
            )
            sheet.add(
                "xact.effective_tps",
                statistics.fmean(r[1] for r in rates),
                "tps",
                source,
                f"transactions that succeeded per second at {n_clients(n)}",
            )
    errored = [s for s in steps if s.workload_error]
    if errored:
        quoted = '"' + " ".join((errored[0].workload_error or "").split()) + '"'
        every = len(errored) == len(steps) and not any(s.succeeded_xacts for s in steps)
        sheet.add(
            "xact.workload_error",
            len(errored) / len(steps),
            "share",
            source,
            f"every transaction fails: {quoted}"
            if every
            else f"share of the steps at {n_clients(n)} that pgbench ended on an error of the "
            f"workload's SQL: {quoted}",
        )
        causes.append((len(errored) / len(steps), "workload_error", quoted))
    value, kind, name = max(causes, default=(0.0, "", ""))
    if value > 0:
        sheet.add(f"xact.cause.{kind}", value, "share", source, name)


def _wait_facts(sheet: FactSheet, analysis: RunAnalysis, variant: str, n: int) -> Profile | None:
    """The sampled wait profile's facts at this cell; returns the profile (None: not sampled)."""
    waits = analysis.waits
    if waits is None:
        return None
    by_clients = {p.clients: p.profile for p in waits.by_clients if p.variant == variant}
    profile = by_clients.get(n)
    if profile is None or not profile.samples:
        return None  # not sampled (no activity collector); sampled but never active still counts
    lowest = min(by_clients)
    profile_facts(
        sheet,
        profile,
        n,
        f"at {n_clients(n)}",
        (lowest, by_clients[lowest]) if lowest < n else None,
    )
    return profile


def profile_facts(
    sheet: FactSheet,
    profile: Profile,
    n: int,
    where: str,
    low: tuple[int, Profile] | None = None,
) -> None:
    """The facts of one wait profile of `n` sessions (`where`: "at 8 clients", "in window 7"),
    with each class's growth from the `low` (clients, profile) where there is one."""
    source = "activity"
    for entry in profile.entries:
        sheet.add(
            f"wait.share.{entry.label}",
            entry.share,
            "share",
            source,
            f"{entry.label} share of active time {where}",
        )
    for cls, share in profile.class_shares().items():
        sheet.add(
            f"wait.class.{cls}",
            share,
            "share",
            source,
            f"{cls} waits' share of active time {where}",
        )
    for group, events in WAIT_GROUPS.items():
        total = sum(e.share for e in profile.entries if e.label in events)
        sheet.add(
            f"wait.{group}",
            total,
            "share",
            source,
            f"{' + '.join(events[:3])}{' …' if len(events) > 3 else ''} share of "
            f"active time {where}",
        )
    lwlocks = [e for e in profile.entries if e.wait_event_type == "LWLock"]
    if lwlocks:
        top = max(lwlocks, key=lambda e: e.share)
        sheet.add(
            "wait.lwlock_top",
            top.share,
            "share",
            source,
            f"LWLock:{top.wait_event}, the most waited-for LWLock tranche, {where}",
        )
        sheet.add(
            f"wait.lwlock_top.{top.wait_event}",
            top.share,
            "share",
            source,
            f"LWLock:{top.wait_event} share of active time {where}",
        )
    sheet.add("wait.aas", profile.aas, "count", source, f"average active sessions {where}")
    sheet.add(
        "wait.aas_per_client",
        profile.aas / n,
        "share",
        source,
        f"average active sessions per client {where}",
    )
    states = profile.states
    sheet.add(
        "sessions.idle",
        states.get("idle", 0.0) + states.get("idle in transaction", 0.0),
        "share",
        source,
        f"share of client sessions' samples idle (in or out of a transaction) {where}",
    )
    sheet.add(
        "sessions.idle_in_transaction",
        states.get("idle in transaction", 0.0),
        "share",
        source,
        f"share of client sessions' samples idle inside a transaction {where}",
    )
    if low is not None:
        lowest, low_profile = low
        low_classes = low_profile.class_shares()
        for cls, share in profile.class_shares().items():
            sheet.add(
                f"wait.growth.{cls}",
                share - low_classes.get(cls, 0.0),
                "share",
                source,
                f"growth of {cls}'s share of active time from {lowest} to {n_clients(n)}",
            )


def live_sheet(profile: Profile, sessions: float) -> FactSheet:
    """The last seconds of a live view as a sheet: their wait profile's facts alone."""
    n = max(1, round(sessions))
    sheet = FactSheet(VARIANT_OBSERVED, n)
    sheet.add("clients", n, "clients", "activity", "client sessions present, last seconds")
    profile_facts(sheet, profile, n, "in the last seconds")
    _lwlock_top(sheet, n, traced=False)
    return sheet


def worst_window_sheet(analysis: RunAnalysis) -> FactSheet | None:
    """An observation's worst window as a sheet of its own: its commits/s, sessions and wait
    profile, which the rules judge as they judge the whole observation (None: not an
    observation, or no window with sampled activity)."""
    observed = analysis.observation
    if observed is None or observed.worst_profile is None or not observed.worst_profile.samples:
        return None
    window = next(w for w in observed.windows if w.step_id == observed.worst_window)
    n = max(1, round(window.concurrency or 1))
    where = f"in window {window.step_id}"
    sheet = FactSheet(VARIANT_OBSERVED, n)
    sheet.add("tps", window.tps, "tps", "pgstats", f"commits/s {where}")
    sheet.add("clients", n, "clients", "activity", f"client sessions present {where}")
    profile_facts(sheet, observed.worst_profile, n, where)
    _lwlock_top(sheet, n, traced=False)
    return sheet


def _host_facts(
    sheet: FactSheet, analysis: RunAnalysis, variant: str, n: int, pinned: int | None
) -> None:
    row = next((h for h in analysis.cpu.host if h.variant == variant and h.clients == n), None)
    if row is None:
        return
    if row.walsender_aas is not None:
        sheet.add(
            "wait.walsender_cpu",
            row.walsender_aas,
            "count",
            "activity",
            f"walsenders on CPU, on average, at {n_clients(n)}",
        )
    for name, value, label in (
        ("host.cpu_busy", row.busy, "CPU busy"),
        ("host.iowait", row.iowait, "CPU idle waiting for I/O"),
        ("host.steal", row.steal, "CPU taken by the hypervisor"),
        ("host.server_cpu", row.server, "CPU used by the cluster"),
        ("host.client_cpu", row.client, "CPU used by pgbench"),
    ):
        sheet.add(
            name, value, "share", "host", f"{label}, share of the host's CPU time at {n_clients(n)}"
        )
    if row.other is not None:
        sheet.add(
            "host.other_cpu",
            row.other,
            "share",
            "host",
            f"CPU used by processes other than the servers', pgbench's and pgscope's (kernel "
            f"threads aside), share of the host's CPU time at {n_clients(n)}",
        )
    # "CPU-bound" is about the CPUs the server may run on: pinned to 1 of 2, it saturates its
    # one core while the host looks half idle. Pinned to fewer CPUs than the host has,
    # pgbench runs on the others, so the server's own use is what keeps its CPUs busy;
    # pinned to all of them, pgbench shares them and the host's busy share is the answer.
    # Time the hypervisor steals counts as busy, as in the host's share: the server wanted
    # the CPU and did not get it (the host's steal share, taken as even across CPUs).
    if pinned and row.server is not None and row.cpus and pinned < row.cpus:
        sheet.add(
            "host.server_cpus_busy",
            min(1.0, row.server * row.cpus / pinned + (row.steal or 0.0)),
            "share",
            "host",
            f"CPU busy on the {pinned} CPU{'s' if pinned > 1 else ''} the server is pinned to "
            f"(its own use plus the hypervisor's steal), at {n_clients(n)}",
        )
    else:
        sheet.add(
            "host.server_cpus_busy",
            row.busy,
            "share",
            "host",
            f"CPU busy on the CPUs the server may use (all of the host's), at {n_clients(n)}",
        )


def _loss_facts(sheets: list[FactSheet]) -> None:
    """How far each variant is below the fastest one at the same client count: in a
    comparison, a finding on a slower variant explains a loss; one on the fastest, a ceiling."""
    by_clients: dict[int | None, list[FactSheet]] = {}
    for sheet in sheets:
        if sheet.value("tps") is not None:
            by_clients.setdefault(sheet.clients, []).append(sheet)
    for group in by_clients.values():
        if len(group) < 2:
            continue
        fastest = max(group, key=lambda s: s.value("tps") or 0.0)
        best = fastest.value("tps") or 0.0
        for sheet in group:
            if best > 0:
                sheet.add(
                    "variants.loss_vs_fastest",
                    1 - (sheet.value("tps") or 0.0) / best,
                    "share",
                    "pgbench (variants)",
                    f"tps below the fastest variant ({fastest.variant}) "
                    f"at {n_clients(sheet.clients)}",
                )


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _counter_facts(sheet: FactSheet, analysis: RunAnalysis, variant: str, n: int) -> None:
    steps = [c for c in analysis.counters if c.variant == variant and c.clients == n]
    if not steps:
        return
    for name, values, unit, label in (
        (
            "wal.bytes_per_xact",
            [s.wal_bytes_per_xact for s in steps],
            "bytes",
            "WAL bytes per transaction",
        ),
        (
            "wal.fpi_per_xact",
            [s.fpi_per_xact for s in steps],
            "count",
            "full-page images per transaction",
        ),
        (
            "log.bytes_per_s",
            [s.log_bytes_per_s for s in steps],
            "bytes/s",
            "server log written per second",
        ),
        (
            "rows_per_commit",
            [s.rows_per_commit for s in steps],
            "count",
            "rows inserted per commit",
        ),
        (
            "wal.syncs_per_xact",
            [s.wal_syncs_per_xact for s in steps],
            "count",
            "WAL fsyncs per transaction (1: each commit flushes on its own)",
        ),
    ):
        sheet.add(name, _mean(values), unit, "pgstats", label)
    _wal_rate_facts(sheet, analysis, steps, n)


def _wal_rate_facts(
    sheet: FactSheet, analysis: RunAnalysis, steps: list[StepStats], n: int
) -> None:
    """WAL written per second against what the WAL's device takes (probed before the load):
    near it, the device's bandwidth is the limit, whatever the commits do."""
    rate = _mean([s.wal_bytes / s.seconds if s.seconds > 0 else None for s in steps])
    if rate is None:
        return
    wal = sum(s.wal_bytes for s in steps)
    if wal > 0:
        sheet.add(
            "wal.fpi_byte_share",
            min(1.0, sum(s.wal_fpi for s in steps) * BLOCK_BYTES / wal),
            "share",
            "pgstats",
            f"full-page images' share of the WAL at {n_clients(n)} (each counted as a whole "
            f"{BLOCK_BYTES // 1024} kB block: at most this)",
        )
    sheet.add(
        "wal.bytes_per_s", rate, "bytes/s", "pgstats", f"WAL written per second at {n_clients(n)}"
    )
    device = analysis.environment.wal_device
    if device is None or device.write_bytes_per_s <= 0:
        return
    sheet.add(
        "wal.device_bytes_per_s",
        device.write_bytes_per_s,
        "bytes/s",
        "waldevice",
        f"WAL the server alone wrote and flushed per second before the load, in 1 MiB "
        f"commits{f' (device {device.device})' if device.device else ''}",
    )
    sheet.add(
        "wal.device_share",
        rate / device.write_bytes_per_s,
        "share",
        "pgstats + waldevice",
        f"WAL written per second at {n_clients(n)}, as a share of what the server alone could "
        f"write before the load",
    )


def _dip_facts(sheet: FactSheet, analysis: RunAnalysis, variant: str) -> None:
    """The variant's dips after actions or checkpoints, over all its steps: a dip is a
    property of the variant's settings more than of one client count."""
    dips = [d for d in analysis.timeline.dips if d.variant == variant]
    if not dips:
        return
    worst = max(dips, key=lambda d: d.depth_pct)
    sheet.add(
        "dip.depth",
        sum(d.depth_pct for d in dips) / len(dips) / 100,
        "share",
        "pgbench + server log",
        f"mean dip of tps after {worst.action} (lowest 3-second mean in the 10 s "
        f"after against the median second of the 10 s before), over {len(dips)} step(s)",
    )
    sheet.add(
        "dip.noise",
        sum(d.noise_pct for d in dips) / len(dips) / 100,
        "share",
        "pgbench",
        "how low a 3-second mean falls by chance (3 robust σ, from the seconds before)",
    )
    sheet.add(
        "dip.excess",
        sum(d.excess_pct for d in dips) / len(dips) / 100,
        "share",
        "pgbench + server log",
        f"mean dip after {worst.action} beyond that noise, over {len(dips)} step(s)",
    )
    ratios = []
    for d in dips:
        if d.fpi_per_s_after is None or d.fpi_per_s_before is None:
            continue
        if d.fpi_per_s_before > 0:
            ratios.append(d.fpi_per_s_after / d.fpi_per_s_before)
        else:  # none before: a spike from nothing, or none at all (full_page_writes off)
            ratios.append(100.0 if d.fpi_per_s_after > 0 else 1.0)
    if ratios:
        sheet.add(
            "dip.fpi_ratio",
            max(ratios),
            "ratio",
            "pgstats",
            "full-page images per second after the checkpoint against before",
        )
    shares = [
        min(1.0, d.fpi_per_s_after * BLOCK_BYTES / d.wal_bytes_per_s_after)
        for d in dips
        if d.fpi_per_s_after is not None and d.wal_bytes_per_s_after
    ]
    if shares:
        # Judged by share, not only by jump: on slow storage the wave of images a checkpoint
        # starts can outlast the gap to the next one, and then there is no jump to see.
        sheet.add(
            "dip.fpi_wal_share",
            sum(shares) / len(shares),
            "share",
            "pgstats",
            "full-page images' share of the WAL in the 5 s after the checkpoint (at most: "
            "each counted as a whole 8 kB page)",
        )
    fpi_after = [d.fpi_per_s_after for d in dips if d.fpi_per_s_after is not None]
    if fpi_after:
        sheet.add(
            "dip.fpi_per_s_after",
            sum(fpi_after) / len(fpi_after),
            "count",
            "pgstats",
            "full-page images per second in the 5 s after the checkpoint",
        )


def _checkpoint_facts(sheet: FactSheet, analysis: RunAnalysis, variant: str) -> None:
    """Traced checkpoints that started during the variant's steps, phase by phase: how long
    the buffer writes and the fsyncs took (usdt checkpoint program)."""
    done = [
        item.checkpoint
        for item in analysis.checkpoints.items
        if item.variant == variant and item.checkpoint.total_ns
    ]
    if not done:
        _counted_checkpoint_facts(sheet, analysis, variant)
        return
    sheet.add("checkpoint.count", len(done), "count", "usdt", "checkpoints traced during the steps")
    for phase, label in (
        ("write", "writing the dirty buffers (spread over checkpoint_completion_target)"),
        ("sync", "the fsyncs of the files written"),
    ):
        durations = [p.duration_ns for c in done if (p := c.phase(phase)) is not None]
        if durations:
            sheet.add(
                f"checkpoint.{phase}_ms",
                statistics.fmean(durations) / 1e6,
                "ms",
                "usdt",
                f"mean time of a checkpoint's {phase} phase: {label}",
            )
    syncs = [
        p.duration_ns / c.total_ns
        for c in done
        if c.total_ns and (p := c.phase("sync")) is not None
    ]
    if syncs:
        sheet.add(
            "checkpoint.sync_share",
            statistics.fmean(syncs),
            "share",
            "usdt",
            "the fsyncs' share of a checkpoint's duration",
        )
    written = [c.buffers_written for c in done if c.buffers_written is not None]
    if written:
        sheet.add(
            "checkpoint.buffers_written",
            statistics.fmean(written),
            "count",
            "usdt",
            "buffers a checkpoint wrote, on average",
        )


def _counted_checkpoint_facts(sheet: FactSheet, analysis: RunAnalysis, variant: str) -> None:
    """Where no checkpoint was traced (no usdt probes, or the program not run): the
    checkpoints the server counted during the variant's steps, and the buffers they wrote
    (pg_stat_bgwriter before PostgreSQL 17, pg_stat_checkpointer from 17). Their phase times
    are not taken from these: the server adds them only when a checkpoint ends, which a spread
    one often does after the step."""
    steps = [c for c in analysis.counters if c.variant == variant]
    count = sum(s.checkpoints for s in steps)
    if not count:
        return
    sheet.add(
        "checkpoint.count",
        count,
        "count",
        "pgstats",
        "checkpoints the server counted during the steps (requested and timed)",
    )
    written = [s.checkpoint_buffers for s in steps if s.checkpoint_buffers is not None]
    if written:
        sheet.add(
            "checkpoint.buffers_written",
            sum(written) / count,
            "count",
            "pgstats",
            "buffers checkpoints wrote during the steps, per checkpoint counted (one still "
            "writing at a step's end counts what it had written)",
        )


def _profile_facts(sheet: FactSheet, analysis: RunAnalysis, variant: str, n: int) -> None:
    cell = next((p for p in analysis.cpu.profiles if p.variant == variant and p.clients == n), None)
    if cell is None or not cell.functions.total:
        return
    table = cell.functions
    sheet.add(
        "cpu.kernel_lock",
        table.kernel_lock_share,
        "share",
        "perf",
        "on-CPU samples in kernel mutex/spinlock slow paths",
    )
    sheet.add("cpu.kernel", table.kernel_share, "share", "perf", "on-CPU samples in the kernel")
    logging = max((v for f, v in table.total_values.items() if f in LOGGING_FUNCTIONS), default=0)
    sheet.add(
        "cpu.logging_path",
        logging / table.total,
        "share",
        "perf",
        "on-CPU samples under the statement-logging path (errfinish, pipe writes)",
    )


def _by_object(summaries: list[LatencySummary]) -> dict[str, tuple[int, int]]:
    """(waits, total ns) per object (tranche, lock type), over its modes."""
    out: dict[str, tuple[int, int]] = {}
    for s in summaries:
        count, total = out.get(s.object or "?", (0, 0))
        out[s.object or "?"] = (count + s.count, total + s.total_ns)
    return out


def _traced_lock_facts(
    sheet: FactSheet, analysis: RunAnalysis, variant: str, n: int, sampled: Profile | None
) -> None:
    """LWLock and heavyweight-lock wait time from kernel-side tracing, as a share of the
    sessions' active time (Little's law: wait time per second is the average number of
    sessions waiting), and per transaction; then the LWLock hot spot from the best source:
    traced time where the lwlock program ran, the sampled share otherwise."""
    cell = next(
        (c for c in analysis.locks.by_cell if c.variant == variant and c.clients == n), None
    )
    traced = cell is not None and cell.seconds > 0
    if cell is not None and traced:
        # Active time: the sampled average active sessions where sampling ran; otherwise the
        # clients' whole session time (every client active: a lower bound of the share).
        if sampled is not None and sampled.aas > 0:
            sessions, of_what = sampled.aas, "active time"
        else:
            sessions, of_what = float(n), "the clients' session time"
        active_ns = sessions * cell.seconds * 1e9
        xacts = cell.xacts
        for prefix, summaries, what in (
            ("lwlock", cell.lwlocks, "LWLock"),
            ("lock", cell.lock_waits, "heavyweight lock"),
        ):
            objects = _by_object(summaries)
            total_ns = sum(ns for _, ns in objects.values())
            sheet.add(
                f"{prefix}.traced_share",
                min(1.0, total_ns / active_ns),
                "share",
                "usdt",
                f"{what} wait time (kernel-side tracing) as a share of {of_what} at {n_clients(n)}",
            )
            for obj, (count, ns) in objects.items():
                sheet.add(
                    f"{prefix}.share.{obj}",
                    min(1.0, ns / active_ns),
                    "share",
                    "usdt",
                    f"{what} {obj}: wait time (traced) as a share of {of_what} at {n_clients(n)}",
                )
                if xacts:
                    sheet.add(
                        f"{prefix}.waits_per_xact.{obj}",
                        count / xacts,
                        "count",
                        "usdt",
                        f"{what} {obj}: waits per transaction (traced) at {n_clients(n)}",
                    )
                if count:
                    sheet.add(
                        f"{prefix}.mean_us.{obj}",
                        ns / count / 1000,
                        "µs",
                        "usdt",
                        f"{what} {obj}: mean wait (traced) at {n_clients(n)}",
                    )
    _lwlock_top(sheet, n, traced)


def _lwlock_top(sheet: FactSheet, n: int, traced: bool) -> None:
    """`lwlock.top` (and `lwlock.top.<tranche>`): the most waited-for LWLock tranche's share
    of active time, from traced time where tracing ran, else from sampling; its source says
    which."""
    prefix = "lwlock.share." if traced else "wait.lwlock_top."
    candidates = [f for name, f in sheet.facts.items() if name.startswith(prefix)]
    if not candidates:
        if traced:  # traced, and no LWLock wait at all
            sheet.add("lwlock.top", 0.0, "share", "usdt", f"LWLock wait time at {n_clients(n)}")
        return
    top = max(candidates, key=lambda f: f.value)
    tranche = top.name.rsplit(".", 1)[-1]
    how = "traced in the kernel" if traced else "sampled"
    for name in ("lwlock.top", f"lwlock.top.{tranche}"):
        sheet.facts[name] = Fact(
            name,
            top.value,
            "share",
            top.source,
            f"LWLock:{tranche}, the most waited-for tranche ({how}): share of "
            f"{'active time' if 'active time' in top.label else 'session time'} at {n_clients(n)}",
        )
    per_xact = sheet.get(f"lwlock.waits_per_xact.{tranche}")
    if per_xact is not None:
        sheet.facts["lwlock.top_waits_per_xact"] = Fact(
            "lwlock.top_waits_per_xact",
            per_xact.value,
            per_xact.unit,
            per_xact.source,
            per_xact.label,
        )
    mean = sheet.get(f"lwlock.mean_us.{tranche}")
    if mean is not None:
        sheet.facts["lwlock.top_mean_us"] = Fact(
            "lwlock.top_mean_us", mean.value, mean.unit, mean.source, mean.label
        )


def _run_sheet(analysis: RunAnalysis) -> FactSheet:
    """Facts about variants against the baseline: the cost of logging, of sync commits."""
    sheet = FactSheet(None, None, peak=False)
    for comparison in analysis.variants.comparisons:
        own = _variant_settings(analysis, comparison.variant)
        base = _variant_settings(analysis, comparison.baseline)
        changed = {k for k in own.keys() | base.keys() if own.get(k) != base.get(k)}
        cost = -comparison.change_pct / 100 if comparison.significant else 0.0
        if changed & set(LOGGING_SETTINGS) and own.get("log_statement", "none") != "none":
            current = sheet.value("variants.logging_cost") or 0.0
            if cost >= current:
                sheet.add(
                    "variants.logging_cost",
                    cost,
                    "share",
                    "pgbench (variants)",
                    f"throughput lost by {comparison.variant} against "
                    f"{comparison.baseline} at {n_clients(comparison.clients)}, where the "
                    f"change is beyond noise (else 0)",
                )
        if "synchronous_commit" in changed:
            current = sheet.value("variants.sync_commit_cost") or 0.0
            if cost >= current:
                sheet.add(
                    "variants.sync_commit_cost",
                    cost,
                    "share",
                    "pgbench (variants)",
                    f"throughput lost by {comparison.variant} against "
                    f"{comparison.baseline} (synchronous_commit differs), beyond noise",
                )
    return sheet
