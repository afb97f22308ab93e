"""Facts: the run's evidence as named numbers, each with its unit and where it came from.

The diagnosis (`diagnose.py`) reads nothing else: its rules name facts. Facts are per variant,
taken at the variant's highest client count (where a bottleneck shows most), plus facts about
the variants against each other. A fact that a missing collector would have given is simply
absent; rules that need it say so instead of guessing.

Shares are fractions of 1 (of active time, of samples, of CPU). Pure functions of the store.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from pgscope.store import RunStore

if TYPE_CHECKING:
    from pgscope.analyze.run import RunResult

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
    "syncrep": ("IPC:SyncRep",),
    "datafile_read": ("IO:DataFileRead", "IO:DataFilePrefetch"),
    "client_read": ("Client:ClientRead",),
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


@dataclass(frozen=True)
class Fact:
    name: str
    value: float
    unit: str  # "share", "ms", "tps", "ratio", "bytes", "bytes/s", "count", "clients"
    source: str  # the collector or analysis it came from
    label: str  # what it is, in words

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def shown(self) -> str:
        """The value as a reader wants it."""
        v = self.value
        if self.unit == "share":
            return f"{v:.0%}" if abs(v) >= 0.01 or v == 0 else f"{v:.2%}"
        if self.unit == "bytes/s":
            return f"{v / 1e6:.2f} MB/s"
        if self.unit == "bytes":
            return f"{v:,.0f} B"
        if self.unit == "ratio":
            return f"{v:.1f}×"
        if self.unit == "%":
            return f"{v:+.1f}%"
        if self.unit in ("tps", "count", "clients"):
            return f"{v:,.0f}"
        return f"{v:.3g} {self.unit}"


class FactSheet:
    """The facts of one variant (its name) or of the whole run (variant None)."""

    def __init__(self, variant: str | None, clients: int | None) -> None:
        self.variant = variant
        self.clients = clients
        self.facts: dict[str, Fact] = {}

    def add(self, name: str, value: float | None, unit: str, source: str, label: str) -> None:
        if value is not None:
            self.facts[name] = Fact(name, float(value), unit, source, label)

    def get(self, name: str) -> Fact | None:
        return self.facts.get(name)

    def value(self, name: str) -> float | None:
        fact = self.facts.get(name)
        return fact.value if fact else None

    def to_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "clients": self.clients,
            "facts": {n: f.to_json() for n, f in sorted(self.facts.items())},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FactSheet:
        sheet = cls(data.get("variant"), data.get("clients"))
        for name, fact in data["facts"].items():
            sheet.facts[name] = Fact(**fact)
        return sheet


def extract(store: RunStore, result: RunResult) -> list[FactSheet]:
    """One sheet per variant, then one for the run (variant comparisons)."""
    spec = json.loads(result.run["spec_json"] or "{}")
    sheets = [_variant_sheet(store, result, variant, spec) for variant in result.scaling.variants()]
    _loss_facts(sheets)
    sheets.append(_run_sheet(store, result, spec))
    return sheets


def _pinned_cpus(spec: dict[str, Any], variant: str) -> int | None:
    merged = {**(spec.get("settings") or {}), **(spec.get("variants") or {}).get(variant, {})}
    value = merged.get("pgscope.cpus")
    return int(value) if value is not None else None


def _variant_sheet(
    store: RunStore, result: RunResult, variant: str, spec: dict[str, Any]
) -> FactSheet:
    cells = [c for c in result.scaling.cells if c.variant == variant and c.tps_mean]
    peak = max((c.clients for c in cells), default=None)
    sheet = FactSheet(variant, peak)
    if peak is None:
        return sheet
    top = next(c for c in cells if c.clients == peak)
    sheet.add("tps", top.tps_mean, "tps", "pgbench", f"mean tps at {peak} clients")
    sheet.add("p95_ms", top.p95_ms, "ms", "pgbench", f"p95 latency at {peak} clients")
    sheet.add("clients", peak, "clients", "spec", "the highest client count measured")
    _scaling_facts(sheet, result, variant, cells)
    _wait_facts(sheet, result, variant, peak)
    _host_facts(sheet, store, variant, peak, _pinned_cpus(spec, variant))
    _counter_facts(sheet, result, variant, peak)
    _dip_facts(sheet, result, variant)
    _profile_facts(sheet, store, variant, peak)
    return sheet


def _scaling_facts(sheet: FactSheet, result: RunResult, variant: str, cells: list[Any]) -> None:
    if len(cells) >= 2:
        low, high = cells[0], cells[-1]
        per_client_low = low.tps_mean / low.clients
        sheet.add(
            "scaling.efficiency",
            high.tps_mean / (per_client_low * high.clients),
            "share",
            "pgbench",
            f"tps at {high.clients} clients as a share of {high.clients}× "
            f"the per-client tps at {low.clients}",
        )
        best = max(cells, key=lambda c: c.tps_mean)
        sheet.add(
            "scaling.best_clients",
            best.clients,
            "clients",
            "pgbench",
            "the client count with the highest mean tps",
        )
        sheet.add(
            "scaling.drop_after_best",
            1 - high.tps_mean / best.tps_mean,
            "share",
            "pgbench",
            f"how far tps at {high.clients} clients is below the best",
        )
    fit = result.scaling.fits.get(variant)
    if fit is not None:
        sheet.add("usl.sigma", fit.sigma, "share", "usl", "USL contention σ (serialised share)")
        sheet.add("usl.kappa", fit.kappa, "share", "usl", "USL coherency κ")
        if fit.n_star is not None:
            sheet.add("usl.n_star", fit.n_star, "clients", "usl", "USL peak N*")


def _wait_facts(sheet: FactSheet, result: RunResult, variant: str, peak: int) -> None:
    waits = result.waits
    if waits is None:
        return
    by_clients = {p.clients: p.profile for p in waits.by_clients if p.variant == variant}
    profile = by_clients.get(peak)
    if profile is None or not profile.samples:
        return  # not sampled (no activity collector); sampled but never active still counts
    source = "activity"
    for entry in profile.entries:
        sheet.add(
            f"wait.share.{entry.label}",
            entry.share,
            "share",
            source,
            f"{entry.label} share of active time at {peak} clients",
        )
    for cls, share in profile.class_shares().items():
        sheet.add(
            f"wait.class.{cls}",
            share,
            "share",
            source,
            f"{cls} waits' share of active time at {peak} clients",
        )
    for group, events in WAIT_GROUPS.items():
        total = sum(e.share for e in profile.entries if e.label in events)
        sheet.add(
            f"wait.{group}",
            total,
            "share",
            source,
            f"{' + '.join(events[:3])}{' …' if len(events) > 3 else ''} share of "
            f"active time at {peak} clients",
        )
    lwlocks = [e for e in profile.entries if e.wait_event_type == "LWLock"]
    if lwlocks:
        top = max(lwlocks, key=lambda e: e.share)
        sheet.add(
            "wait.lwlock_top",
            top.share,
            "share",
            source,
            f"LWLock:{top.wait_event}, the most waited-for LWLock tranche, at {peak} clients",
        )
        sheet.add(
            f"wait.lwlock_top.{top.wait_event}",
            top.share,
            "share",
            source,
            f"LWLock:{top.wait_event} share of active time at {peak} clients",
        )
    sheet.add(
        "wait.aas", profile.aas, "count", source, f"average active sessions at {peak} clients"
    )
    sheet.add(
        "wait.aas_per_client",
        profile.aas / peak,
        "share",
        source,
        f"average active sessions per client at {peak} clients",
    )
    states = profile.states
    sheet.add(
        "sessions.idle",
        states.get("idle", 0.0) + states.get("idle in transaction", 0.0),
        "share",
        source,
        f"share of client sessions' samples idle (in or out of a transaction) at {peak} clients",
    )
    sheet.add(
        "sessions.idle_in_transaction",
        states.get("idle in transaction", 0.0),
        "share",
        source,
        f"share of client sessions' samples idle inside a transaction at {peak} clients",
    )
    lowest = min(by_clients)
    if lowest != peak:
        low_classes = by_clients[lowest].class_shares()
        for cls, share in profile.class_shares().items():
            sheet.add(
                f"wait.growth.{cls}",
                share - low_classes.get(cls, 0.0),
                "share",
                source,
                f"growth of {cls}'s share of active time from {lowest} to {peak} clients",
            )


def _host_facts(
    sheet: FactSheet, store: RunStore, variant: str, peak: int, pinned: int | None
) -> None:
    if not store.has_table("host_cpu"):
        return
    row = store.query(
        "SELECT avg(h.busy) AS busy, avg(h.iowait_share) AS iowait, avg(h.steal_share) AS steal,"
        " avg(h.server_share) AS server, avg(h.client_share) AS client, max(h.cpus) AS cpus "
        "FROM host_cpu h "
        "JOIN steps s ON h.ts_us BETWEEN s.window_start_us AND s.window_end_us "
        "WHERE s.variant = ? AND s.clients = ?",
        [variant, peak],
    )[0]
    if row["busy"] is None:
        return
    for name, key, label in (
        ("host.cpu_busy", "busy", "CPU busy"),
        ("host.iowait", "iowait", "CPU idle waiting for I/O"),
        ("host.steal", "steal", "CPU taken by the hypervisor"),
        ("host.server_cpu", "server", "CPU used by the cluster"),
        ("host.client_cpu", "client", "CPU used by pgbench"),
    ):
        sheet.add(
            name,
            row[key],
            "share",
            "host",
            f"{label}, share of the host's CPU time at {peak} clients",
        )
    # "CPU-bound" is about the CPUs the server may run on: pinned to 1 of 2, it saturates its
    # one core while the host looks half idle. Pinned to fewer CPUs than the host has,
    # pgbench runs on the others, so the server's own use is what keeps its CPUs busy;
    # pinned to all of them, pgbench shares them and the host's busy share is the answer.
    # Time the hypervisor steals counts as busy, as in the host's share: the server wanted
    # the CPU and did not get it (the host's steal share, taken as even across CPUs).
    if pinned and row["server"] is not None and row["cpus"] and pinned < row["cpus"]:
        sheet.add(
            "host.server_cpus_busy",
            min(1.0, row["server"] * row["cpus"] / pinned + (row["steal"] or 0.0)),
            "share",
            "host",
            f"CPU busy on the {pinned} CPU{'s' if pinned > 1 else ''} the server is pinned to "
            f"(its own use plus the hypervisor's steal), at {peak} clients",
        )
    else:
        sheet.add(
            "host.server_cpus_busy",
            row["busy"],
            "share",
            "host",
            f"CPU busy on the CPUs the server may use (all of the host's), at {peak} clients",
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
                    f"tps below the fastest variant ({fastest.variant}) at {sheet.clients} clients",
                )


def _counter_facts(sheet: FactSheet, result: RunResult, variant: str, peak: int) -> None:
    steps = [c for c in result.counters if c.variant == variant and c.clients == peak]
    if not steps:
        return

    def mean(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return sum(present) / len(present) if present else None

    sheet.add(
        "wal.bytes_per_xact",
        mean([s.wal_bytes_per_xact for s in steps]),
        "bytes",
        "pgstats",
        "WAL bytes per transaction",
    )
    sheet.add(
        "wal.fpi_per_xact",
        mean([s.fpi_per_xact for s in steps]),
        "count",
        "pgstats",
        "full-page images per transaction",
    )
    sheet.add(
        "log.bytes_per_s",
        mean([s.log_bytes_per_s for s in steps]),
        "bytes/s",
        "pgstats",
        "server log written per second",
    )
    sheet.add(
        "rows_per_commit",
        mean([s.rows_per_commit for s in steps]),
        "count",
        "pgstats",
        "rows inserted per commit",
    )


def _dip_facts(sheet: FactSheet, result: RunResult, variant: str) -> None:
    dips = [d for d in result.dips if d.variant == variant]
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


def _profile_facts(sheet: FactSheet, store: RunStore, variant: str, peak: int) -> None:
    from pgscope.analyze import profile

    if not store.has_table("profile_stacks"):
        return
    steps = profile.steps_of(store, variant, peak)
    cpu = profile.load_profile(store, "cpu", steps) if steps else None
    if cpu is None or not cpu.total:
        return
    sheet.add(
        "cpu.kernel_lock",
        profile.kernel_lock_share(cpu).share,
        "share",
        "perf",
        "on-CPU samples in kernel mutex/spinlock slow paths",
    )
    sheet.add(
        "cpu.kernel",
        profile.kernel_user_split(cpu).kernel_share,
        "share",
        "perf",
        "on-CPU samples in the kernel",
    )
    _, totals = profile.function_values(cpu)
    logging = max((v for f, v in totals.items() if f in LOGGING_FUNCTIONS), default=0)
    sheet.add(
        "cpu.logging_path",
        logging / cpu.total,
        "share",
        "perf",
        "on-CPU samples under the statement-logging path (errfinish, pipe writes)",
    )


def _run_sheet(store: RunStore, result: RunResult, spec: dict[str, Any]) -> FactSheet:
    """Facts about variants against the baseline: the cost of logging, of sync commits."""
    sheet = FactSheet(None, None)
    variants: dict[str, dict[str, Any]] = {
        **{v: {} for v in result.scaling.variants()},
        **(spec.get("variants") or {}),
    }
    settings: dict[str, Any] = spec.get("settings") or {}
    for comparison in result.comparisons:
        own = {**settings, **variants.get(comparison.variant, {})}
        base = {**settings, **variants.get(comparison.baseline, {})}
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
                    f"{comparison.baseline} at {comparison.clients} clients, where the "
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
