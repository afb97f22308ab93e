"""Scalability analysis of a run: per-cell statistics over repeats and a USL fit per variant.

A pure function of the store's rows: nothing here talks to a server.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from pgscope.analyze.usl import UslFit, fit_usl
from pgscope.errors import InputFileError


@dataclass(frozen=True)
class Cell:
    """All repeats of one (variant, clients) pair."""

    variant: str
    clients: int
    repeats: int  # successful repeats
    failed_steps: int
    tps_mean: float | None
    tps_ci95: tuple[float, float] | None  # Student t interval of the mean; needs >= 2 repeats
    tps_cv: float | None  # coefficient of variation between repeats
    p50_ms: float | None  # latency percentiles: mean over repeats of each repeat's value
    p95_ms: float | None
    p99_ms: float | None
    errored_steps: int = 0  # steps whose workload's transactions errored (status "errors")
    # An open-loop cell (capacity.RateCell.as_cell): the rate offered; tps is what the server
    # completed of it. None: a closed-loop cell, the only kind `summarise` makes.
    rate: float | None = None


@dataclass(frozen=True)
class FitCurve:
    """A fitted USL curve over the measured range (and a little past it, or to a peak
    within twice the largest N), with its pointwise 95% bootstrap band where there is one."""

    clients: list[float]
    tps: list[float]
    low: list[float] | None
    high: list[float] | None


@dataclass
class ScalingAnalysis:
    cells: list[Cell]
    fits: dict[str, UslFit]
    fit_errors: dict[str, str] = field(default_factory=dict)
    curves: dict[str, FitCurve] = field(default_factory=dict)

    def variants(self) -> list[str]:
        return list(dict.fromkeys(c.variant for c in self.cells))


def mean_ci95(values: list[float]) -> tuple[float, float] | None:
    """Student-t 95% interval of the mean, truncated at 0 (throughput is never negative)."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    sem = statistics.stdev(values) / math.sqrt(len(values))
    from scipy import stats  # seconds to import on a busy host: only when a CI is needed

    half = float(stats.t.ppf(0.975, len(values) - 1)) * sem
    return max(0.0, mean - half), mean + half


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def summarise(steps: list[dict[str, Any]], variant_order: list[str] | None = None) -> list[Cell]:
    """One cell per (variant, clients) of the closed-loop steps, in the spec's order of
    variants (the steps ran in a random one). Open-loop steps (a rate) are capacity.py's."""
    steps = [s for s in steps if s.get("rate") is None]
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for step in steps:
        groups[(step["variant"], step["clients"])].append(step)
    cells = []
    for (variant, clients), group in groups.items():
        good = [s for s in group if s["status"] == "ok" and s["tps"] is not None]
        tps = [float(s["tps"]) for s in good]
        mean = statistics.fmean(tps) if tps else None
        cv = statistics.stdev(tps) / mean if len(tps) >= 2 and mean else None
        cells.append(
            Cell(
                variant,
                clients,
                len(good),
                sum(1 for s in group if s["status"] == "failed"),
                mean,
                mean_ci95(tps),
                cv,
                _mean([s["p50_ms"] for s in good]),
                _mean([s["p95_ms"] for s in good]),
                _mean([s["p99_ms"] for s in good]),
                sum(1 for s in group if s["status"] == "errors"),
            )
        )
    names = list(dict.fromkeys([*(variant_order or []), *(s["variant"] for s in steps)]))
    order = {v: i for i, v in enumerate(names)}
    return sorted(cells, key=lambda c: (order[c.variant], c.clients))


def analyse(
    steps: list[dict[str, Any]], *, bootstrap: int = 500, variant_order: list[str] | None = None
) -> ScalingAnalysis:
    """Cells, and a USL fit per variant over every successful repeat."""
    cells = summarise(steps, variant_order)
    fits: dict[str, UslFit] = {}
    errors: dict[str, str] = {}
    for variant in dict.fromkeys(c.variant for c in cells):
        good = [
            s
            for s in steps
            if s["variant"] == variant
            and s["status"] == "ok"
            and s["tps"] is not None
            and s.get("rate") is None
        ]
        try:
            fits[variant] = fit_usl(
                [s["clients"] for s in good], [s["tps"] for s in good], bootstrap=bootstrap
            )
        except (InputFileError, ValueError) as exc:
            errors[variant] = str(exc)
    curves = {
        variant: fit_curve(fit, max(c.clients for c in cells if c.variant == variant))
        for variant, fit in fits.items()
    }
    return ScalingAnalysis(cells, fits, errors, curves)


def fit_curve(fit: UslFit, top: int, points: int = 120) -> FitCurve:
    import numpy as np

    peak = fit.n_star or 0.0
    n = np.linspace(1, max(top * 1.25, peak if peak < 2 * top else top), points)
    band = fit.band(n)
    return FitCurve(
        n.tolist(),
        [float(v) for v in fit.predict(n)],
        None if band is None else band[0].tolist(),
        None if band is None else band[1].tolist(),
    )
