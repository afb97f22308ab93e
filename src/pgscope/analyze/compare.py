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
