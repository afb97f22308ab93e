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


def test_the_clients_axis_shows_the_measured_counts_only(tmp_path: Path) -> None:
    analysis = _analysis(tmp_path, [(2, 190.0), (10, 700.0), (2, 185.0), (10, 690.0)])
    throughput, latency = charts.scalability(analysis), charts.latency(analysis)
    assert throughput is not None and latency is not None
    # Throughput: numeric, for the USL curve between the counts, ticked at them only.
    axis = throughput["layout"]["xaxis"]
    assert axis["title"]["text"] == charts.CLIENTS_TITLE
    assert axis["type"] == "linear"
    assert axis["tickmode"] == "array" and list(axis["tickvals"]) == [2, 10]
    # Latency: categories in numeric order ("10" after "2", not before it as text sorts).
    axis = latency["layout"]["xaxis"]
    assert axis["title"]["text"] == charts.CLIENTS_TITLE
    assert axis["type"] == "category" and list(axis["categoryarray"]) == ["2", "10"]
    assert {tuple(t["x"]) for t in latency["data"]} == {("2", "10")}


def test_timeline_lines_stop_between_steps_and_pgscopes_checkpoints_are_its_own() -> None:
    from pgscope.analyze.timeline import Series

    # Step 2 begins 0.1 s after step 1 ends; step 3 seconds after step 2.
    steps = [(1, "base", 1, 0.0, 4.6), (2, "base", 2, 4.7, 8.2), (3, "base", 4, 11.0, 15.2)]
    seconds = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 12.0, 13.0, 14.0, 15.0)
    per_second = [(t, 100.0) for t in seconds]
    markers = [
        (9.5, "pgscope-checkpoint", "CHECKPOINT before step 3, took 40 ms"),
        (13.5, "checkpoint-start", "checkpoint starting: time at 13.5 s"),
    ]
    series = Series(0, steps, per_second, per_second, {}, markers)
    figure = charts.timeline(series)
    assert figure is not None
    for name in ("tps", "p95 ms"):
        line = next(t for t in figure["data"] if t["name"] == name)
        breaks = [
            (line["x"][i - 1], line["x"][i + 1]) for i, y in enumerate(line["y"]) if y is None
        ]
        assert breaks == [(4.0, 5.0), (8.0, 12.0)], (name, breaks)
    own = [t for t in figure["data"] if t["name"] == "pgscope's CHECKPOINT before a step"]
    assert len(own) == 1 and 9.5 in own[0]["x"]
    # The server's checkpoint keeps its dotted line and label; pgscope's is not among them.
    lines = {s["x0"] for s in figure["layout"]["shapes"] if s["type"] == "line"}
    assert lines == {13.5}  # one per panel
    # An observation's windows are slices of one workload: its lines run on across them,
    # and break only where seconds are missing.
    observed = charts.timeline(series, observed=True)
    assert observed is not None
    tps = next(t for t in observed["data"] if t["name"] == "commits/s")
    assert [tps["x"][i - 1] for i, y in enumerate(tps["y"]) if y is None] == [8.0]


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
