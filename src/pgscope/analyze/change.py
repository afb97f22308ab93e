"""What changed from one run to another (`pgscope compare A B`): first whether the two measured
the same thing (workload, scale, protocol, target, server, host) and are two runs, then
throughput per cell with a 95% interval of the ratio (compare.py), the model each run's report
chose with its parameters, the wait classes at the peak, the top findings, the settings that
differ and the CPU profile's differential. A pure function of two analyses."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from pgscope.analyze.compare import Comparison, change_interval
from pgscope.analyze.model import RunAnalysis
from pgscope.analyze.profile import differential
from pgscope.analyze.usl import UslFit
from pgscope.labels import driven_workload, setting_label
from pgscope.words import counted

# Settings that differ between any two runs and say nothing about them.
IGNORED_SETTINGS = frozenset({"port", "unix_socket_directories", "application_name"})


@dataclass(frozen=True)
class RunChange:
    """What changed from run A to run B."""

    a: str  # run ids
    b: str
    runs: dict[str, dict[str, Any]]  # "a", "b": what each run measured (IDENTITY's keys)
    differences: list[dict[str, Any]]  # what, a, b: where the two differ, in IDENTITY's order
    throughput: list[Comparison]  # B's cells against A's
    models: list[dict[str, Any]]  # per variant in both: USL parameters of each
    waits: list[dict[str, Any]]  # per wait class: share of active time at the peak, A and B
    findings: dict[str, str | None]  # top finding of each
    settings: list[dict[str, Any]]  # settings whose value differs (first variant of each)
    profile: dict[str, Any] | None  # CPU profile differential, where both have one
    # Open loop, per variant in both: each objective's capacity and the knee, A and B
    capacity: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "runs": self.runs,
            "differences": self.differences,
            "same_run": self.same_run,
            "warning": self.warning,
            "throughput": [c.to_json() for c in self.throughput],
            "models": self.models,
            "waits": self.waits,
            "findings": self.findings,
            "settings": self.settings,
            "profile": self.profile,
            "capacity": self.capacity,
        }

    @property
    def same_run(self) -> bool:
        """A and B are one run (one folder given twice, or a copy of it): every change is
        zero by construction, which says nothing of the server."""
        return self.a == self.b

    @property
    def warning(self) -> str | None:
        """What a reader must know before any percentage: A and B are one run, or the runs
        measured different things (None: two runs of the same workload, scale, protocol,
        target, server and host)."""
        if self.same_run:
            return (
                f"A and B are the same run ({self.a}): every change below is zero by "
                f"construction; compare it with another run"
            )
        if not self.differences:
            return None
        return (
            f"the runs differ in {', '.join(d['what'] for d in self.differences)}: their "
            f"numbers do not compare like for like"
        )


# What makes two runs' numbers comparable, in the order a reader checks it.
IDENTITY = ("workload", "scale", "protocol", "target", "server", "host")


def run_identity(run: RunAnalysis) -> dict[str, Any]:
    """What `run` measured: its workload (builtin and script names), pgbench scale and
    protocol, the target (embedded, or the server's connection string), the server's version
    and the host's CPUs. A value is None where the run does not say (`sample`, `observe`)."""
    spec = run.environment.spec
    workload = driven_workload(spec)
    drove = workload is not None
    protocol = spec.get("protocol")
    if protocol and spec.get("connect_per_transaction"):
        protocol = f"{protocol}, a connection per transaction"
    host = run.environment.host
    cpus = host.get("usable_cpus")
    return {
        "workload": workload if drove else f"none driven (pgscope {run.recipe})",
        "scale": spec.get("scale") if drove else None,
        "protocol": protocol if drove else None,
        "target": "embedded" if run.target.kind == "embedded" else run.target.conninfo,
        "server": _short_version(run.target.server_version),
        "host": None
        if cpus is None
        else f"{counted(cpus, 'CPU')}"
        + (f", {host['cpu_model']}" if host.get("cpu_model") else ""),
    }


def _short_version(version: str | None) -> str | None:
    """ "PostgreSQL 15.18 (Debian ...) on x86_64..." -> "PostgreSQL 15.18"."""
    if not version:
        return None
    return " ".join(version.split()[:2])


def _tps(run: RunAnalysis, variant: str, clients: int) -> list[float]:
    """The closed-loop steps' tps at a cell (open-loop steps are compared by capacity)."""
    return [
        float(s.tps)
        for s in run.steps
        if s.variant == variant and s.clients == clients and s.ok and s.tps and s.rate is None
    ]


def _pairs(a: RunAnalysis, b: RunAnalysis) -> list[tuple[str, str]]:
    """(A's variant, B's) to set side by side: those of one name; and an observation (its
    one variant, `observed`) against a run's only variant, its windows at N sessions against
    the steps at N clients."""
    va, vb = a.scalability.variants(), b.scalability.variants()
    shared = [(v, v) for v in dict.fromkeys([*va, *vb]) if v in va and v in vb]
    observing = a.observation is not None or b.observation is not None
    if not shared and observing and len(va) == 1 and len(vb) == 1:
        return [(va[0], vb[0])]
    return shared


def _throughput(a: RunAnalysis, b: RunAnalysis) -> list[Comparison]:
    out = []
    for variant, variant_b in _pairs(a, b):
        for clients in sorted(
            {s.clients for s in a.steps if s.variant == variant and s.rate is None}
        ):
            tps_a, tps_b = _tps(a, variant, clients), _tps(b, variant_b, clients)
            if not tps_a or not tps_b:
                continue
            mean_a, mean_b = statistics.fmean(tps_a), statistics.fmean(tps_b)
            if mean_a == 0:
                continue  # no change can be stated against nothing
            out.append(
                Comparison(
                    variant_b,
                    variant,
                    clients,
                    mean_b,
                    mean_a,
                    len(tps_b),
                    len(tps_a),
                    (mean_b - mean_a) / mean_a * 100,
                    change_interval(tps_b, tps_a),
                )
            )
    return out


def _chosen(fit: UslFit) -> dict[str, Any]:
    """The model the run's report chose (AIC: USL, Amdahl or linear) with its own
    parameters, as `report` shows it: σ and κ where that model has them (Amdahl's κ is 0, a
    linear model has neither), N* and X(N*) where it is the USL's peak."""
    params = fit.models[fit.best_model].params
    usl = fit.best_model == "usl"
    return {
        "model": fit.best_model,
        "sigma": params.get("sigma"),
        "kappa": params.get("kappa", 0.0 if fit.best_model == "amdahl" else None),
        "lambda": params.get("lambda"),
        "n_star": fit.n_star if usl else None,
        "x_max": fit.x_max if usl else None,
        "summary": fit.describe(),
    }


def _models(a: RunAnalysis, b: RunAnalysis) -> list[dict[str, Any]]:
    models = []
    for variant, variant_b in _pairs(a, b):
        fit_a, fit_b = a.scalability.fits.get(variant), b.scalability.fits.get(variant_b)
        if fit_a is not None and fit_b is not None:
            models.append(
                {
                    "variant": variant,
                    **{
                        f"{key}_{side}": value
                        for side, fit in (("a", fit_a), ("b", fit_b))
                        for key, value in _chosen(fit).items()
                    },
                }
            )
    return models


def _peak_classes(run: RunAnalysis) -> dict[str, float]:
    assert run.waits is not None
    profiles = [p for p in run.waits.by_clients if p.rate is None]
    if not profiles:
        return dict(run.waits.overall.class_shares())
    top = max(profiles, key=lambda p: p.clients)
    return dict(top.profile.class_shares())


def _waits(a: RunAnalysis, b: RunAnalysis) -> list[dict[str, Any]]:
    if a.waits is None or b.waits is None:
        return []
    shares_a, shares_b = _peak_classes(a), _peak_classes(b)
    return [
        {"class": cls, "a": shares_a.get(cls, 0.0), "b": shares_b.get(cls, 0.0)}
        for cls in sorted(
            shares_a.keys() | shares_b.keys(),
            key=lambda c: -max(shares_a.get(c, 0), shares_b.get(c, 0)),
        )
    ]


def _settings(run: RunAnalysis) -> dict[str, str] | None:
    """The first variant's settings that were not at their defaults, each in human units
    (None: the run recorded no settings)."""
    first = next(iter(run.environment.settings.values()), None)
    if first is None:
        return None
    return {s.name: "-" if s.setting is None else setting_label(s.setting, s.unit) for s in first}


def _setting_changes(a: RunAnalysis, b: RunAnalysis) -> list[dict[str, Any]]:
    """Each setting whose value differs; one absent from a run's record was at the server's
    built-in default there ("(default)"), unless that run recorded none ("not recorded")."""
    set_a, set_b = _settings(a), _settings(b)
    if set_a is None and set_b is None:
        return []

    def value(values: dict[str, str] | None, name: str) -> str:
        if values is None:
            return "not recorded"
        return values.get(name, "(default)")

    names = (set_a or {}).keys() | (set_b or {}).keys()
    return [
        {"name": n, "a": value(set_a, n), "b": value(set_b, n)}
        for n in sorted(names - IGNORED_SETTINGS)
        if value(set_a, n) != value(set_b, n)
    ]


def compare_runs(a: RunAnalysis, b: RunAnalysis) -> RunChange:
    def top(run: RunAnalysis) -> str | None:
        findings = run.diagnosis.findings if run.diagnosis else []
        return findings[0].title if findings else None

    settings = _setting_changes(a, b)
    ids = {"a": run_identity(a), "b": run_identity(b)}
    differences = [
        {"what": key, "a": ids["a"][key], "b": ids["b"][key]}
        for key in IDENTITY
        if ids["a"][key] != ids["b"][key]
    ]
    profile = None
    pa, pb = a.cpu.run_profile, b.cpu.run_profile
    if pa is not None and pb is not None and pa.total and pb.total:
        diff = differential(pa, pb, 10)
        profile = {
            side: [
                {"name": d.name, "total_a": d.total_a, "total_b": d.total_b, "delta": d.total_delta}
                for d in deltas
            ]
            for side, deltas in (("grew", diff.grew), ("shrank", diff.shrank))
        }
    return RunChange(
        a.run_id,
        b.run_id,
        ids,
        differences,
        _throughput(a, b),
        _models(a, b),
        _waits(a, b),
        {"a": top(a), "b": top(b)},
        settings,
        profile,
        _capacities(a, b),
    )


def _capacities(a: RunAnalysis, b: RunAnalysis) -> list[dict[str, Any]]:
    """Per variant both ran rates for: each objective both judged, its capacity in A and B
    (means over repeats, their 95% intervals) and the change with its Welch 95% interval
    (over the repeats' estimates; None with fewer than 2 each); then the knee: what the server
    completed beyond it."""
    if a.capacity is None or b.capacity is None:
        return []
    rows: list[dict[str, Any]] = []
    for variant, variant_b in _pairs(a, b):
        ca, cb = a.capacity.of(variant), b.capacity.of(variant_b)
        if ca is None or cb is None:
            continue
        for est_a in ca.capacities:
            est_b = next((e for e in cb.capacities if e.objective == est_a.objective), None)
            if est_b is None:
                continue
            per_a = [v for v in est_a.per_repeat if v is not None]
            per_b = [v for v in est_b.per_repeat if v is not None]
            rows.append(
                _capacity_row(variant_b, est_a.objective, est_a.tps, est_b.tps, per_a, per_b)
                | {"a_ci95": est_a.ci95, "b_ci95": est_b.ci95, "a_said": est_a.said,
                   "b_said": est_b.said}
            )  # fmt: skip
        rows.append(
            _capacity_row(
                variant_b,
                "knee",
                ca.knee.saturated_tps,
                cb.knee.saturated_tps,
                [],
                [],
            )
            | {"a_ci95": ca.knee.saturated_ci95, "b_ci95": cb.knee.saturated_ci95}
        )
    return rows


def _capacity_row(
    variant: str,
    what: str,
    tps_a: float | None,
    tps_b: float | None,
    per_a: list[float],
    per_b: list[float],
) -> dict[str, Any]:
    change = (tps_b / tps_a - 1) * 100 if tps_a and tps_b is not None else None
    # The ratio's interval on the log scale, as every change compare states (compare.py).
    interval = change_interval(per_b, per_a)
    return {
        "variant": variant,
        "what": what,
        "a": tps_a,
        "b": tps_b,
        "change_pct": change,
        "ci95_pct": interval,
    }
