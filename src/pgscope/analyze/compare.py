"""Variants side by side: each against a baseline, with an honest interval.

For every client count measured in both, the change of a variant's mean tps against the
baseline's, with a Welch 95% interval of the difference of the means (repeats of each are
the observations; the interval is wide with few repeats, as it should be). A change is called
significant only when that interval excludes zero. Pure function of the steps' rows.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Comparison:
    variant: str
    baseline: str
    clients: int
    tps: float
    baseline_tps: float
    repeats: int
    baseline_repeats: int
    change_pct: float  # (variant - baseline) / baseline
    ci95_pct: tuple[float, float] | None  # of the same, None with fewer than 2 repeats each

    @property
    def significant(self) -> bool:
        return self.ci95_pct is not None and (self.ci95_pct[0] > 0 or self.ci95_pct[1] < 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "baseline": self.baseline,
            "clients": self.clients,
            "tps": self.tps,
            "baseline_tps": self.baseline_tps,
            "repeats": self.repeats,
            "baseline_repeats": self.baseline_repeats,
            "change_pct": self.change_pct,
            "ci95_pct": list(self.ci95_pct) if self.ci95_pct else None,
            "significant": self.significant,
        }


def welch_interval(a: list[float], b: list[float]) -> tuple[float, float] | None:
    """95% interval of mean(a) - mean(b) without assuming equal variances."""
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy import stats  # slow to import; only when there is something to compare

    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.fmean(a) - statistics.fmean(b)
    if va + vb == 0:
        return diff, diff
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(stats.t.ppf(0.975, dof)) * math.sqrt(va + vb)
    return diff - half, diff + half


def compare_variants(steps: list[dict[str, Any]], baseline: str | None = None) -> list[Comparison]:
    """Every variant but the baseline, at every client count both have good steps for."""
    tps: dict[tuple[str, int], list[float]] = {}
    order: list[str] = []
    for step in steps:
        if step["variant"] not in order:
            order.append(step["variant"])
        if step["status"] == "ok" and step["tps"] is not None:
            tps.setdefault((step["variant"], step["clients"]), []).append(float(step["tps"]))
    if len(order) < 2:
        return []
    base = baseline if baseline in order else order[0]
    out = []
    for variant in order:
        if variant == base:
            continue
        for (name, clients), values in sorted(tps.items()):
            reference = tps.get((base, clients))
            if name != variant or not reference:
                continue
            base_mean = statistics.fmean(reference)
            interval = welch_interval(values, reference)
            out.append(
                Comparison(
                    variant,
                    base,
                    clients,
                    statistics.fmean(values),
                    base_mean,
                    len(values),
                    len(reference),
                    (statistics.fmean(values) - base_mean) / base_mean * 100,
                    None
                    if interval is None or base_mean == 0
                    else (interval[0] / base_mean * 100, interval[1] / base_mean * 100),
                )
            )
    return out


# ---------------------------------------------------------------------------------------------
# Two runs


@dataclass(frozen=True)
class RunChange:
    """What changed from run A to run B."""

    a: str  # run ids
    b: str
    throughput: list[Comparison]  # B's cells against A's (variant = "B:<variant>")
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


def compare_runs(a: Any, b: Any) -> RunChange:
    """`a` and `b` are RunResults (analyze.run.load_run)."""
    from pgscope.analyze import profile as prof
    from pgscope.store import RunStore

    throughput = []
    for variant in dict.fromkeys([*a.scaling.variants(), *b.scaling.variants()]):
        for clients in sorted({s["clients"] for s in a.steps if s["variant"] == variant}):
            tps_a = [
                float(s["tps"])
                for s in a.steps
                if s["variant"] == variant
                and s["clients"] == clients
                and s["status"] == "ok"
                and s["tps"]
            ]
            tps_b = [
                float(s["tps"])
                for s in b.steps
                if s["variant"] == variant
                and s["clients"] == clients
                and s["status"] == "ok"
                and s["tps"]
            ]
            if not tps_a or not tps_b:
                continue
            mean_a, mean_b = statistics.fmean(tps_a), statistics.fmean(tps_b)
            interval = welch_interval(tps_b, tps_a)
            throughput.append(
                Comparison(
                    variant,
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
    models = []
    for variant, fit_a in a.scaling.fits.items():
        fit_b = b.scaling.fits.get(variant)
        if fit_b is not None:
            models.append(
                {
                    "variant": variant,
                    **{
                        f"{key}_{side}": getattr(fit, attr)
                        for side, fit in (("a", fit_a), ("b", fit_b))
                        for key, attr in (
                            ("sigma", "sigma"),
                            ("kappa", "kappa"),
                            ("n_star", "n_star"),
                            ("x_max", "x_max"),
                        )
                    },
                }
            )
    waits = []
    if a.waits is not None and b.waits is not None:

        def peak_classes(run: Any) -> dict[str, float]:
            profiles = run.waits.by_clients
            if not profiles:
                return dict(run.waits.overall.class_shares())
            top = max(profiles, key=lambda p: p.clients)
            return dict(top.profile.class_shares())

        shares_a, shares_b = peak_classes(a), peak_classes(b)
        for cls in sorted(
            shares_a.keys() | shares_b.keys(),
            key=lambda c: -max(shares_a.get(c, 0), shares_b.get(c, 0)),
        ):
            waits.append({"class": cls, "a": shares_a.get(cls, 0.0), "b": shares_b.get(cls, 0.0)})

    def top(run: Any) -> str | None:
        findings = run.diagnosis.findings if run.diagnosis else []
        return findings[0].title if findings else None

    def settings_of(run: Any) -> dict[str, str]:
        store = RunStore.open(run.run_dir)
        try:
            rows = store.query("SELECT variant, name, setting, unit FROM settings")
        finally:
            store.close()
        first = rows[0]["variant"] if rows else None
        return {
            r["name"]: f"{r['setting']}{r['unit'] or ''}" for r in rows if r["variant"] == first
        }

    set_a, set_b = settings_of(a), settings_of(b)
    ignored = {"port", "unix_socket_directories", "application_name"}
    settings = [
        {"name": n, "a": set_a.get(n), "b": set_b.get(n)}
        for n in sorted(set_a.keys() | set_b.keys())
        if set_a.get(n) != set_b.get(n) and n not in ignored
    ]
    profile = None
    stores = [RunStore.open(a.run_dir), RunStore.open(b.run_dir)]
    try:
        loaded = [
            prof.load_profile(s, "cpu", None, label=label)
            for s, label in zip(stores, ("A", "B"), strict=True)
        ]
        if all(p.total for p in loaded):
            diff = prof.differential(loaded[0], loaded[1], 10)
            profile = {
                side: [
                    {
                        "name": d.name,
                        "total_a": d.total_a,
                        "total_b": d.total_b,
                        "delta": d.total_delta,
                    }
                    for d in deltas
                ]
                for side, deltas in (("grew", diff.grew), ("shrank", diff.shrank))
            }
    finally:
        for s in stores:
            s.close()
    return RunChange(
        str(a.run["run_id"]),
        str(b.run["run_id"]),
        throughput,
        models,
        waits,
        {"a": top(a), "b": top(b)},
        settings,
        profile,
    )
