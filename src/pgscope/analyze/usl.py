"""Scalability models: the Universal Scalability Law, Amdahl's law and linear scaling.

    USL     X(N) = λN / (1 + σ(N−1) + κN(N−1))    σ: contention, κ: coherency (crosstalk)
    Amdahl  X(N) = λN / (1 + σ(N−1))              (USL with κ = 0)
    linear  X(N) = λN

Fits are least squares on throughput with σ, κ ≥ 0 (scipy's trust-region reflective method).
An unbounded fit is made too: σ < 0 there is the superlinear artefact (e.g. caches warming as
N grows), which the bounded fit hides, so we warn about it. Confidence intervals come from a
case-resampling bootstrap (observations drawn with replacement, the model refitted each time,
percentile intervals). The models are compared by AIC; the lowest wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pgscope.errors import InputFileError
from pgscope.words import plain

MIN_POINTS_FOR_CONFIDENCE = 6  # distinct client counts below which we warn
BOOTSTRAP_DRAWS = 500
BOUND_EPS = 1e-12  # σ or κ below this is at its bound of 0

Array = NDArray[np.float64]


def usl(n: Array | float, lam: float, sigma: float, kappa: float) -> Any:
    n = np.asarray(n, dtype=float)
    return lam * n / (1 + sigma * (n - 1) + kappa * n * (n - 1))


def peak(sigma: float, kappa: float) -> float | None:
    """N* = sqrt((1−σ)/κ): where USL throughput peaks; None when it never does."""
    if kappa <= 0 or sigma >= 1:
        return None
    return math.sqrt((1 - sigma) / kappa)


@dataclass(frozen=True)
class ModelFit:
    name: str  # "usl", "amdahl", "linear"
    params: dict[str, float]
    rss: float
    aic: float
    r_squared: float

    def to_json(self) -> dict[str, Any]:
        return {
            "params": self.params,
            "rss": self.rss,
            "aic": self.aic,
            "r_squared": self.r_squared,
        }


@dataclass
class UslFit:
    lam: float
    sigma: float
    kappa: float
    n_star: float | None
    x_max: float | None  # X(N*), or the asymptote λ/σ when there is no peak
    r_squared: float
    points: int
    distinct_clients: int
    max_clients: float
    models: dict[str, ModelFit]
    best_model: str
    unbounded: dict[str, float]
    bounds_active: list[str]
    ci: dict[str, tuple[float, float] | None]
    ci_method: str
    warnings: list[str] = field(default_factory=list)
    # Bootstrap parameter draws (λ, σ, κ), for confidence bands; a run's analysis keeps the
    # band it drew (scaling.FitCurve) and drops them.
    draws: list[tuple[float, float, float]] | None = None

    def predict(self, n: Array | float) -> Any:
        return usl(n, self.lam, self.sigma, self.kappa)

    def band(self, n: Array, level: float = 0.95) -> tuple[Array, Array] | None:
        """Pointwise bootstrap confidence band of the fitted curve."""
        if self.draws is None or len(self.draws) < 20:
            return None
        curves = np.array([usl(n, *d) for d in self.draws])
        lo, hi = np.percentile(curves, [50 * (1 - level), 50 * (1 + level)], axis=0)
        return lo, hi

    def describe(self) -> str:
        """The model in words, for the console summary. When AIC prefers a simpler model, the
        words say so rather than assert a peak the data do not support."""
        chosen = self.models[self.best_model].params
        params = (
            ", ".join(
                f"{symbol}={_g(chosen[key])}"
                for key, symbol in (("sigma", "σ"), ("kappa", "κ"))
                if key in chosen
            )
            + f"{', ' if len(chosen) > 1 else ''}λ={plain(chosen['lambda'])} tps per client"
        )
        if self.best_model == "linear":
            linear_r2 = self.models["linear"].r_squared
            if linear_r2 >= 0.9:
                text = "scales linearly over the measured range"
            else:
                text = (
                    "no model fits well: AIC prefers the linear model but it explains little; "
                    "the points are too few or too irregular for the USL's terms; add client "
                    "counts or repeats"
                )
        elif self.best_model == "amdahl" or self.n_star is None:
            amdahl = self.models["amdahl"].params
            if amdahl["sigma"] >= 1:
                # Amdahl's σ is a serial share only up to 1; beyond it X(N) falls from the
                # first client on, and "131% serialised" would be a number without a meaning.
                text = (
                    "throughput does not grow with clients: from the first, each added client "
                    "costs more than it brings (Amdahl σ ≥ 1, wholly serialised and worse); "
                    "the most was measured at the fewest clients"
                )
            elif amdahl["sigma"] > 0:
                text = (
                    f"contention-limited (Amdahl): {amdahl['sigma']:.1%} serialised, "
                    f"throughput approaches λ/σ≈{amdahl['lambda'] / amdahl['sigma']:,.0f} tps"
                )
            else:
                text = "scales linearly over the measured range"
        elif self.n_star > 2 * self.max_clients:
            text = (
                f"still scaling over the measured range: the model's peak "
                f"(N*≈{self.n_star:.0f}) is an extrapolation; measure more clients"
            )
        else:
            # Which term slows each client more at the peak: queueing for a shared resource
            # (σ) or the cost of keeping shared data coherent (κ)?
            contention = self.sigma * (self.n_star - 1)
            coherency = self.kappa * self.n_star * (self.n_star - 1)
            major = "contention (σ)" if contention >= coherency else "coherency (κ)"
            text = (
                f"throughput peaks at N*≈{self.n_star:.1f} clients "
                f"(≈{self.x_max or 0:,.0f} tps) and falls beyond it; {major} dominates there"
            )
        goodness = goodness_of_fit(self.models[self.best_model].r_squared)
        return f"{text} ({self.best_model}: {params}; {goodness})"

    def to_json(self) -> dict[str, Any]:
        return {
            "lambda": self.lam,
            "sigma": self.sigma,
            "kappa": self.kappa,
            "n_star": self.n_star,
            "x_max": self.x_max,
            "r_squared": self.r_squared,
            "points": self.points,
            "distinct_clients": self.distinct_clients,
            "ci95": {k: list(v) if v else None for k, v in self.ci.items()},
            "ci_method": self.ci_method,
            "best_model": self.best_model,
            "models": {k: m.to_json() for k, m in self.models.items()},
            "unbounded": self.unbounded,
            "bounds_active": self.bounds_active,
            "summary": self.describe(),
            "warnings": self.warnings,
        }


# Below this share of the variance explained, a fit's σ, κ and N* describe the model more than
# the measurements: said beside it wherever it is shown.
POOR_FIT_R2 = 0.8


def goodness_of_fit(r_squared: float) -> str:
    """R² as shown beside a fit: "R²=0.97", or "R²=0.55, poor fit"."""
    return f"R²={r_squared:.2f}" + (", poor fit" if r_squared < POOR_FIT_R2 else "")


def _g(value: float) -> str:
    return plain(value)


def _aic(rss: float, n: int, k: int) -> float:
    # Gaussian errors; k fitted parameters plus the error variance.
    return n * math.log(max(rss, 1e-300) / n) + 2 * (k + 1)


def _fit_usl_params(
    n: Array,
    x: Array,
    *,
    bounded: bool,
    amdahl: bool = False,
    starts: tuple[Array, ...] | None = None,
    tol: float = 1e-12,
) -> Array:
    """Least squares for (λ, σ, κ). Several starting points guard against local minima;
    bootstrap refits pass the full fit as their single start, and a looser `tol`: their
    percentiles need 4 digits, not 12."""
    from scipy.optimize import least_squares  # imported on first fit: it is slow to load

    lower = [0.0, 0.0, 0.0] if bounded else [0.0, -np.inf, -np.inf]
    upper = [np.inf, np.inf, np.inf]
    free = [0, 1] if amdahl else [0, 1, 2]

    def full(p: Array) -> tuple[float, float, float]:
        return float(p[0]), float(p[1]), 0.0 if amdahl else float(p[2])

    def residuals(p: Array) -> Array:
        return np.asarray(usl(n, *full(p)) - x, dtype=float)

    def jacobian(p: Array) -> Array:
        lam, sigma, kappa = full(p)
        d = 1 + sigma * (n - 1) + kappa * n * (n - 1)
        cols = [n / d, -lam * n * (n - 1) / d**2, -lam * n * n * (n - 1) / d**2]
        return np.column_stack([cols[i] for i in free])

    if starts is None:
        lam0 = float(np.max(x[n == n.min()] / n.min()))
        starts = tuple(
            np.array([lam0, s0, k0])
            for s0, k0 in ((0.01, 1e-4), (0.1, 1e-3), (0.001, 1e-6), (0.3, 1e-2))
        )
    best = None
    for start in starts:
        x0 = np.clip(np.asarray(start, dtype=float)[free], [lower[i] for i in free], None)
        try:
            result = least_squares(
                residuals,
                x0,
                jac=jacobian,
                bounds=([lower[i] for i in free], [upper[i] for i in free]),
                x_scale="jac",
                ftol=tol,
                xtol=tol,
                gtol=tol,
                max_nfev=5000,
            )
        except ValueError:
            continue
        if best is None or result.cost < best.cost:
            best = result
    if best is None:
        raise ValueError("the USL fit did not converge")
    params = np.array(full(best.x), dtype=float)
    if bounded:
        # At the bound the optimiser stops a hair above it (1e-18): that is 0, not a tiny κ
        # with a peak at N = 10^9.
        params[1:][params[1:] < BOUND_EPS] = 0.0
    return params


def _rss(n: Array, x: Array, params: Array) -> float:
    return float(np.sum((usl(n, *params) - x) ** 2))


def fit_usl(
    clients: list[float],
    throughput: list[float],
    *,
    bootstrap: int = BOOTSTRAP_DRAWS,
    seed: int = 0,
) -> UslFit:
    """Fit USL, Amdahl and linear models to (clients, throughput) observations.

    Repeated client counts are separate observations (that is how repeats enter the fit).
    """
    n = np.asarray(clients, dtype=float)
    x = np.asarray(throughput, dtype=float)
    if len(n) != len(x):
        raise ValueError("clients and throughput differ in length")
    ok = np.isfinite(n) & np.isfinite(x)
    n, x = n[ok], x[ok]
    distinct = len(np.unique(n))
    if distinct < 3:
        raise InputFileError(f"a USL fit needs at least 3 distinct client counts; got {distinct}")
    if np.any(n < 1) or np.any(x < 0):
        raise InputFileError("client counts must be >= 1 and throughput >= 0")

    params = _fit_usl_params(n, x, bounded=True)
    lam, sigma, kappa = (float(v) for v in params)
    free = _fit_usl_params(n, x, bounded=False)
    amdahl = _fit_usl_params(n, x, bounded=True, amdahl=True)
    lam_linear = float(np.sum(x * n) / np.sum(n * n))
    count = len(n)
    tss = float(np.sum((x - x.mean()) ** 2))

    def model(name: str, k: int, fitted: dict[str, float], rss: float) -> ModelFit:
        r2 = 1 - rss / tss if tss > 0 else 1.0
        return ModelFit(name, fitted, rss, _aic(rss, count, k), r2)

    models = {
        "usl": model("usl", 3, {"lambda": lam, "sigma": sigma, "kappa": kappa}, _rss(n, x, params)),
        "amdahl": model(
            "amdahl", 2, {"lambda": float(amdahl[0]), "sigma": float(amdahl[1])}, _rss(n, x, amdahl)
        ),
        "linear": model(
            "linear", 1, {"lambda": lam_linear}, float(np.sum((lam_linear * n - x) ** 2))
        ),
    }
    best_model = min(models, key=lambda name: models[name].aic)

    n_star = peak(sigma, kappa)
    if n_star is not None:
        x_max: float | None = float(usl(n_star, lam, sigma, kappa))
    else:
        x_max = lam / sigma if sigma > 0 else None
    r_squared = models["usl"].r_squared

    warnings: list[str] = []
    if distinct < MIN_POINTS_FOR_CONFIDENCE:
        warnings.append(
            f"only {distinct} distinct client counts (fewer than "
            f"{MIN_POINTS_FOR_CONFIDENCE}): the fit is weakly constrained"
        )
    if n_star is not None and n_star > 2 * n.max():
        warnings.append(
            f"N*≈{n_star:.0f} is beyond 2× the largest measured N ({n.max():.0f}): "
            f"the peak is an extrapolation"
        )
    if free[1] < 0:
        warnings.append(
            f"superlinear artefact: the unbounded fit gives σ={plain(free[1])} < 0: throughput "
            f"per client grows with N, so the low-N points are held back by something else "
            f"(e.g. wake-up latency of idle CPUs, common in VMs, or caches warming up); "
            f"σ is held at 0"
        )
    bounds_active = [name for name, value in (("sigma", sigma), ("kappa", kappa)) if value == 0]

    draws, ci = _bootstrap(n, x, params, bootstrap, seed)
    method = (
        f"bootstrap: {bootstrap} case resamples, percentile intervals"
        if draws is not None
        else "none (too few observations to resample)"
    )
    if draws is not None and len(draws) < 0.9 * bootstrap:
        warnings.append(f"only {len(draws)} of {bootstrap} bootstrap refits succeeded")
    return UslFit(
        lam,
        sigma,
        kappa,
        n_star,
        x_max,
        r_squared,
        count,
        distinct,
        float(n.max()),
        models,
        best_model,
        {"lambda": float(free[0]), "sigma": float(free[1]), "kappa": float(free[2])},
        bounds_active,
        ci,
        method,
        warnings,
        None if draws is None else [(float(a), float(b), float(c)) for a, b, c in draws],
    )


BOOTSTRAP_TOL = 1e-8


def _bootstrap(
    n: Array, x: Array, fitted: Array, draws_wanted: int, seed: int
) -> tuple[Array | None, dict[str, tuple[float, float] | None]]:
    empty: dict[str, tuple[float, float] | None] = dict.fromkeys(
        ("lambda", "sigma", "kappa", "n_star", "x_max")
    )
    if draws_wanted <= 0 or len(n) < 4:
        return None, empty
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(draws_wanted):
        idx = rng.integers(0, len(n), len(n))
        if len(np.unique(n[idx])) < 3:
            continue
        try:
            draws.append(
                _fit_usl_params(n[idx], x[idx], bounded=True, starts=(fitted,), tol=BOOTSTRAP_TOL)
            )
        except ValueError:
            continue
    if len(draws) < 20:
        return None, empty
    arr = np.array(draws)
    n_stars = np.array([peak(s, k) or np.inf for _, s, k in arr])
    x_maxes = np.array(
        [
            usl(ns, lam, s, k) if np.isfinite(ns) else np.nan
            for (lam, s, k), ns in zip(arr, n_stars, strict=True)
        ]
    )

    def interval(values: Array) -> tuple[float, float] | None:
        values = values[np.isfinite(values)]
        if len(values) < 0.5 * len(arr):  # most resamples have no peak: no honest interval
            return None
        lo, hi = np.percentile(values, [2.5, 97.5])
        return float(lo), float(hi)

    return arr, {
        "lambda": interval(arr[:, 0]),
        "sigma": interval(arr[:, 1]),
        "kappa": interval(arr[:, 2]),
        "n_star": interval(n_stars),
        "x_max": interval(x_maxes),
    }
