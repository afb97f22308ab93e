"""The report's charts, read from their plotly figure (data and layout), not their pixels:
axes in the order of their values, ticks a reader can use, the fit's goodness beside it. No
server."""

from __future__ import annotations

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
