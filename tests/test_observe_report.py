"""The observe report in headless Chromium, as a DBA reads it (issue 30: the verdict came third,
a p95 latency panel stayed empty, and it spoke of "tps (transactions/s)", "clients (pgbench
connections)", "mean tps … from pgbench" and "this run compares variants" with no pgbench in
sight). A workload that is not pgbench (psycopg clients updating rows) is observed; the
report's sections, its charts' panels and every word it shows, charts included, are read."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from pgscope.target.embedded import EmbeddedCluster
from tests.browser import CHROMIUM, read_page
from tests.servers import observed_beside

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium is not installed"),
]
# What a load generator's report says, and an observation must not.
PGBENCH_WORDS = re.compile(
    r"pgbench|\btps\b|transactions/s|each repeat|\brepeats?\b|compares variants|"
    r"variants side by side",
    re.IGNORECASE,
)
# Every chart drawn by plotly.
DRAWN = (
    "() => document.querySelectorAll('.chart').length > 0 && "
    "[...document.querySelectorAll('.chart')].every(e => e.classList.contains('js-plotly-plot'))"
)
READ = """() => {
  const panels = [...document.querySelectorAll('.js-plotly-plot')].map(e => {
    const layout = e._fullLayout;
    const axes = Object.keys(layout).filter(k => /^yaxis\\d*$/.test(k));
    const used = new Set(e.data.filter(t => (t.x || t.y || []).length)
                                .map(t => 'yaxis' + (t.yaxis || 'y').slice(1)));
    return {id: e.id, axes: axes, used: [...used],
            words: [e.innerText, JSON.stringify(e.data.map(t => [t.name, t.text || '',
                     t.hovertemplate || ''])), JSON.stringify(layout.annotations || [])].join(' ')};
  });
  return {sections: [...document.querySelectorAll('main > section')].map(s => s.id),
          text: document.body.innerText,
          placeholders: [...document.querySelectorAll('.chart')]
            .filter(e => !e.classList.contains('js-plotly-plot')).map(e => e.id),
          panels: panels};
}"""


def _observed(cluster: EmbeddedCluster, tmp_path: Path) -> dict[str, Any]:
    with cluster.connect() as setup:
        setup.execute("CREATE TABLE items (id int PRIMARY KEY, n bigint)")
        setup.execute("INSERT INTO items SELECT g, 0 FROM generate_series(1, 1000) g")
    stop = threading.Event()

    def client(seed: int) -> None:
        with cluster.conn.connect(application_name="shop") as s:
            i = seed
            while not stop.is_set():
                i = (i * 7919 + 1) % 1000 + 1
                s.execute("UPDATE items SET n = n + 1 WHERE id = %s", [i])

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(3)]
    result = observed_beside(
        cluster, threads, stop, "shop",
        *("--duration", "6", "--window", "2", "--json", "--results-dir", str(tmp_path)),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def test_the_observe_report_leads_with_its_verdict_and_speaks_of_observation(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    document = _observed(cluster, tmp_path)
    report = Path(document["run_dir"]) / "report.html"
    seen, errors = read_page(report, DRAWN, READ)
    assert errors == []
    # The verdict first, as in a run's report; no section of a sweep's variants.
    assert seen["sections"][0] == "verdict", seen["sections"]
    assert "variants" not in seen["sections"]
    assert seen["placeholders"] == []
    # Every panel of every chart holds data: no p95 panel without latency.
    for panel in seen["panels"]:
        assert sorted(panel["axes"]) == sorted(panel["used"]), panel["id"]
    timeline = next(p for p in seen["panels"] if p["id"] == "chart-timeline")
    assert len(timeline["axes"]) == 2, timeline  # commits/s and AAS
    # No word of a load generator, in the page or its charts.
    for where, text in [("page", seen["text"])] + [(p["id"], p["words"]) for p in seen["panels"]]:
        found = sorted({m.lower() for m in PGBENCH_WORDS.findall(text)})
        assert not found, (where, found)
    assert "commits/s" in seen["text"]
