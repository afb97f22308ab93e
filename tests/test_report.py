"""The HTML report: every section present, every chart drawn with data, in headless Chromium;
a report says what is missing and why; a bad store is a one-line error."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pgscope.errors import ExitCode
from tests.browser import CHROMIUM, CHROMIUM_FLAGS
from tests.cli import one_line_error, pgscope
from tests.servers import tmpfs

SECTIONS = (
    "verdict",
    "account",
    "scalability",
    "waits",
    "timeline",
    "locks",
    "checkpoints",
    "cpu",
    "variants",
    "environment",
)
CAN_TRACE = os.geteuid() == 0 and bool(shutil.which("bpftrace")) and bool(shutil.which("perf"))
needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium is not installed")
SWEEP = [
    "--clients",
    "1,2,4",
    "--duration",
    "3",
    "--warmup",
    "1",
    "--repeats",
    "1",
    "--scale",
    "1",
    "--set",
    "shared_buffers=128MB",
    "--json",
]


def open_in_chromium(page_path: Path, screenshot: Path | None = None) -> dict[str, Any]:
    """What a reader's browser makes of the report: console errors, sections, the charts and
    their data, the flame graphs' frames."""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
            page.goto(page_path.as_uri())
            page.wait_for_load_state("load")
            page.wait_for_timeout(1500)  # plotly draws after load
            seen: dict[str, Any] = page.evaluate("""() => ({
              sections: [...document.querySelectorAll('main > section')].map(s => s.id),
              charts: [...document.querySelectorAll('.js-plotly-plot')].map(e => ({
                id: e.id, traces: e.data.length,
                points: e.data.reduce((n, t) => n + ((t.x || t.y || t.values || []).length), 0),
                drawn: e.querySelectorAll('svg .main-svg, svg.main-svg').length})),
              placeholders: [...document.querySelectorAll('.chart')]
                .filter(e => !e.classList.contains('js-plotly-plot')).map(e => e.id),
              verdict: document.querySelector('.verdict')?.innerText || '',
              findings: document.querySelectorAll('.finding').length,
              notes: [...document.querySelectorAll('section .note')].map(n => n.innerText),
              flames: document.querySelectorAll('iframe.flame').length,
            })""")
            frames = [
                page.frame_locator("iframe.flame").nth(i).locator("#chart svg g").count()
                for i in range(seen["flames"])
            ]
            seen["flame_frames"] = frames
            if screenshot is not None:
                page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    seen["errors"] = errors
    return seen


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short sweep with every collector that can run here, perf included (the CPU
    section), and a checkpoint mid-step (the checkpoint section)."""
    results = tmp_path_factory.mktemp("report")
    collectors = "activity,pgstats,host" + (",usdt,perf" if CAN_TRACE else "")
    result = pgscope(
        "run",
        "scaling",
        *SWEEP,
        "--action",
        "2:CHECKPOINT",
        "--workload",
        "tpcb-like",
        "--collectors",
        collectors,
        "--results-dir",
        str(results),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return Path(json.loads(result.stdout)["run_dir"])


@needs_chromium
def test_every_section_renders_and_every_chart_has_data(sweep: Path) -> None:
    report = sweep / "report.html"
    assert report.is_file(), "a run writes its report"
    seen = open_in_chromium(report, sweep / "report.png")
    assert seen["errors"] == []
    assert tuple(seen["sections"]) == SECTIONS
    assert seen["placeholders"] == [], "a chart div plotly did not draw"
    charts = {c["id"]: c for c in seen["charts"]}
    expected = {"chart-scalability", "chart-latency", "chart-timeline", "chart-waits-0"}
    if CAN_TRACE:
        expected |= {"chart-lwlocks", "chart-checkpoints"}
    assert expected <= set(charts), sorted(charts)
    for chart in charts.values():
        assert chart["traces"] > 0 and chart["points"] > 0, chart
        assert chart["drawn"] > 0, f"{chart['id']} has data but no drawing"
    assert seen["verdict"] and seen["findings"] >= 1
    if CAN_TRACE:
        assert seen["flames"] >= 2, "a flame graph and the differential between client counts"
        assert all(n > 10 for n in seen["flame_frames"]), seen["flame_frames"]
    assert (sweep / "report.png").stat().st_size > 50_000


# A numeric axis's title names its unit in brackets at its end: "throughput (transactions/s)".
UNIT = re.compile(r"\([^()]+\)$")
NS = {"ns": 1, "µs": 1_000, "ms": 1_000_000}
DRAWN_AXES = """() => Object.fromEntries(
  [...document.querySelectorAll('.js-plotly-plot')].map(e => [e.id, {
    titles: [...e.querySelectorAll('[class$="title"] text')].map(t => t.textContent),
    traces: e.data.map(t => t.name),
    axes: Object.keys(e._fullLayout).filter(k => /^[xy]axis\\d*$/.test(k)).map(k => {
      const a = e._fullLayout[k];
      return {name: k, type: a.type, title: a.title.text || '', shown: a.showticklabels,
              ticks: (a._vals || []).map(v => v.text)};
    })}]))"""


def _report_figures(report: Path) -> dict[str, Any]:
    """The charts as the report carries them: the JSON its script hands to plotly."""
    text = report.read_text()
    start = text.index("const charts = ") + len("const charts = ")
    end = text.index(";\nfor (const [key, figure]", start)
    figures: dict[str, Any] = json.loads(text[start:end].replace("<\\/", "</"))
    return figures


def _drawn_axes(report: Path) -> dict[str, Any]:
    """Each chart's axes as plotly laid them out in Chromium: type, title, tick labels."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 900})
            page.goto(report.as_uri())
            page.wait_for_load_state("load")
            page.wait_for_timeout(1500)  # plotly draws after load
            drawn: dict[str, Any] = page.evaluate(DRAWN_AXES)
        finally:
            browser.close()
    return drawn


def _ns(label: str) -> float:
    number, unit = label.split()
    return float(number) * NS[unit]


@needs_chromium
def test_chart_axes_are_in_numeric_order_and_labelled_with_their_units(sweep: Path) -> None:
    from pgscope.render.charts import CLIENTS_TITLE

    figures = _report_figures(sweep / "report.html")
    cells = json.loads((sweep / "summary.json").read_text())["scalability"]["cells"]
    measured = sorted({c["clients"] for c in cells})
    counts = [str(n) for n in measured]
    # In the report's JSON: clients as categories in numeric order (latency, waits), the
    # throughput axis (numeric, for the USL curve) ticked at the measured counts only.
    for key in ("latency", "waits-0"):
        axis = figures[key]["layout"]["xaxis"]
        assert axis["type"] == "category" and axis["categoryarray"] == counts, (key, axis)
    assert figures["scalability"]["layout"]["xaxis"]["tickvals"] == measured
    timeline = figures["timeline"]["data"]
    tps = next(t for t in timeline if t["name"] == "tps")
    assert tps["y"].count(None) >= len(measured) - 1, "a line drawn across the set-up"
    assert "pgscope's CHECKPOINT before a step" in [t["name"] for t in timeline]
    if CAN_TRACE:
        buckets = figures["lwlocks"]["layout"]["xaxis"]["categoryarray"]
        assert len(buckets) >= 3 and [_ns(b) for b in buckets] == sorted(map(_ns, buckets))
        names = {t["y"][0] for t in figures["checkpoints"]["data"]}
        assert any("requested: immediate" in n for n in names), names  # the action's
        assert any("pgscope's, before step" in n for n in names), names
    # As Chromium lays them out: every axis with tick labels has a title, drawn, naming its
    # unit unless its categories are names; numbers in numeric order.
    drawn = _drawn_axes(sweep / "report.html")
    assert set(drawn) == {f"chart-{key}" for key in figures}
    for chart, seen in drawn.items():
        for axis in seen["axes"]:
            if not axis["shown"]:  # a shared axis: the panel below it carries the labels
                continue
            assert axis["title"] and axis["title"] in seen["titles"], (chart, axis)
            if axis["type"] != "category" or axis["title"] == CLIENTS_TITLE:
                assert UNIT.search(axis["title"]), (chart, axis)
            if axis["title"] == CLIENTS_TITLE:
                assert axis["ticks"] == counts, (chart, axis)
    if CAN_TRACE:
        ticks = next(a for a in drawn["chart-lwlocks"]["axes"] if a["name"] == "xaxis")["ticks"]
        assert [_ns(t) for t in ticks] == sorted(map(_ns, ticks)), ticks


# The JSON document has a key for each section of the report, and the findings beside the
# verdict (docs/json.md).
# The HTML's section "account" is the JSON's "accounts" (one tree per cell).
JSON_SECTIONS = (*(s for s in SECTIONS if s != "account"), "accounts", "findings", "diagnosis")


def test_the_html_renders_from_the_json_alone(
    sweep: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """summary.json carries every section the HTML shows: the report rendered from that file,
    with no store in reach and any attempt to open one failing, is the run's own report."""
    from pgscope.analyze.model import read_document
    from pgscope.collect import offered
    from pgscope.render.html import report_html

    doc = json.loads((sweep / "summary.json").read_text())
    assert set(JSON_SECTIONS) <= set(doc), set(JSON_SECTIONS) - set(doc)
    assert doc["scalability"]["cells"] and doc["timeline"]["series"]["tps"]
    if CAN_TRACE:
        assert doc["locks"]["traced"] and doc["locks"]["lwlocks"]
        assert doc["checkpoints"]["items"], "the mid-step CHECKPOINT was traced"
        assert doc["cpu"]["flames"] and doc["cpu"]["profiles"]
    alone = tmp_path / "elsewhere" / "summary.json"
    alone.parent.mkdir()
    shutil.copy(sweep / "summary.json", alone)
    offers = offered()

    def no_store(*args: object, **kwargs: object) -> None:
        raise AssertionError("the renderer tried to open a store")

    monkeypatch.setattr(duckdb, "connect", no_store)
    html = report_html(read_document(alone), offers)
    assert html == (sweep / "report.html").read_text()


def test_report_text_and_json_come_from_the_same_analysis(sweep: Path) -> None:
    as_json = pgscope("report", str(sweep), "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    findings = doc["findings"]
    assert findings and {"id", "title", "confidence", "evidence", "recommendations"} <= set(
        findings[0]
    )
    assert findings[0]["confidence"] in ("high", "medium", "low")
    assert all(e["source"] and e["label"] for e in findings[0]["evidence"])
    assert json.loads(pgscope("report", str(sweep), "--json").stdout) == doc
    text = pgscope("report", str(sweep))
    assert findings[0]["title"] in text.stdout
    again = pgscope("report", str(sweep), "--format", "html")
    assert again.returncode == 0 and Path(again.stdout.strip()) == sweep / "report.html"


@needs_chromium
def test_a_report_without_tracing_or_profiling_says_why(
    reference_run: tuple[Path, dict[str, Any]],
) -> None:
    # The reference run (tests/runs.py) asks for usdt and perf with neither on PATH.
    run_dir = reference_run[0]
    seen = open_in_chromium(run_dir / "report.html")
    assert seen["errors"] == []
    assert tuple(seen["sections"]) == SECTIONS
    notes = " ".join(seen["notes"])
    assert "The usdt collector could not run here" in notes and "bpftrace" in notes
    assert "The perf collector could not run here" in notes and "perf" in notes
    html = (run_dir / "report.html").read_text()
    assert "What this run could not judge" in html
    # A rule whose evidence could have come and did not says so, not only what it needs (the
    # source named there may have run).
    summary = json.loads((run_dir / "summary.json").read_text())
    unexplained = [n for n in summary["diagnosis"]["not_assessed"] if not n["why"]]
    assert unexplained, "the reference run has rules its collectors could not feed"
    for item in unexplained:
        assert f"this run measured none of: {', '.join(item['missing'])}" in html, item


def test_a_missing_foreign_or_corrupt_store_is_a_one_line_error(tmp_path: Path) -> None:
    missing = pgscope("report", str(tmp_path / "nothing-here"))
    assert missing.returncode == 3
    assert "not a pgscope run folder" in one_line_error(missing)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    db = duckdb.connect(str(foreign / "run.duckdb"))
    db.execute("CREATE TABLE orders (id int)")
    db.close()
    result = pgscope("report", str(foreign), "--format", "html")
    assert result.returncode == 3
    assert "is not a pgscope run store" in one_line_error(result)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "run.duckdb").write_bytes(os.urandom(64 * 1024))
    result = pgscope("report", str(corrupt))
    assert result.returncode == 3
    assert "cannot open the run store" in one_line_error(result)


def test_a_store_of_another_database_is_refused_without_fetching_anything(
    tmp_path: Path,
) -> None:
    """A SQLite file named run.duckdb: DuckDB would reach for its sqlite extension (and by
    default download it); the store's connections never install or load one."""
    import sqlite3

    from pgscope.duck import connect

    folder = tmp_path / "sqlite"
    folder.mkdir()
    with contextlib.closing(sqlite3.connect(folder / "run.duckdb")) as db:
        db.execute("CREATE TABLE run (run_id TEXT)")
        db.commit()
    result = pgscope("report", str(folder))
    assert result.returncode == 3
    assert "is not a pgscope run store (not a DuckDB file)" in one_line_error(result)
    with contextlib.closing(connect()) as db:
        for setting in ("autoinstall_known_extensions", "autoload_known_extensions"):
            assert db.execute(f"SELECT current_setting('{setting}')").fetchone() == (False,)


def test_an_actions_markup_is_shown_in_the_timeline_not_made_a_link() -> None:
    """plotly renders a subset of HTML in annotation text: an --action's SQL must stay text."""
    from pgscope.analyze.timeline import Series
    from pgscope.render.charts import timeline

    label = '<a href="http://127.0.0.1/x">click</a> at 2.0 s'
    steps = [(1, "base", 1, 0.0, 5.0)]
    figure = timeline(
        Series(0, steps, [(1.0, 10.0), (2.0, 12.0)], [], {}, [(1.5, "action", label)])
    )
    assert figure is not None
    texts = [a.get("text", "") for a in figure["layout"]["annotations"]]
    assert not any("<a " in t for t in texts), texts
    assert any("&lt;a href" in t for t in texts), texts


def _failed_run(run_dir: Path, errors: list[str]) -> Path:
    """A run store as a run whose every step failed leaves it: no server needed."""
    from pgscope.store import RunMeta, RunStore

    store = RunStore.create(
        run_dir,
        RunMeta(run_dir.name, "scaling", "recipe scaling", "", "{}", "pgscope run", "0",
                "server", "host=db1", {}),
    )  # fmt: skip
    for step_id, error in enumerate(errors, start=1):
        store.begin_step(step_id, "base", step_id, 1, 1, 2.0, 0.0, False)
        store.finish_step(step_id, "failed", error, {})
    store.finish_run("failed", "the server died mid-run")
    store.close()
    return run_dir


def test_a_failed_runs_report_lists_every_step_error(tmp_path: Path) -> None:
    errors = [f"pgbench: error: fault number {i}" for i in range(1, 8)]
    run_dir = _failed_run(tmp_path / "failed", errors)
    text = pgscope("report", str(run_dir))
    assert text.returncode == 0, text.stderr
    assert "failed (the server died mid-run)" in text.stdout
    for step_id, error in enumerate(errors[:5], start=1):
        assert f"step {step_id} (base, clients={step_id}): failed: {error}" in text.stdout
    assert "and 2 more steps not ok (report.html lists every one)" in text.stdout
    html = pgscope("report", str(run_dir), "--format", "html")
    assert html.returncode == 0, html.stderr
    page = (run_dir / "report.html").read_text()
    assert "the server died mid-run" in page
    for error in errors:
        assert f"failed: {error}</td>" in page, error


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "tiny", "12m") as mount:
        yield mount


def test_report_html_on_a_full_or_read_only_disk_keeps_the_summary(tiny_disk: Path) -> None:
    """It used to end as an internal error with an empty summary.json: every file is written
    beside its place and renamed over it, or not at all."""
    run_dir = _failed_run(tiny_disk / "run", ["pgbench: error: x"])
    first = pgscope("report", str(run_dir), "--format", "html")
    assert first.returncode == 0, first.stderr
    before = {name: (run_dir / name).read_bytes() for name in ("summary.json", "summary.txt")}
    assert json.loads(before["summary.json"])["status"] == "failed"
    fresh = _failed_run(tiny_disk / "fresh", ["pgbench: error: y"])  # no summary yet
    with contextlib.suppress(OSError), (tiny_disk / "filler").open("wb") as filler:
        filler.write(b"\0" * shutil.disk_usage(tiny_disk).free)
    for state, reason in (("full", "No space left on device"), ("ro", "Read-only file system")):
        if state == "ro":
            (tiny_disk / "filler").unlink()
            subprocess.run(["mount", "-o", "remount,ro", str(tiny_disk)], check=True)
        for folder in (run_dir, fresh):
            result = pgscope("report", str(folder), "--format", "html")
            assert result.returncode == ExitCode.ENVIRONMENT, (state, result.stderr)
            message = one_line_error(result)
            assert f"cannot write {folder}/summary.json: {reason}" in message, message
            assert f"the run itself is intact in {folder}/run.duckdb" in message
        assert {n: (run_dir / n).read_bytes() for n in before} == before, state
        assert not (fresh / "summary.json").exists(), "no empty summary.json"
        assert sorted(p.name for p in fresh.iterdir()) == ["run.duckdb"], "no temporary file"
        text = pgscope("report", str(run_dir))
        assert text.returncode == 0 and "failed (the server died mid-run)" in text.stdout


def test_a_sample_sessions_report_says_what_its_summary_says(tmp_path: Path) -> None:
    """A `sample` session has no steps: its report said the activity collector "recorded
    nothing" and its verdict that no step measured anything, while summary.txt showed the
    profile. Both now show the profile, and the verdict says where active time went."""
    from tests.stores import sampled_session

    run = sampled_session(tmp_path / "20261124-000000-sample-0000", lock_share=0.52)
    result = pgscope("report", str(run), "--format", "html")
    assert result.returncode == 0, result.stderr
    text = (run / "summary.txt").read_text()
    page = (run / "report.html").read_text()
    waits = page[
        page.index('<section id="waits">') : page.index(
            "</section>", page.index('<section id="waits">')
        )
    ]
    assert 'Lock:transactionid</td><td class="num">52.0%' in waits, waits
    assert "UPDATE pgbench_branches" in waits and "recorded nothing" not in waits
    assert re.search(r"Lock:transactionid +│ +52\.0%", text), text
    verdict = json.loads((run / "summary.json").read_text())["diagnosis"]["verdict"]
    assert "Lock:transactionid 52%" in verdict and "No load steps to diagnose" in verdict
    assert f"verdict: {verdict}" in text and verdict in page
    assert "pgscope sample 20261124-000000-sample-0000" in text
