"""Open loop: latency against the offered rate, the knee, and the capacity at an objective.

A closed-loop step (every sweep step) has each client send its next transaction when the last
returns: when the server slows down, the load slows with it, and the transactions that would
have waited are never sent. Their wait is missing from the latency measured (coordinated
omission). An open-loop step (pgbench -R) schedules transactions at the offered rate whether
or not the last returned, and counts latency from each one's scheduled start: the wait for a
free client (the schedule lag) is part of it, as it is for a service's users.

Per cell (a variant's rate, all repeats): the rate achieved, latency percentiles, lag, the
service time (latency less the lag: what a closed loop would see), skipped and late
transactions, how fast latency grew over the window, and each objective. Per variant:

- the knee: the server kept up with a rate when it completed at least 98% of it (KEPT_UP);
  the knee lies between the highest rate kept up with and the lowest one not. Beyond it the
  backlog grows for as long as the rate lasts, and what the server completes there is its
  saturation throughput, measured (mean and 95% interval over those steps) and predicted: the
  closed-loop USL fit at the clients driving the rates (by Little's law, N clients never idle
  complete N/R(N), the closed loop's throughput at N);
- the capacity at each objective (p99<5ms): per repeat, the rate at which the share of
  transactions above the threshold (skipped ones counted above: they were already too late)
  crosses 1 - the quantile, interpolated (in the logarithm of that share) between the highest
  rate meeting it and the next rate, missing it; then the mean over repeats with its Student-t
  95% interval. The highest rate met, not the first miss: the wait for a turn only grows with
  the rate, so a miss below a rate met is a stall of the host, said but not the capacity.

A pure function of the store's rows: nothing here talks to a server.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pgscope.analyze.scaling import Cell, ScalingAnalysis, mean_ci95
from pgscope.words import n_clients

KEPT_UP = 0.98  # achieved at least this share of the offered rate: the server kept up
# Little's law: a pool this busy had no client free for a transaction's turn.
POOL_BUSY = 0.9
# A pool busy less than this leaves a transaction's start late only when pgbench itself woke
# late; a p99 lag of this much is worth saying (a quiet host's is tens of microseconds).
IDLE_POOL = 0.3
OWN_LAG_MS = 1.0
SKIPPING = 0.05  # a share of skipped transactions beyond the knee that lowers its throughput


@dataclass(frozen=True)
class ObjectiveResult:
    """One objective over one step's measured window."""

    name: str  # p99<5ms
    quantile: float
    threshold_ms: float
    above: int  # transactions above the threshold, skipped ones included
    scheduled: int  # those that succeeded or were skipped
    latency_ms: float | None  # the quantile from the scheduled start; None: among the skipped

    @property
    def above_share(self) -> float:
        return self.above / self.scheduled if self.scheduled else 0.0

    @property
    def met(self) -> bool:
        return self.scheduled > 0 and self.above_share <= 1 - self.quantile + 1e-12


@dataclass(frozen=True)
class Schedule:
    """An open-loop step's schedule, over its measured window."""

    rate_share: float | None  # the share of the sweep's peak the rate was given as
    latency_limit_ms: float | None  # pgbench --latency-limit
    lag_mean_ms: float | None  # the wait for a free client, from the scheduled start
    lag_p99_ms: float | None
    lag_max_ms: float | None
    service_p50_ms: float | None  # latency less the lag: what a closed loop measures
    service_p99_ms: float | None
    skipped: int | None  # never sent: later than the limit when their turn came
    late: int | None  # completed later than the limit
    objectives: list[ObjectiveResult] = field(default_factory=list)
    served_tps: float | None = None  # the rate achieved: due in the window, and served


@dataclass(frozen=True)
class CellObjective:
    """One objective over a rate cell's repeats, pooled."""

    name: str
    above_share: float  # of every repeat's scheduled transactions
    met: bool
    latency_ms: float | None  # mean of the repeats' quantiles (None: any among the skipped)


@dataclass(frozen=True)
class RateCell:
    """All repeats of one variant at one offered rate."""

    variant: str
    clients: int
    rate: float  # offered, tps
    share_of_peak: float | None
    repeats: int  # steps with a measured window
    failed_steps: int
    # The rate achieved: the offered transactions due in each step's window and served by its
    # end, per second; mean over repeats (a step's throughput, its `tps`, also counts a
    # backlog from before its window draining inside it)
    achieved_tps: float | None
    achieved_ci95: tuple[float, float] | None
    achieved_share: float | None  # achieved / offered
    kept_up: bool | None  # achieved at least KEPT_UP of the rate
    p50_ms: float | None  # from the scheduled start, means over repeats
    p95_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    max_ms: float | None
    lag_mean_ms: float | None
    lag_p99_ms: float | None
    service_p50_ms: float | None
    service_p99_ms: float | None
    skipped_share: float | None  # of the transactions scheduled
    late_share: float | None  # of those that completed
    growth_ms_per_s: float | None  # the median latency's rise per second of the window
    pool_busy: float | None  # Little's law: achieved × mean service time / clients
    objectives: list[CellObjective] = field(default_factory=list)

    def as_cell(self) -> Cell:
        """The cell as the facts read a closed-loop one: tps is what it achieved."""
        return Cell(
            self.variant,
            self.clients,
            self.repeats,
            self.failed_steps,
            self.achieved_tps,
            self.achieved_ci95,
            None,
            self.p50_ms,
            self.p95_ms,
            self.p99_ms,
            rate=self.rate,
        )


@dataclass(frozen=True)
class Closed:
    """The closed-loop cell at the clients driving the rates: the same pool, never waiting
    for a schedule."""

    clients: int
    tps: float | None
    p99_ms: float | None
    growth_ms_per_s: float | None


@dataclass(frozen=True)
class Knee:
    kept_up_to: float | None  # the highest rate kept up with, below the first one not
    first_beyond: float | None  # the lowest rate not kept up with; None: all were
    saturated_tps: float | None  # mean throughput (completed per second) at and beyond it
    saturated_ci95: tuple[float, float] | None
    predicted_tps: float | None  # the USL fit at the rates' clients
    predicted_band: tuple[float, float] | None  # its bootstrap 95% band there
    growth_ms_per_s: float | None  # at the first rate beyond the knee
    closed: Closed | None


@dataclass(frozen=True)
class Capacity:
    """The highest rate meeting one objective, per repeat, and its mean and interval."""

    objective: str
    quantile: float
    threshold_ms: float
    tps: float | None  # mean over the repeats that bracket it
    ci95: tuple[float, float] | None  # Student-t over them (2 or more)
    per_repeat: list[float | None]  # None: below the lowest rate, or above the highest
    below: int  # repeats that met it at no rate
    above: int  # repeats whose highest rate met it
    lowest_rate: float
    highest_rate: float
    # Misses below a rate the same repeat met: queueing delay only grows with the rate, so
    # what made these late was not the rate (the host stalled); each with its rate.
    stalls: list[float] = field(default_factory=list)
    # What the server completed (tps) at the rates where the objective's latency held but
    # the server did not keep up (completed less than KEPT_UP of the rate): not met there, as
    # no capacity is claimed above a rate achieved (1e23 tps offered, 0% completed, was).
    unsustained: list[float] = field(default_factory=list)

    @property
    def said(self) -> str:
        """The capacity in words, with its interval and what it rests on."""
        repeats = [c for c in self.per_repeat if c is not None]
        if self.tps is None:
            if self.unsustained and not self.above:
                most = max(self.unsustained)
                return (
                    f"{self.objective} not measured at a rate the server kept up with: from "
                    f"{self.lowest_rate:,.0f} tps offered it completed at most {most:,.0f} tps "
                    f"({most / self.lowest_rate:.0%}), and nothing is claimed above that; "
                    f"offer lower rates"
                )
            if self.above and not self.below:
                return (
                    f"{self.objective} held up to the highest rate offered, "
                    f"{self.highest_rate:,.0f} tps: the capacity is beyond{self._stalls}"
                )
            return (
                f"{self.objective} was missed at every rate offered, from "
                f"{self.lowest_rate:,.0f} tps: the capacity is below it"
            )
        interval = (
            f" (95% CI {self.ci95[0]:,.0f}–{self.ci95[1]:,.0f} over {len(repeats)} repeats)"
            if self.ci95
            else f" (over {len(repeats)} repeat{'s' if len(repeats) != 1 else ''}: no interval)"
        )
        others = []
        if self.below:
            others.append(f"{self.below} missed it at every rate")
        if self.above:
            others.append(f"{self.above} met it up to the highest rate")
        rest = f"; of the other repeats, {', '.join(others)}" if others else ""
        return f"{self.tps:,.0f} tps while {self.objective}{interval}{rest}{self._stalls}"

    @property
    def _stalls(self) -> str:
        if not self.stalls:
            return ""
        rates = ", ".join(f"{r:,.0f}" for r in sorted(self.stalls))
        return (
            f"; missed {len(self.stalls)} time{'s' if len(self.stalls) != 1 else ''} at a rate "
            f"below one the same repeat met ({rates} tps): a stall of the host, not of the rate"
        )


@dataclass(frozen=True)
class VariantCapacity:
    variant: str
    clients: int  # the clients driving the rates
    peak_tps: float | None  # the sweep's highest cell mean (what shares of the peak are of)
    peak_clients: int | None
    cells: list[RateCell]  # rates ascending
    knee: Knee
    capacities: list[Capacity]
    said: list[str] = field(default_factory=list)  # what the run shows, in sentences


@dataclass(frozen=True)
class CapacityAnalysis:
    objectives: list[str]
    variants: list[VariantCapacity]

    def of(self, variant: str) -> VariantCapacity | None:
        return next((v for v in self.variants if v.variant == variant), None)


# ---------------------------------------------------------------------------------------------


def schedule_of(row: dict[str, Any], objectives: list[ObjectiveResult]) -> Schedule | None:
    """A step row's schedule (None: a closed-loop step)."""
    if row.get("rate") is None:
        return None
    return Schedule(
        row.get("rate_share"),
        row.get("latency_limit_ms"),
        row.get("lag_mean_ms"),
        row.get("lag_p99_ms"),
        row.get("lag_max_ms"),
        row.get("service_p50_ms"),
        row.get("service_p99_ms"),
        row.get("skipped"),
        row.get("late"),
        objectives,
        _served_tps(row),
    )


def _served_tps(row: dict[str, Any]) -> float | None:
    """The rate a step achieved: transactions due in its window that succeeded, per second
    of it (the store's `served`); its throughput where the store has none."""
    start, end, served = row.get("window_start_us"), row.get("window_end_us"), row.get("served")
    if served is None or start is None or end is None or end <= start:
        return float(row["tps"]) if row.get("tps") is not None else None
    return float(served) / (float(end - start) / 1e6)


def objective_results(rows: list[dict[str, Any]]) -> dict[int, list[ObjectiveResult]]:
    """The store's step_objectives rows by step id."""
    out: dict[int, list[ObjectiveResult]] = defaultdict(list)
    for r in rows:
        out[int(r["step_id"])].append(
            ObjectiveResult(
                str(r["objective"]),
                float(r["quantile"]),
                float(r["threshold_ms"]),
                int(r["above"]),
                int(r["scheduled"]),
                r["latency_ms"],
            )
        )
    return out


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _measured(row: dict[str, Any]) -> bool:
    return row["status"] == "ok" and row["tps"] is not None


def analyse(
    rows: list[dict[str, Any]],
    objectives: dict[int, list[ObjectiveResult]],
    growth: dict[int, float],
    scaling: ScalingAnalysis,
    names: list[str],
) -> CapacityAnalysis | None:
    """The open-loop steps' analysis (None: the run offered no rate). `rows` are the store's
    steps, `growth` each step's latency growth (ms per second), `scaling` the closed-loop
    sweep's (its fits with their bootstrap draws), `names` the spec's objectives."""
    rated = [r for r in rows if r.get("rate") is not None]
    if not rated:
        return None
    by_variant: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rated:
        by_variant[r["variant"]].append(r)
    order = {v: i for i, v in enumerate(scaling.variants())}
    closed = [r for r in rows if r.get("rate") is None and _measured(r)]
    variants = [
        _variant(v, own, closed, objectives, growth, scaling, names)
        for v, own in sorted(by_variant.items(), key=lambda kv: order.get(kv[0], len(order)))
    ]
    return CapacityAnalysis(names, variants)


def _variant(
    variant: str,
    rows: list[dict[str, Any]],
    closed_rows: list[dict[str, Any]],
    objectives: dict[int, list[ObjectiveResult]],
    growth: dict[int, float],
    scaling: ScalingAnalysis,
    names: list[str],
) -> VariantCapacity:
    groups: dict[tuple[int, float], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(int(r["clients"]), float(r["rate"]))].append(r)
    cells = sorted(
        (_cell(variant, n, rate, g, objectives, growth) for (n, rate), g in groups.items()),
        key=lambda c: (c.rate, c.clients),
    )
    closed_cells = [c for c in scaling.cells if c.variant == variant and c.tps_mean]
    best = max(closed_cells, key=lambda c: c.tps_mean or 0.0, default=None)
    measured = [r for r in rows if _measured(r)]
    clients = max(
        (int(r["clients"]) for r in measured), default=int(rows[0]["clients"]), key=lambda n: n
    )
    same_pool = [
        growth.get(r["step_id"])
        for r in closed_rows
        if r["variant"] == variant and r["clients"] == clients
    ]
    knee = _knee(cells, measured, _mean(same_pool), scaling, variant, clients)
    capacities = [_capacity(name, measured, objectives) for name in names]
    capacity = VariantCapacity(
        variant,
        clients,
        best.tps_mean if best else None,
        best.clients if best else None,
        cells,
        knee,
        [c for c in capacities if c is not None],
    )
    return dataclasses.replace(capacity, said=_said(capacity, closed_cells))


def _cell(
    variant: str,
    clients: int,
    rate: float,
    rows: list[dict[str, Any]],
    objectives: dict[int, list[ObjectiveResult]],
    growth: dict[int, float],
) -> RateCell:
    good = [r for r in rows if _measured(r)]
    tps = [v for r in good if (v := _served_tps(r)) is not None]
    achieved = statistics.fmean(tps) if tps else None
    scheduled = sum((r["succeeded"] or 0) + (r["skipped"] or 0) for r in good)
    completed = sum(r["succeeded"] or 0 for r in good)
    skipped = sum(r["skipped"] or 0 for r in good)
    late = [r["late"] for r in good if r["late"] is not None]
    service_mean = _mean(
        [
            r["latency_mean_ms"] - r["lag_mean_ms"]
            if r["latency_mean_ms"] is not None and r["lag_mean_ms"] is not None
            else None
            for r in good
        ]
    )
    pooled: list[CellObjective] = []
    names = list(dict.fromkeys(o.name for r in good for o in objectives.get(r["step_id"], [])))
    for name in names:
        found = [o for r in good for o in objectives.get(r["step_id"], []) if o.name == name]
        above, total = sum(o.above for o in found), sum(o.scheduled for o in found)
        share = above / total if total else 0.0
        latencies = [o.latency_ms for o in found]
        pooled.append(
            CellObjective(
                name,
                share,
                bool(total) and share <= 1 - found[0].quantile + 1e-12,
                None if any(v is None for v in latencies) else _mean(list(latencies)),
            )
        )
    return RateCell(
        variant=variant,
        clients=clients,
        rate=rate,
        share_of_peak=rows[0]["rate_share"],
        repeats=len(good),
        failed_steps=sum(1 for r in rows if r["status"] == "failed"),
        achieved_tps=achieved,
        achieved_ci95=mean_ci95(tps),
        achieved_share=achieved / rate if achieved is not None else None,
        kept_up=achieved / rate >= KEPT_UP if achieved is not None else None,
        p50_ms=_mean([r["p50_ms"] for r in good]),
        p95_ms=_mean([r["p95_ms"] for r in good]),
        p99_ms=_mean([r["p99_ms"] for r in good]),
        p999_ms=_mean([r["p999_ms"] for r in good]),
        max_ms=_mean([r["max_ms"] for r in good]),
        lag_mean_ms=_mean([r["lag_mean_ms"] for r in good]),
        lag_p99_ms=_mean([r["lag_p99_ms"] for r in good]),
        service_p50_ms=_mean([r["service_p50_ms"] for r in good]),
        service_p99_ms=_mean([r["service_p99_ms"] for r in good]),
        skipped_share=skipped / scheduled if scheduled else None,
        late_share=sum(late) / completed if late and completed else None,
        growth_ms_per_s=_mean([growth.get(r["step_id"]) for r in good]),
        pool_busy=(
            achieved * service_mean / 1000 / clients
            if achieved is not None and service_mean is not None
            else None
        ),
        objectives=pooled,
    )


def _knee(
    cells: list[RateCell],
    measured: list[dict[str, Any]],
    closed_growth: float | None,
    scaling: ScalingAnalysis,
    variant: str,
    clients: int,
) -> Knee:
    judged = [c for c in cells if c.kept_up is not None]
    beyond = next((c for c in judged if not c.kept_up), None)
    kept = [c for c in judged if c.kept_up and (beyond is None or c.rate < beyond.rate)]
    saturated = [
        float(r["tps"]) for r in measured if beyond is not None and float(r["rate"]) >= beyond.rate
    ]
    fit = scaling.fits.get(variant)
    predicted, band = None, None
    if fit is not None:
        predicted = float(fit.predict(float(clients)))
        drawn = fit.band(np.array([float(clients)]))
        band = (float(drawn[0][0]), float(drawn[1][0])) if drawn is not None else None
    closed_cell = next(
        (c for c in scaling.cells if c.variant == variant and c.clients == clients), None
    )
    closed = None
    if closed_cell is not None:
        closed = Closed(clients, closed_cell.tps_mean, closed_cell.p99_ms, closed_growth)
    return Knee(
        kept[-1].rate if kept else None,
        beyond.rate if beyond else None,
        statistics.fmean(saturated) if saturated else None,
        mean_ci95(saturated),
        predicted,
        band,
        beyond.growth_ms_per_s if beyond else None,
        closed,
    )


def _capacity(
    name: str, rows: list[dict[str, Any]], objectives: dict[int, list[ObjectiveResult]]
) -> Capacity | None:
    by_repeat: dict[int, list[tuple[float, ObjectiveResult]]] = defaultdict(list)
    # What each step completed: a rate the server fell short of is not a rate it met an
    # objective at, whatever the latency of the transactions it did complete.
    completed: dict[tuple[int, float], float | None] = {}
    for r in rows:
        found = next((o for o in objectives.get(r["step_id"], []) if o.name == name), None)
        if found is not None and found.scheduled:
            by_repeat[int(r["repeat"])].append((float(r["rate"]), found))
            completed[(int(r["repeat"]), float(r["rate"]))] = _served_tps(r)
    if not by_repeat:
        return None
    first = next(iter(by_repeat.values()))[0][1]
    per_repeat: list[float | None] = []
    stalls: list[float] = []
    unsustained: list[float] = []
    below = above = 0
    rates = sorted({rate for points in by_repeat.values() for rate, _ in points})
    for repeat in sorted(by_repeat):
        points = sorted(by_repeat[repeat], key=lambda p: p[0])

        def kept(rate: float, repeat: int = repeat) -> bool:
            done = completed[(repeat, rate)]
            return done is None or done >= KEPT_UP * rate

        unsustained += [
            done
            for rate, o in points
            if o.met and not kept(rate) and (done := completed[(repeat, rate)]) is not None
        ]
        # The highest rate met, and the miss above it, bracket the crossing; a miss below
        # a rate met came from something other than the rate (see Capacity.stalls).
        last = max((i for i, (rate, o) in enumerate(points) if o.met and kept(rate)), default=None)
        if last is None:
            below += 1
            per_repeat.append(None)
            continue
        stalls += [rate for rate, o in points[:last] if not o.met]
        if last == len(points) - 1:
            above += 1
            per_repeat.append(None)
        else:
            crossing = _crossing(points[last], points[last + 1])
            missed_rate = points[last + 1][0]
            done = completed[(repeat, missed_rate)]
            if points[last + 1][1].met and done is not None:
                # Missed only for not keeping up: the crossing lies no higher than what
                # the server completed there (and no lower than the rate it met).
                crossing = max(points[last][0], min(crossing, done))
            per_repeat.append(crossing)
    estimates = [c for c in per_repeat if c is not None]
    return Capacity(
        name,
        first.quantile,
        first.threshold_ms,
        statistics.fmean(estimates) if estimates else None,
        mean_ci95(estimates),
        per_repeat,
        below,
        above,
        rates[0],
        rates[-1],
        stalls,
        unsustained,
    )


def _crossing(met: tuple[float, ObjectiveResult], missed: tuple[float, ObjectiveResult]) -> float:
    """The rate between two where the share above the threshold reaches 1 - quantile,
    linear in the logarithm of that share (a share of 0 counts as half a transaction)."""
    (r1, o1), (r2, o2) = met, missed
    target = 1 - o1.quantile
    v1 = max(o1.above_share, 0.5 / max(o1.scheduled, 1))
    v2 = max(o2.above_share, v1 * (1 + 1e-9))
    if v1 >= target:  # met at the edge: the crossing is there
        return r1
    t = (math.log(target) - math.log(v1)) / (math.log(v2) - math.log(v1))
    return r1 + min(1.0, max(0.0, t)) * (r2 - r1)


def _said(capacity: VariantCapacity, closed_cells: list[Cell]) -> list[str]:
    """What the open-loop steps show, in sentences: where the knee is and what latency does
    beyond it against the closed loop at the same clients; the prediction against the
    measurement; rates the clients could not sustain."""
    knee, said = capacity.knee, []
    cells = capacity.cells
    who = n_clients(capacity.clients)
    if not cells or all(c.kept_up is None for c in cells):
        return ["No open-loop step measured a throughput."]
    beyond = next((c for c in cells if c.rate == knee.first_beyond), None)
    if beyond is None:
        top = max(c.rate for c in cells)
        said.append(
            f"The server kept up with every rate offered, up to {top:,.0f} tps ({who}): the "
            f"knee lies beyond."
        )
    else:
        kept = next((c for c in cells if c.rate == knee.kept_up_to), None)
        below = (
            f"kept up with {kept.rate:,.0f} tps (completed {_share(kept.achieved_share)} of it)"
            if kept is not None
            else "kept up with none of the rates offered"
        )
        said.append(
            f"The knee: the server {below}, not with {beyond.rate:,.0f} tps (completed "
            f"{_share(beyond.achieved_share)})."
        )
        # The most overloaded rate shows the backlog best: it grows for as long as the rate
        # lasts, and each second adds to every later transaction's wait.
        worst = max((c for c in cells if c.rate >= beyond.rate), key=lambda c: c.rate)
        grew = (
            f"latency from the scheduled start grew {worst.growth_ms_per_s:,.1f} ms every "
            f"second of the step, to p99 {_ms(worst.p99_ms)}"
            if worst.growth_ms_per_s is not None and worst.growth_ms_per_s > 0
            else f"latency from the scheduled start reached p99 {_ms(worst.p99_ms)}"
        )
        said.append(
            f"Beyond it the backlog grows as long as the rate lasts: offered "
            f"{worst.rate:,.0f} tps, the server completed {_tps(worst.achieved_tps)} "
            f"({_share(worst.achieved_share)}) and {grew}."
        )
        closed = knee.closed
        if closed is not None and closed.tps:
            steady = (
                f", its median moving {abs(closed.growth_ms_per_s):.2f} ms a second"
                if closed.growth_ms_per_s is not None
                else ""
            )
            said.append(
                f"Closed loop at the same {who}, latency stayed at p99 {_ms(closed.p99_ms)}"
                f"{steady}, while completing {closed.tps:,.0f} tps: each client waits for its "
                f"last transaction, so the load slows down with the server and the queue its "
                f"users would meet is never measured (coordinated omission)."
            )
    if knee.predicted_tps is not None:
        band = (
            f" (95% band {knee.predicted_band[0]:,.0f}–{knee.predicted_band[1]:,.0f})"
            if knee.predicted_band
            else ""
        )
        measured = (
            f"; measured: {knee.saturated_tps:,.0f} tps completed beyond the knee"
            + (
                f" (95% CI {knee.saturated_ci95[0]:,.0f}–{knee.saturated_ci95[1]:,.0f})"
                if knee.saturated_ci95
                else ""
            )
            if knee.saturated_tps is not None
            else "; not measured: no rate offered was beyond it"
        )
        # Under --latency-limit pgbench drops the transactions already late: the pool idles
        # while the schedule catches up, and completes less than a closed loop would.
        skipping = [
            c
            for c in cells
            if knee.first_beyond is not None
            and c.rate >= knee.first_beyond
            and (c.skipped_share or 0.0) >= SKIPPING
        ]
        caveat = (
            f" (below the prediction where pgbench skips the transactions already later "
            f"than its latency limit: {_share(skipping[-1].skipped_share)} at "
            f"{skipping[-1].rate:,.0f} tps; the pool then idles while the schedule catches up)"
            if skipping and knee.saturated_tps is not None
            else ""
        )
        said.append(
            f"The USL fit predicts the knee at {knee.predicted_tps:,.0f} tps{band}: {who} "
            f"never idle complete what the closed loop does at {who} (Little's law: N clients "
            f"over the latency R(N) each){measured}{caveat}."
        )
    said += _own_lag(cells)
    more = [c for c in closed_cells if c.clients > capacity.clients]
    for cell in cells:
        if cell.kept_up is not False or cell.pool_busy is None or cell.pool_busy < POOL_BUSY:
            continue
        better = [c for c in more if (c.tps_mean or 0.0) >= cell.rate * KEPT_UP]
        if better:
            said.append(
                f"{who.capitalize()} could not sustain {cell.rate:,.0f} tps: they were busy "
                f"{_share(cell.pool_busy)} of the time (Little's law), and the sweep measured "
                f"{better[0].tps_mean or 0:,.0f} tps at {n_clients(better[0].clients)}: more "
                f"clients (--rate-clients) would."
            )
    return said


def _own_lag(cells: list[RateCell]) -> list[str]:
    """The load generator's own lateness: at the lowest rate the pool is mostly idle, so a
    transaction that starts late waited for pgbench to wake, not for a client. It is part of
    the latency measured at every rate, and what no objective below it can escape here."""
    low = next((c for c in cells if c.achieved_tps is not None), None)
    if (
        low is None
        or low.pool_busy is None
        or low.pool_busy >= IDLE_POOL
        or low.lag_p99_ms is None
        or low.lag_p99_ms < OWN_LAG_MS
    ):
        return []
    return [
        f"At {low.rate:,.0f} tps the clients were busy {_share(low.pool_busy)} of the time, "
        f"yet 1% of the transactions started {_ms(low.lag_p99_ms)} or more after their time: "
        f"pgbench waking late on a busy host (its CPUs shared), a delay in every latency "
        f"measured here, at every rate."
    ]


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _tps(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} tps"


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1000:
        return f"{value / 1000:,.2f} s"
    return f"{value:,.2f} ms"
