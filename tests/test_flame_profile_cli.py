"""It must show (issue 5, item 3): `pgscope profile --duration 5` writes folded stacks, a
speedscope file that speedscope's published schema accepts, and an HTML flame graph that
renders in headless Chromium without console errors (and zooms, searches, shows counts)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from pgscope.render.flame import speedscope_schema
from pgscope.target.embedded import EmbeddedCluster
from pgscope.target.pgbin import PgBinaries
from tests.browser import CHROMIUM, CHROMIUM_FLAGS
from tests.cli import pgscope

FOLDED_LINE = re.compile(r"^(?P<stack>[^ ;][^\n]*) (?P<value>\d+)$")

needs_profiling = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("perf") is None or shutil.which("bpftrace") is None,
    reason="profiles need root, perf and bpftrace",
)


def pgbench_argv(pg: PgBinaries, cluster: EmbeddedCluster, *args: str) -> list[str]:
    params = cluster.conn.params
    return [
        str(pg.path("pgbench")),
        "-h", params["host"],
        "-p", params["port"],
        "-U", params["user"],
        *args,
        params["dbname"],
    ]  # fmt: skip


@pytest.fixture
def loaded(pg: PgBinaries, shared_cluster: EmbeddedCluster) -> Iterator[EmbeddedCluster]:
    """The shared cluster under select-only load for the length of a test."""
    subprocess.run(
        pgbench_argv(pg, shared_cluster, "-i", "-s", "1", "-q"), check=True, capture_output=True
    )
    load = subprocess.Popen(
        pgbench_argv(pg, shared_cluster, "-S", "-M", "prepared", "-c", "2", "-j", "2", "-T", "60"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield shared_cluster
    finally:
        load.terminate()
        load.wait(10)


def render_in_chromium(page_path: Path) -> dict[str, object]:
    """Open a page in headless Chromium; what a person would see and do: frames drawn, a
    hover, a search, a zoom by click. Returns what happened, with every console error."""
    from playwright.sync_api import sync_playwright

    seen: dict[str, object] = {}
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
            page.goto(page_path.as_uri())
            page.wait_for_selector("body[data-rendered=true]", timeout=15_000)
            frames = page.locator("#chart svg g")
            seen["frames"] = frames.count()
            target = page.locator("#chart svg g", has_text="PostgresMain").first
            target.hover()
            seen["hover"] = page.locator("#details").inner_text()
            page.fill("#term", "PostgresMain")
            page.click("#search")
            seen["search"] = page.locator("#details").inner_text()
            before = float(target.locator("rect").get_attribute("width") or 0)
            target.click()
            page.wait_for_timeout(800)  # the zoom transition
            seen["zoom"] = (before, float(target.locator("rect").get_attribute("width") or 0))
        finally:
            browser.close()
    seen["errors"] = errors
    return seen


@pytest.mark.tracing
@needs_profiling
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium is not installed")
def test_profile_command_writes_folded_speedscope_and_a_flame_graph(
    loaded: EmbeddedCluster, tmp_path: Path
) -> None:
    result = pgscope(
        "profile",
        "--data-dir", str(loaded.data_dir),
        "--duration", "5",
        "--off-cpu",
        "--results-dir", str(tmp_path),
        "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(result.stdout)
    assert set(document["profiles"]) == {"cpu", "offcpu"}
    schema = speedscope_schema()
    for kind, summary in document["profiles"].items():
        files = {name: Path(path) for name, path in summary["files"].items()}
        assert summary["total"] > 0, kind

        lines = files["folded"].read_text().splitlines()
        parsed = [FOLDED_LINE.match(line) for line in lines]
        assert lines and all(parsed), [ln for ln, m in zip(lines, parsed, strict=True) if not m]
        assert sum(int(m["value"]) for m in parsed if m) == summary["total"]
        roots = {m["stack"].split(";", 1)[0] for m in parsed if m}
        assert "backend" in roots, roots
        assert any("PostgresMain" in (m["stack"] if m else "") for m in parsed)

        speedscope = json.loads(files["speedscope"].read_text())
        jsonschema.validate(speedscope, schema)  # speedscope's own published file format
        (prof,) = speedscope["profiles"]
        assert sum(prof["weights"]) == summary["total"] == prof["endValue"]
        assert len(prof["samples"]) == len(lines)
        names = [f["name"] for f in speedscope["shared"]["frames"]]
        assert "PostgresMain" in names

        seen = render_in_chromium(files["html"])
        assert seen["errors"] == [], seen["errors"]
        assert int(str(seen["frames"])) > 20, seen
        assert "PostgresMain" in str(seen["hover"]), seen
        assert str(seen["search"]).startswith("search: "), seen
        before, after = seen["zoom"]  # type: ignore[misc]
        assert after > before, f"clicking a frame must zoom into it: {seen['zoom']}"

    cpu = document["profiles"]["cpu"]
    assert cpu["unit"] == "samples" and 0 < cpu["kernel_share"] < 1
    offcpu = document["profiles"]["offcpu"]
    assert offcpu["unit"] == "microseconds"
    # Profiled for ~5 s: backends, walwriter, checkpointer... sleep for seconds in total.
    assert offcpu["total"] > 2_000_000, offcpu["total"]
    collectors = {c["name"]: c["status"] for c in document["collectors"]}
    assert collectors == {"perf": "complete", "offcpu": "complete"}


def test_profile_command_rejects_bad_targets(tmp_path: Path) -> None:
    from tests.cli import one_line_error

    neither = pgscope("profile", "--duration", "1", "--results-dir", str(tmp_path))
    assert neither.returncode == 2
    assert "exactly one of --data-dir and --pid" in one_line_error(neither)
    not_pg = pgscope("profile", "--pid", str(os.getpid()), "--results-dir", str(tmp_path))
    assert not_pg.returncode == 2
    assert f"--pid {os.getpid()}: not a running PostgreSQL server process" in one_line_error(not_pg)
    no_dir = pgscope("profile", "--data-dir", str(tmp_path), "--results-dir", str(tmp_path))
    assert no_dir.returncode == 2
    assert "not a PostgreSQL data directory" in one_line_error(no_dir)
