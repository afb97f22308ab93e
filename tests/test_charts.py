"""The report's charts, read from their plotly figure (data and layout), not their pixels:
axes in the order of their values, ticks a reader can use, the fit's goodness beside it. No
server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pgscope.analyze.usdt import Bucket, LatencySummary
from pgscope.render import charts


def _summary(tranche: str, buckets_us: dict[int, int]) -> LatencySummary:
    buckets = tuple(Bucket(us * 1000, us * 2000, n) for us, n in buckets_us.items())
    return LatencySummary("lwlock", tranche, "exclusive", sum(buckets_us.values()), 0, buckets)


def test_lwlock_buckets_are_in_numeric_order_and_counts_tick_at_whole_numbers() -> None:
    figure = charts.lwlock_histograms(
        [
            _summary("WALWrite", {128: 3, 256: 2}),  # first seen: 128 µs, 256 µs
            _summary("BufferContent", {4: 1, 8: 2, 32: 1, 1024: 1}),
        ]
    )
    assert figure is not None
    axis = figure["layout"]["xaxis"]
    order = ["4 µs", "8 µs", "32 µs", "128 µs", "256 µs", "1.024 ms"]
    assert axis["type"] == "category" and axis["categoryorder"] == "array"
    assert list(axis["categoryarray"]) == order
    for trace in figure["data"]:
        positions = [order.index(x) for x in trace["x"]]
        assert positions == sorted(positions)
    counts = figure["layout"]["yaxis"]
    assert counts["type"] == "log" and counts["tickmode"] == "array"
    assert all(float(t).is_integer() for t in counts["tickvals"]), counts["tickvals"]
    assert {1, 2}.issubset(counts["tickvals"])  # counts 1 to 3: not plotly's 1.5 and 2.5


def _analysis(tmp_path: Path, cells: list[tuple[int, float]]) -> Any:
    from pgscope.analyze.load import load_analysis
    from tests.stores import measured_run

    return load_analysis(
        measured_run(tmp_path / "20261124-000000-scaling-0000", cells), bootstrap=0
    )


def test_the_clients_axis_ticks_at_the_measured_counts_only(tmp_path: Path) -> None:
    analysis = _analysis(tmp_path, [(1, 100.0), (2, 190.0), (1, 102.0), (2, 185.0)])
    for figure in (charts.scalability(analysis), charts.latency(analysis)):
        assert figure is not None
        axis = figure["layout"]["xaxis"]
        assert axis["title"]["text"] == "clients"
        assert axis["tickmode"] == "array" and list(axis["tickvals"]) == [1, 2]


GOOD = [(1, 100.0), (2, 190.0), (4, 340.0), (8, 500.0), (16, 560.0)]
# Throughput that jumps around the client counts: no curve explains it.
NOISY = [(1, 400.0), (2, 120.0), (4, 520.0), (8, 150.0), (16, 450.0)]


def _usl_trace(figure: dict[str, Any]) -> str:
    names = [t["name"] for t in figure["data"] if "USL σ" in t.get("name", "")]
    assert len(names) == 1, names
    return str(names[0])


def test_the_usl_fit_is_shown_with_its_goodness(tmp_path: Path) -> None:
    for cells, poor in ((GOOD, False), (NOISY, True)):
        analysis = _analysis(tmp_path / str(poor), cells * 2)
        fit = analysis.scalability.fits["base"]
        assert (fit.r_squared < 0.8) is poor, fit.r_squared
        figure = charts.scalability(analysis)
        assert figure is not None
        legend = _usl_trace(figure)
        assert f"R²={fit.r_squared:.2f}" in legend
        assert ("poor fit" in legend) is poor
        words = fit.describe()
        assert "R²=" in words and ("poor fit" in words) is poor
