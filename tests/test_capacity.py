"""Open loop without a server: offered rates and objectives as a spec and flags give them, the
plan that runs them after the sweep, pgbench's rated transaction log (its schedule lag and
skipped transactions), and the analysis: the knee, the capacity at an objective with its
interval over repeats, what the run says. tests/test_openloop.py runs them for real."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pgscope.analyze import capacity
from pgscope.analyze.capacity import ObjectiveResult
from pgscope.analyze.load import load_analysis
from pgscope.analyze.model import from_document, to_document
from pgscope.analyze.scaling import analyse as scaling_analyse
from pgscope.drive.pgbench import Workload, analyse_logs, analyse_schedule, archive_logs
from pgscope.errors import SpecError
from pgscope.render.html import report_html
from pgscope.runner.plan import plan_steps
from pgscope.spec import Objective, OfferedRate, load_spec, parse_rates
from tests.browser import CHROMIUM, capacity_drawn
from tests.stores import capacity_run


def test_rates_are_tps_shares_of_the_peak_or_ranges_of_either() -> None:
    assert parse_rates("20%-120%").texts() == ["20%", "40%", "60%", "80%", "100%", "120%"]
    assert parse_rates("50%-100%/20%").texts() == ["50%", "70%", "90%", "100%"], "ends kept"
    assert parse_rates("1000-3000/1000, 5000").texts() == [1000.0, 2000.0, 3000.0, 5000.0]
    assert parse_rates("25%,2500").rates == [OfferedRate(share_of_peak=0.25), OfferedRate(2500.0)]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("fast", "'fast' is not a rate"),
        ("0", "a rate must be above 0"),
        ("120%-20%", "ends below its start"),
        ("1000-5000", "needs a step: 1000-5000/STEP"),
        ("20-40%", "mixes tps and shares"),
        ("1%-1000%/0.1%", "more than 100 rates"),
    ],
)
def test_a_bad_rate_names_the_flag_the_part_and_why(text: str, said: str) -> None:
    with pytest.raises(SpecError) as caught:
        load_spec("scaling", overrides={"rates": text}, override_flags={"rates": "--rate"})
    assert str(caught.value).startswith("--rate: ") and said in str(caught.value), caught.value


def test_objectives_parse_in_any_unit_and_their_largest_is_the_latency_limit() -> None:
    spec = load_spec(
        "capacity", quick=True, overrides={"slo": ["p99<5ms", "p99.9 < 0.02s", "p50<800us"]}
    ).spec
    assert spec.slo == ["p99<5ms", "p99.9<20ms", "p50<0.8ms"]
    assert spec.objectives()[1] == Objective("p99.9<20ms", 0.999, 20.0)
    assert spec.latency_limit_ms() == 20.0
    assert load_spec("capacity", quick=True).spec.latency_limit_ms() is None


@pytest.mark.parametrize(
    ("slo", "said"),
    [
        (["p99<5"], "is not an objective"),
        (["p100<5ms"], "above 0 and below 100"),
        (["p99<5ms", "p99<0.005s"], "objectives must be distinct"),
    ],
)
def test_a_bad_objective_names_the_flag_and_why(slo: list[str], said: str) -> None:
    with pytest.raises(SpecError) as caught:
        load_spec("capacity", overrides={"slo": slo}, override_flags={"slo": "--slo"})
    assert str(caught.value).startswith("--slo: ") and said in str(caught.value), caught.value


def test_an_objective_without_rates_is_refused_before_anything_runs() -> None:
    with pytest.raises(SpecError) as caught:
        load_spec("scaling", overrides={"slo": ["p99<5ms"]}, override_flags={"slo": "--slo"})
    assert "give offered rates too" in str(caught.value)


def test_the_rates_run_after_the_whole_sweep_by_its_widest_pool() -> None:
    """Shares of the peak need the peak: every closed-loop step first (its order as without
    rates, the same seed), then each rate once per repeat block, by the sweep's highest
    client count unless rate_clients says otherwise."""
    spec = load_spec("capacity", quick=True).spec
    steps = plan_steps(spec, 2, seed=7)
    closed = [s for s in steps if not s.open_loop]
    assert len(closed) == 4 * 3 and len(steps) == 4 * 3 + 6 * 3
    assert steps[: len(closed)] == closed, "the sweep first"
    without = plan_steps(spec.model_copy(update={"rates": []}), 2, seed=7)
    assert closed == without, "rates change nothing of the sweep's order"
    rated = steps[len(closed) :]
    assert {s.clients for s in rated} == {8} and all(s.rate is None for s in rated)
    for repeat in (1, 2, 3):
        shares = sorted(s.offered.share_of_peak or 0 for s in rated if s.repeat == repeat)
        assert shares == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.2])
    fixed = spec.model_copy(update={"rates": [3000.0], "rate_clients": 3})
    [one] = [s for s in plan_steps(fixed, 2, seed=7) if s.open_loop and s.repeat == 1]
    assert (one.clients, one.rate) == (3, 3000.0), "a rate in tps is known before the sweep"


def test_a_rated_workload_asks_pgbench_for_its_rate_and_limit() -> None:
    args = Workload("select-only", (), "prepared", rate=2500.0, latency_limit_ms=5.0).args()
    assert "--rate=2500.000" in args and "--latency-limit=5.000" in args
    assert not any(
        a.startswith(("--rate", "--latency")) for a in Workload(None, (), "simple").args()
    )


def _rated_log(path: Path, base: int) -> None:
    """pgbench 15's log with -R and --latency-limit (lines as a real run writes them):
    client, transaction, latency from the scheduled start (or `skipped`), script, end
    second, end microsecond, schedule lag. 10 transactions a second for 4 seconds; the last
    two seconds fall behind: lag grows, some are skipped."""
    lines = []
    for second in range(4):
        for i in range(10):
            lag = 100 if second < 2 else 2000 * (second - 1) + 300 * i
            if second == 3 and i >= 7:
                lines.append(f"0 {second * 10 + i} skipped 0 {base + second} {i * 1000} 0")
                continue
            lines.append(
                f"0 {second * 10 + i} {1000 + lag} 0 {base + second} {i * 90000 + 5} {lag}"
            )
    lines.append(f"0 99 failed 0 {base + 3} 999000 0")
    path.write_text("\n".join(lines) + "\n")


def test_a_rated_log_gives_latency_from_the_schedule_its_lag_and_what_was_skipped(
    tmp_path: Path,
) -> None:
    base = 1795476517
    log = tmp_path / "xact.1"
    _rated_log(log, base)
    stats, seconds, outcomes = analyse_logs([log], warmup_s=0.0, rated=True)
    assert stats is not None
    assert outcomes.succeeded == 36 and outcomes.other == 1, "skipped ones are not transactions"
    assert [s.skipped for s in seconds] == [0, 0, 0, 3]
    assert seconds[0].lag_ms == pytest.approx(0.1) and seconds[3].lag_ms > seconds[2].lag_ms
    assert stats.max_ms == pytest.approx((1000 + 4000 + 300 * 6) / 1000), "lag included"
    window = (stats.window_start_us - 1, stats.window_end_us)
    objectives = (Objective("p50<2ms", 0.5, 2.0), Objective("p99<10ms", 0.99, 10.0))
    schedule = analyse_schedule([log], window, 10.0, objectives)
    assert schedule is not None
    assert schedule.skipped == 3 and schedule.late == 0
    # Served: due in the window by their schedule (end less latency), and done: the first
    # transaction ended at the window's start but was due 1.1 ms before it.
    assert schedule.served == 36
    assert schedule.lag_max_ms == pytest.approx(5.8)
    assert schedule.service_p50_ms == pytest.approx(1.0), "latency less the lag"
    half, tail = schedule.objectives
    # Of 40 scheduled (37 done, 3 skipped): 17 took more than 2 ms, and the skipped 3 count
    # above any threshold (they never ran), so p99 falls among them.
    assert (half.above, half.scheduled) == (17 + 3, 40) and half.latency_ms == pytest.approx(1.1)
    assert tail.above == 3 and tail.latency_ms is None and not tail.met
    assert half.met is True and half.above_share == pytest.approx(20 / 40), "50% at most"
    archived = archive_logs([log], tmp_path / "x.parquet", rated=True)
    assert archived == 37 + 1 + 3, "the skipped kept as rows of their own"


def _row(step_id: int, rate: float, repeat: int, tps: float, **more: Any) -> dict[str, Any]:
    row = {
        "step_id": step_id,
        "variant": "base",
        "clients": 8,
        "repeat": repeat,
        "status": "ok",
        "tps": tps,
        "rate": rate,
        "rate_share": rate / 10000,
        "latency_limit_ms": 5.0,
        "succeeded": int(tps * 5),
        "skipped": 0,
        "late": 0,
        "latency_mean_ms": 1.0,
        "lag_mean_ms": 0.2,
        "lag_p99_ms": 1.0,
        "lag_max_ms": 2.0,
        "service_p50_ms": 0.5,
        "service_p99_ms": 1.5,
        "p50_ms": 0.7,
        "p95_ms": 1.0,
        "p90_ms": 0.9,
        "p99_ms": 2.0,
        "p999_ms": 3.0,
        "max_ms": 4.0,
    }
    return row | more


def _sweep(
    rates: list[float], achieved: dict[float, float], above: dict[tuple[int, float], float]
) -> capacity.CapacityAnalysis | None:
    """Closed-loop steps (peak 10,000 tps at 4 clients), then 3 repeats of the rates: each
    achieving what `achieved` says, with the share above p99<5ms that `above` gives per
    (repeat, rate)."""
    rows = [
        {**_row(i + 1, 0, r, tps), "rate": None, "rate_share": None, "clients": n}
        for i, (n, tps, r) in enumerate(
            (n, tps, r)
            for r in (1, 2, 3)
            for n, tps in ((1, 3000.0), (2, 6000.0), (4, 10000.0), (8, 9000.0))
        )
    ]
    objectives: dict[int, list[ObjectiveResult]] = {}
    for r in (1, 2, 3):
        for rate in rates:
            step_id = len(rows) + 1
            rows.append(_row(step_id, rate, r, achieved[rate], p99_ms=1 + rate / 1000))
            scheduled = int(rate * 5)
            share = above[(r, rate)]
            objectives[step_id] = [
                ObjectiveResult("p99<5ms", 0.99, 5.0, round(share * scheduled), scheduled, None)
            ]
    growth = {r["step_id"]: (40.0 if r["rate"] and r["rate"] >= 10000 else 0.01) for r in rows}
    scaling = scaling_analyse(rows, bootstrap=50)
    return capacity.analyse(rows, objectives, growth, scaling, ["p99<5ms"])


RATES = [2000.0, 4000.0, 6000.0, 8000.0, 10000.0, 12000.0]
ACHIEVED = {2000.0: 2001.0, 4000.0: 3990.0, 6000.0: 5995.0, 8000.0: 7900.0, 10000.0: 8800.0,
            12000.0: 8900.0}  # fmt: skip
KEPT_UP_WITH_ALL = {rate: rate for rate in RATES}


def test_the_knee_is_the_first_rate_not_kept_up_with_and_beyond_it_the_server_saturates() -> None:
    above = {(r, rate): 0.001 if rate <= 4000 else 0.5 for r in (1, 2, 3) for rate in RATES}
    found = _sweep(RATES, ACHIEVED, above)
    assert found is not None
    [base] = found.variants
    assert base.clients == 8 and base.peak_tps == pytest.approx(10000.0)
    assert [c.kept_up for c in base.cells] == [True, True, True, True, False, False]
    knee = base.knee
    assert (knee.kept_up_to, knee.first_beyond) == (8000.0, 10000.0)
    assert knee.saturated_tps == pytest.approx(8850.0)
    assert (
        knee.saturated_ci95 is not None and knee.saturated_ci95[0] <= 8850 <= knee.saturated_ci95[1]
    )
    assert knee.predicted_tps is not None and 8000 < knee.predicted_tps < 10500, "USL at 8"
    assert knee.closed is not None and knee.closed.tps == pytest.approx(9000.0)
    said = " ".join(base.said)
    assert "not with 10,000 tps" in said and "grew 40.0 ms every second" in said
    assert "Closed loop at the same 8 clients" in said and "coordinated omission" in said
    assert "The USL fit predicts the knee" in said and "measured: 8,850 tps" in said
    assert "skips" not in said, "nothing skipped: the prediction stands as it is"


def test_the_capacity_interpolates_each_repeats_crossing_and_has_an_interval() -> None:
    """p99<5ms holds while at most 1% of transactions are above 5 ms: met at 4,000 and missed
    at 6,000 in every repeat, with shares that put each crossing elsewhere between them."""
    shares = {1: (0.001, 0.1), 2: (0.002, 0.02), 3: (0.0005, 0.5)}
    above = {
        (r, rate): 0.0 if rate < 4000 else shares[r][0] if rate == 4000 else shares[r][1]
        for r in (1, 2, 3)
        for rate in RATES
    }
    found = _sweep(RATES, ACHIEVED, above)
    assert found is not None
    [estimate] = found.variants[0].capacities
    per = estimate.per_repeat
    assert all(c is not None and 4000 < c < 6000 for c in per), per
    # Repeat 1: log-linear between 0.1% and 10%, 1% is half way: 5,000 tps.
    assert per[0] == pytest.approx(5000.0)
    assert per[1] is not None and per[1] > per[0], "a smaller miss puts the crossing later"
    assert per[2] is not None and per[2] < per[0]
    assert estimate.tps == pytest.approx(sum(c for c in per if c) / 3)
    assert estimate.ci95 is not None and estimate.ci95[0] < estimate.tps < estimate.ci95[1]
    assert estimate.said.startswith(f"{estimate.tps:,.0f} tps while p99<5ms (95% CI ")
    assert "over 3 repeats" in estimate.said


def test_a_capacity_outside_the_rates_offered_says_so_without_a_number() -> None:
    met_everywhere = {(r, rate): 0.0 for r in (1, 2, 3) for rate in RATES}
    # Kept up with every rate: met where the server fell short is no rate met (issue 37).
    found = _sweep(RATES, KEPT_UP_WITH_ALL, met_everywhere)
    assert found is not None
    [estimate] = found.variants[0].capacities
    assert estimate.tps is None and estimate.above == 3
    assert "held up to the highest rate offered, 12,000 tps" in estimate.said
    missed = {(r, rate): 0.2 for r in (1, 2, 3) for rate in RATES}
    found = _sweep(RATES, ACHIEVED, missed)
    assert found is not None
    [estimate] = found.variants[0].capacities
    assert estimate.tps is None and estimate.below == 3
    assert "missed at every rate offered, from 2,000 tps" in estimate.said


def test_a_miss_below_a_rate_the_repeat_met_is_a_stall_not_the_capacity() -> None:
    """Met up to 8,000 and missed from 10,000 in every repeat; repeat 1 also missed at 4,000
    and repeat 2 at 2,000, its lowest rate (CI, 2026-11-27: one repeat of three over 10 ms at
    5% of the peak, the pooled steps met it from 10% up). Queueing delay only grows with the
    rate, so a miss with a met rate above it is not where the rate crossed the objective."""
    above = {(r, rate): 0.0 if rate <= 8000 else 0.3 for r in (1, 2, 3) for rate in RATES}
    clean = _sweep(RATES, ACHIEVED, above)
    above[(1, 4000.0)] = 0.05
    above[(2, 2000.0)] = 0.02
    found = _sweep(RATES, ACHIEVED, above)
    assert clean is not None and found is not None
    [plain] = clean.variants[0].capacities
    [estimate] = found.variants[0].capacities
    assert all(c is not None and 8000 <= c < 10000 for c in estimate.per_repeat), estimate
    assert estimate.per_repeat == plain.per_repeat, "the stalls do not move the crossing"
    assert (estimate.below, estimate.above) == (0, 0)
    assert sorted(estimate.stalls) == [2000.0, 4000.0] and plain.stalls == []
    assert "over 3 repeats" in estimate.said
    assert "missed 2 times at a rate below one the same repeat met (2,000, 4,000 tps)" in (
        estimate.said
    )
    assert "stall" not in plain.said
    # Met at the highest rate after a miss below it: beyond the rates, with the stall said.
    everywhere = {(r, rate): 0.0 for r in (1, 2, 3) for rate in RATES} | {(3, 6000.0): 0.05}
    found = _sweep(RATES, KEPT_UP_WITH_ALL, everywhere)
    assert found is not None
    [beyond] = found.variants[0].capacities
    assert beyond.tps is None and beyond.above == 3 and beyond.stalls == [6000.0]
    assert beyond.said.startswith("p99<5ms held up to the highest rate offered, 12,000 tps")
    assert "(6,000 tps): a stall of the host" in beyond.said


def test_a_run_without_rates_has_no_capacity() -> None:
    rows = [{**_row(1, 0, 1, 5000.0), "rate": None}]
    assert capacity.analyse(rows, {}, {}, scaling_analyse(rows, bootstrap=0), []) is None


def test_a_pool_too_small_for_a_rate_is_said_with_the_clients_that_would_sustain_it() -> None:
    """Driven by 2 clients busy all the time (Little's law: 3,000 tps x 0.66 ms over 2
    clients), 4,000 tps was not kept up with, where the sweep measured 6,000 at 4 clients:
    the pool, not the server, ran short, and the run says so."""
    rows = [
        {**_row(i + 1, 0, 1, tps), "rate": None, "rate_share": None, "clients": n}
        for i, (n, tps) in enumerate(((1, 2000.0), (2, 3000.0), (4, 6000.0)))
    ]
    for i, (rate, tps) in enumerate(((2000.0, 2000.0), (4000.0, 3000.0))):
        rows.append(_row(10 + i, rate, 1, tps, clients=2, latency_mean_ms=0.86, lag_mean_ms=0.2))
    found = capacity.analyse(rows, {}, {}, scaling_analyse(rows, bootstrap=0), [])
    assert found is not None
    [base] = found.variants
    short = base.cells[-1]
    assert short.kept_up is False and short.pool_busy == pytest.approx(3000 * 0.66e-3 / 2)
    said = " ".join(base.said)
    assert "2 clients could not sustain 4,000 tps: they were busy 99.0% of the time" in said
    assert "6,000 tps at 4 clients: more clients (--rate-clients) would" in said


def test_a_late_start_in_an_idle_pool_is_said_to_be_the_load_generators() -> None:
    """At 2,000 tps 8 clients are busy 4% of the time, yet the p99 lag is 3 ms: no client
    was missing, pgbench woke late."""
    rows = [{**_row(1, 0, 1, 5000.0), "rate": None, "rate_share": None, "clients": 8}]
    rows.append(_row(2, 2000.0, 1, 2000.0, lag_p99_ms=3.0, latency_mean_ms=0.36, lag_mean_ms=0.2))
    found = capacity.analyse(rows, {}, {}, scaling_analyse(rows, bootstrap=0), [])
    assert found is not None
    said = " ".join(found.variants[0].said)
    assert "At 2,000 tps the clients were busy 4.0% of the time, yet 1% of the" in said
    assert "started 3.00 ms or more after their time: pgbench waking late" in said
    rows[-1]["lag_p99_ms"] = 0.05
    found = capacity.analyse(rows, {}, {}, scaling_analyse(rows, bootstrap=0), [])
    assert found is not None and "pgbench waking late" not in " ".join(found.variants[0].said)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium is not installed")
def test_the_capacity_with_its_interval_opens_the_verdict_and_is_drawn(tmp_path: Path) -> None:
    """A run with rates and p99<5ms, its store as the runner leaves it (tests/stores.py): the
    capacity, its 95% interval over the 3 repeats, first in the verdict, in summary.json's
    `capacity`, and on the report's chart as headless Chromium draws it."""
    run_dir = capacity_run(tmp_path / "20260101-000000-capacity-0000")
    analysis = load_analysis(run_dir, bootstrap=50)
    document = to_document(analysis)
    [estimate] = document["capacity"]["variants"][0]["capacities"]
    assert len([c for c in estimate["per_repeat"] if c is not None]) == 3
    assert all(6000 < c < 8000 for c in estimate["per_repeat"])
    low, high = estimate["ci95"]
    assert low < estimate["tps"] < high
    first = document["verdict"].split(". ")[0]
    assert first == (
        f"Capacity (8 clients): {estimate['tps']:,.0f} tps while p99<5ms (95% CI "
        f"{low:,.0f}–{high:,.0f} over 3 repeats)"
    )
    assert from_document(json.loads(json.dumps(document))).capacity == analysis.capacity
    knee = document["capacity"]["variants"][0]["knee"]
    assert (knee["kept_up_to"], knee["first_beyond"]) == (8000.0, 10000.0)
    report = tmp_path / "report.html"
    report.write_text(report_html(analysis))
    capacity_drawn(report, estimate, rates=6)
