"""What changed from one run to another (`pgscope compare A B`): throughput per cell with a
Welch interval, the USL parameters, the wait classes at the peak, the top findings, the
settings that differ and the CPU profile's differential. A pure function of two analyses."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from pgscope.analyze.compare import Comparison, welch_interval
from pgscope.analyze.model import RunAnalysis
from pgscope.analyze.profile import differential

# Settings that differ between any two runs and say nothing about them.
IGNORED_SETTINGS = frozenset({"port", "unix_socket_directories", "application_name"})


@dataclass(frozen=True)
class RunChange:
    """What changed from run A to run B."""

    a: str  # run ids
    b: str
    throughput: list[Comparison]  # B's cells against A's
    models: list[dict[str, Any]]  # per variant in both: USL parameters of each
    waits: list[dict[str, Any]]  # per wait class: share of active time at the peak, A and B
    findings: dict[str, str | None]  # top finding of each
    settings: list[dict[str, Any]]  # settings whose value differs (first variant of each)
    profile: dict[str, Any] | None  # CPU profile differential, where both have one

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "throughput": [c.to_json() for c in self.throughput],
            "models": self.models,
            "waits": self.waits,
            "findings": self.findings,
            "settings": self.settings,
            "profile": self.profile,
        }


def _tps(run: RunAnalysis, variant: str, clients: int) -> list[float]:
    return [
        float(s.tps)
        for s in run.steps
        if s.variant == variant and s.clients == clients and s.ok and s.tps
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
        for clients in sorted({s.clients for s in a.steps if s.variant == variant}):
            tps_a, tps_b = _tps(a, variant, clients), _tps(b, variant_b, clients)
            if not tps_a or not tps_b:
                continue
            mean_a, mean_b = statistics.fmean(tps_a), statistics.fmean(tps_b)
            interval = welch_interval(tps_b, tps_a)
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
                    None
                    if interval is None
                    else (interval[0] / mean_a * 100, interval[1] / mean_a * 100),
                )
            )
    return out


def _models(a: RunAnalysis, b: RunAnalysis) -> list[dict[str, Any]]:
    models = []
    for variant, variant_b in _pairs(a, b):
        fit_a, fit_b = a.scalability.fits.get(variant), b.scalability.fits.get(variant_b)
        if fit_a is not None and fit_b is not None:
            models.append(
                {
                    "variant": variant,
                    **{
                        f"{key}_{side}": getattr(fit, key)
                        for side, fit in (("a", fit_a), ("b", fit_b))
                        for key in ("sigma", "kappa", "n_star", "x_max")
                    },
                }
            )
    return models


def _peak_classes(run: RunAnalysis) -> dict[str, float]:
    assert run.waits is not None
    profiles = run.waits.by_clients
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


def _settings(run: RunAnalysis) -> dict[str, str]:
    """The first variant's settings, each as SHOW would give it."""
    first = next(iter(run.environment.settings.values()), [])
    return {s.name: s.shown for s in first}


def compare_runs(a: RunAnalysis, b: RunAnalysis) -> RunChange:
    def top(run: RunAnalysis) -> str | None:
        findings = run.diagnosis.findings if run.diagnosis else []
        return findings[0].title if findings else None

    set_a, set_b = _settings(a), _settings(b)
    settings = [
        {"name": n, "a": set_a.get(n), "b": set_b.get(n)}
        for n in sorted(set_a.keys() | set_b.keys())
        if set_a.get(n) != set_b.get(n) and n not in IGNORED_SETTINGS
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
        _throughput(a, b),
        _models(a, b),
        _waits(a, b),
        {"a": top(a), "b": top(b)},
        settings,
        profile,
    )
