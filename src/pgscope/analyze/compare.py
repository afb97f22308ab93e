"""Variants side by side: each against a baseline, with an honest interval.

For every client count measured in both, the change of a variant's mean tps against the
baseline's, with a 95% interval of the ratio of the two means (repeats of each are the
observations). The interval is computed on the log scale (the delta method, Welch's degrees
of freedom), so that it respects what a ratio is: never below 0, a change never below -100%
(a collapse from 25,926 to 137 tps with 2 repeats each read "-603.8% … +404.8%" as a
difference of means). A change is called significant only when that interval excludes zero;
where it does not and it cannot even rule out a halving or a doubling, the repeats are too
few to judge, which is not "within noise". Pure function of the steps' rows.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

# An interval that reaches a halving or a doubling (ratio 1/2 or 2) and still holds no change
# says nothing about the change: too few repeats to judge, not "within noise".
UNINFORMATIVE_RATIO = 2.0
BEYOND_NOISE = "beyond noise"
WITHIN_NOISE = "within noise"
TOO_FEW = "too few repeats to judge"


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

    @property
    def judgement(self) -> str:
        """What the interval says of the change, in the words every renderer shows."""
        return judgement(self.ci95_pct)

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
            "judgement": self.judgement,
        }


def judgement(ci95_pct: tuple[float, float] | list[float] | None) -> str:
    """ "beyond noise" (the interval excludes no change), "within noise" (it holds no change
    and is narrow enough to rule out a halving and a doubling), else "too few repeats to
    judge" (no interval, or one that holds no change and a halving or a doubling alike)."""
    if ci95_pct is None:
        return TOO_FEW
    low, high = ci95_pct
    if low > 0 or high < 0:
        return BEYOND_NOISE
    if 1 + low / 100 <= 1 / UNINFORMATIVE_RATIO or 1 + high / 100 >= UNINFORMATIVE_RATIO:
        return TOO_FEW
    return WITHIN_NOISE


def change_interval(values: list[float], reference: list[float]) -> tuple[float, float] | None:
    """95% interval of the change of mean(values) against mean(reference), in percent: the
    ratio of the means on the log scale, its variance by the delta method (var / (n mean²) of
    each side), Student's t at Welch's degrees of freedom; back on the ratio scale it is never
    below -100%. None with fewer than 2 repeats a side, or a reference mean of 0."""
    if len(values) < 2 or len(reference) < 2:
        return None
    mean, base = statistics.fmean(values), statistics.fmean(reference)
    if base <= 0 or mean < 0:
        return None
    if mean == 0:
        # Every repeat measured nothing: the change is -100%, whatever the reference's spread.
        return (-100.0, -100.0) if max(values) == 0 else None
    from scipy import stats  # slow to import; only when there is something to compare

    va = statistics.variance(values) / (len(values) * mean**2)
    vb = statistics.variance(reference) / (len(reference) * base**2)
    log_ratio = math.log(mean / base)
    if va + vb == 0:
        exact = (math.exp(log_ratio) - 1) * 100
        return exact, exact
    dof = (va + vb) ** 2 / (va**2 / (len(values) - 1) + vb**2 / (len(reference) - 1))
    half = float(stats.t.ppf(0.975, dof)) * math.sqrt(va + vb)
    return (
        (math.exp(log_ratio - half) - 1) * 100,
        (math.exp(log_ratio + half) - 1) * 100,
    )


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
            if base_mean == 0:
                continue  # no change can be stated against nothing
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
                    change_interval(values, reference),
                )
            )
    return out
