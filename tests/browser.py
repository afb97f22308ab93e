"""Headless Chromium, for the tests that open a report as a reader would."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

# Headless Chromium as this machine allows it: no sandbox as root, no network (its background
# connections would only be refused), a fresh profile each time.
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


def read_page(report: Path, ready: str, read: str) -> tuple[Any, list[str]]:
    """What the JavaScript function `read` returns from `report` as a reader's browser shows
    it, once the JavaScript condition `ready` holds (plotly draws after the page's load), and
    the page's errors."""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 900})
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(report.as_uri())
            page.wait_for_load_state("load")
            page.wait_for_function(ready, timeout=30_000)
            seen = page.evaluate(read)
        finally:
            browser.close()
    return seen, errors


def capacity_chart(report: Path) -> dict[str, Any]:
    """The report's first latency-against-rate chart as a reader's browser draws it: its
    traces (name, x, y), its y axis type, whether it drew, the capacity section's text, and
    the page's errors."""
    chart, errors = read_page(
        report,
        "() => document.querySelector('#chart-capacity-0 svg.main-svg') !== null",
        """() => {
          const e = document.getElementById('chart-capacity-0');
          return {
            traces: e.data.map(t => ({name: t.name, x: t.x, y: t.y})),
            yaxis: e.layout.yaxis.type,
            drawn: e.querySelectorAll('svg.main-svg').length,
            text: document.getElementById('capacity').innerText,
          };
        }""",
    )
    chart["errors"] = errors
    return dict(chart)


def capacity_drawn(report: Path, estimate: dict[str, Any], rates: int) -> None:
    """The report draws the capacity at its objective (`estimate`, as summary.json has it) on
    its latency-against-rate chart: the line at its rate, its 95% interval as a band, the
    objective's threshold, the p99 of each of the `rates`; and says it in the section."""
    import pytest

    chart = capacity_chart(report)
    assert not chart["errors"], chart["errors"]
    assert chart["drawn"], "the latency-against-rate chart is drawn"
    assert chart["yaxis"] == "log"
    traces = {t["name"]: t for t in chart["traces"]}
    slo = estimate["objective"]
    line = traces[f"capacity {slo}: {estimate['tps']:,.0f} tps"]
    assert line["x"] == pytest.approx([estimate["tps"]] * 2)
    band = traces[f"capacity {slo}: 95% interval"]
    assert min(band["x"]) == pytest.approx(estimate["ci95"][0])
    assert max(band["x"]) == pytest.approx(estimate["ci95"][1])
    assert traces[f"objective {slo}"]["y"] == [estimate["threshold_ms"]] * 2
    assert len(traces["p99 vs offered rate"]["x"]) == rates
    assert f"Capacity: {estimate['tps']:,.0f} tps while {slo}" in chart["text"]
