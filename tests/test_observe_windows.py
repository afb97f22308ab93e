"""An observation's worst window judged on its own, and a window that differs sharply marked
and explained (issue 14), on small synthetic observation stores: no server, seconds each.

The store is what `observe` would have recorded of 4 client sessions over 8 windows of 5 s:
activity samples at 20 Hz and commit counts at each window's edges. In the planted case one
window is a lock pile-up (every session waits on one advisory lock, commits drop to a tenth);
in the control every window is alike.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from pgscope.analyze import live, waits
from pgscope.analyze.load import load_analysis
from pgscope.analyze.model import RunAnalysis, from_document, to_document
from pgscope.duck import connect
from pgscope.render.console import print_summary
from pgscope.render.html import report_html
from pgscope.render.waits import live_view
from pgscope.store import RunStore
from pgscope.windows import VARIANT, close_windows
from tests.stores import observation_begun

T0 = 1_790_000_000_000_000
WINDOW_S = 5
WINDOWS = 8
SESSIONS = 4
HZ = 20
PILE_UP = 5  # the window (step id) of the planted lock pile-up
COMMITS_PER_S = 2000.0


def observation_store(
    run_dir: Path, pile_up: bool, closing: str = "at the end", last_s: float = WINDOW_S
) -> None:
    """The store as `observe` leaves it. `closing`: "at the end" (every window at once),
    "as they end" (one at a time, as `observe` does), or "killed" (the last window never
    closed, the run never finished). `last_s`: the last window's length."""
    store = observation_begun(run_dir, T0, "test")
    db = store.db
    pile_from, pile_to = (PILE_UP - 1) * WINDOW_S * HZ, PILE_UP * WINDOW_S * HZ
    planted = "TRUE" if pile_up else "FALSE"
    # Outside the pile-up: on CPU 3 samples in 5, else in the application's pg_sleep (no lock
    # wait; a session reading from its client would be idle, not active).
    db.execute(
        f"""
        INSERT INTO activity_samples
        SELECT {T0} + (s * 1000000 // {HZ})::BIGINT, s + 1, 1000 + p, 'client backend',
               'active',
               CASE WHEN pile THEN 'Lock' WHEN r < 3 THEN NULL ELSE 'Timeout' END,
               CASE WHEN pile THEN 'advisory' WHEN r < 3 THEN NULL ELSE 'PgSleep' END,
               7000, 'app', 'app', 'app', NULL
        FROM (SELECT s, p, (hash(s * 10 + p) % 5)::INTEGER AS r,
                     {planted} AND s >= {pile_from} AND s < {pile_to} AND p > 0 AS pile
              FROM range({WINDOWS * WINDOW_S * HZ}) t(s), range({SESSIONS}) u(p))
        """
    )
    db.execute(
        "INSERT INTO activity_queries VALUES (7000, 'SELECT pg_advisory_xact_lock(42)', ?)", [T0]
    )
    commits = 0.0
    for w in range(1, WINDOWS + 1):
        start, end = T0 + (w - 1) * WINDOW_S * 1_000_000, T0 + w * WINDOW_S * 1_000_000
        if w == WINDOWS:
            end = start + int(last_s * 1_000_000)
        rate = COMMITS_PER_S / 10 if pile_up and w == PILE_UP else COMMITS_PER_S
        seconds = (end - start) / 1e6
        db.execute(
            "INSERT INTO steps (step_id, variant, clients, repeat, duration_s, started_us, "
            "ended_us, status) VALUES (?, ?, 0, 1, ?, ?, ?, 'running')",
            [w, VARIANT, WINDOW_S, start, end],
        )
        # Windows share their edges: one snapshot ends a window and begins the next.
        for mark, ts, value in (("start", start, commits), ("end", end, commits + rate * seconds)):
            db.execute(
                "INSERT INTO pgstats_counters VALUES (?, 'pg_stat_database', 'app', "
                "'xact_commit', ?, ?, ?)",
                [ts, value, w, mark],
            )
        commits += rate * seconds
    if closing == "as they end":
        for w in range(1, WINDOWS + 1):
            close_windows(store, [w])
    elif closing == "killed":
        close_windows(store, list(range(1, WINDOWS)))
        store.close()  # no status, no collector stopped: as a SIGKILL leaves it
        return
    else:
        close_windows(store)
    store.collector_stopped("activity", "complete")
    store.collector_stopped("pgstats", "complete")
    store.finish_run("complete")
    store.close()


@pytest.fixture(scope="module")
def analyses(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, RunAnalysis]:
    out = {}
    for pile_up in (True, False):
        run_dir = tmp_path_factory.mktemp("observed") / ("pile-up" if pile_up else "steady")
        observation_store(run_dir, pile_up)
        out[pile_up] = load_analysis(run_dir, bootstrap=20)
    return out


def test_a_lock_pile_up_window_is_marked_and_explained_in_the_timeline(
    analyses: dict[bool, RunAnalysis],
) -> None:
    observed = analyses[True].observation
    assert observed is not None
    assert observed.outliers == [PILE_UP]
    window = next(w for w in observed.windows if w.step_id == PILE_UP)
    assert window.outlier is not None
    assert "90% below the median window's 2,000 commits/s" in window.outlier, window.outlier
    assert "its top wait was Lock:advisory (75% of active time), elsewhere CPU" in window.outlier
    marks = [m for m in analyses[True].timeline.series.markers if m[1] == "outlier"]
    assert len(marks) == 1
    at, _, label = marks[0]
    assert at == pytest.approx((PILE_UP - 1) * WINDOW_S, abs=0.01)
    assert label == f"outlier: window {PILE_UP} — {window.outlier}"
    steady = analyses[False].observation
    assert steady is not None and steady.outliers == []
    assert not [m for m in analyses[False].timeline.series.markers if m[1] == "outlier"]


def test_the_worst_window_is_judged_by_the_rules_beside_the_whole(
    analyses: dict[bool, RunAnalysis],
) -> None:
    """The pile-up is 5 s of 40: the whole observation's waits are a fifth advisory lock,
    the worst window's three quarters. The window's judgement names the queue and says the
    whole does not lead with it; without the pile-up no window shows a lock queue."""
    planted = analyses[True]
    assert planted.observation is not None and planted.observation.worst_window == PILE_UP
    assert planted.diagnosis is not None
    judged = planted.diagnosis.worst_window
    assert judged is not None and judged.step_id == PILE_UP
    assert judged.findings and judged.findings[0].id == "object-lock-queue", judged.findings
    evidence = {f.name: f.value for f in judged.findings[0].evidence}
    assert evidence["wait.share.Lock:advisory"] == pytest.approx(0.75, abs=0.02)
    # Pooled over the 8 windows the queue is under a tenth of active time: below the rule.
    assert "object-lock-queue" not in [f.id for f in planted.diagnosis.findings]
    assert judged.note == (
        f"window {PILE_UP}, the worst, shows a cause the whole observation does not: Sessions "
        f"queue on relation, advisory or extension locks (Lock:advisory share of active time "
        f"in window {PILE_UP}: 75%)"
    )
    control = analyses[False].diagnosis
    assert control is not None and control.worst_window is not None
    assert "object-lock-queue" not in [f.id for f in control.worst_window.findings]
    # In the JSON document and both renderings.
    document = to_document(planted)
    assert document["diagnosis"]["worst_window"]["step_id"] == PILE_UP
    assert document["diagnosis"]["worst_window"]["note"] == judged.note
    assert from_document(document).diagnosis == planted.diagnosis
    console = Console(record=True, width=400)
    print_summary(console, planted)
    assert f"worst window: {judged.note}" in console.export_text()


def test_the_live_view_leads_with_the_finding_of_its_last_seconds(tmp_path: Path) -> None:
    """`observe --live`: the rules over the view's last seconds of samples. Over the pile-up
    window they name the lock queue; over a steady window nothing, and the view says so."""
    run_dir = tmp_path / "pile-up"
    observation_store(run_dir, pile_up=True)
    store = RunStore.open(run_dir)
    try:
        start = T0 + (PILE_UP - 1) * WINDOW_S * 1_000_000
        piled = waits.profile(store.db, start, start + WINDOW_S * 1_000_000 - 1)
        steady = waits.profile(store.db, T0, T0 + WINDOW_S * 1_000_000 - 1)
        sessions = live.client_sessions(store.db, start)
    finally:
        store.close()
    assert sessions == pytest.approx(SESSIONS)
    leading = live.leading_finding(piled, sessions)
    assert leading is not None and leading.id == "object-lock-queue"
    assert live.leading_finding(steady, sessions) is None
    assert live.leading_finding(waits.Profile([], 0, 0, 0.0), sessions) is None
    analysis = waits.WaitAnalysis(piled, [], [], None, None)
    console = Console(record=True, width=120)
    console.print(live_view(analysis, 12, 60, 10, "observe", leading))
    text = console.export_text()
    assert text.startswith("pgscope observe")
    assert (
        "leading finding, last 10 s: Sessions queue on relation, advisory or extension locks "
        "(high)" in text
    )
    assert "Lock:advisory share of active time in the last seconds: 75%" in text
    console = Console(record=True, width=120)
    console.print(live_view(analysis, 12, 60, 10, "observe", "none yet"))
    assert "leading finding, last 10 s: none yet" in console.export_text()


def closed_figures(run_dir: Path) -> dict[str, list[tuple[object, ...]]]:
    store = RunStore.open(run_dir)
    try:
        return {
            "steps": store.db.execute(
                "SELECT step_id, status, clients, tps, xacts, window_start_us, window_end_us "
                "FROM steps ORDER BY step_id"
            ).fetchall(),
            "windows": store.db.execute("SELECT * FROM windows ORDER BY step_id").fetchall(),
            "timeline": store.db.execute(
                "SELECT step_id, ts_us, tps FROM timeline ORDER BY ts_us"
            ).fetchall(),
        }
    finally:
        store.close()


def test_windows_closed_one_at_a_time_have_the_figures_of_windows_closed_at_the_end(
    tmp_path: Path,
) -> None:
    """`observe` closes each window as it ends, with the same SQL restricted to it: the
    figures are those of every window closed at once."""
    for closing in ("at the end", "as they end"):
        observation_store(tmp_path / closing, pile_up=True, closing=closing)
    at_end, as_they_end = (
        closed_figures(tmp_path / "at the end"),
        closed_figures(tmp_path / "as they end"),
    )
    assert at_end == as_they_end
    assert [row[1] for row in at_end["steps"]] == ["ok"] * WINDOWS
    assert len(at_end["timeline"]) == WINDOWS  # one rate per window: its edges' snapshots


def test_a_short_last_window_is_kept_and_never_the_worst(tmp_path: Path) -> None:
    """Issue 30: a 3.8-s last window of 10-s ones became the worst. A window under half its
    planned length is `short`: kept with its figures, neither a cell, an outlier nor the
    worst window, even when its commits/s are the lowest."""
    run_dir = tmp_path / "short"
    observation_store(run_dir, pile_up=False, last_s=1.5)
    store = RunStore.open(run_dir)
    try:
        # Its commits lag, as a window's few seconds can: the fewest per session of all.
        store.db.close()
        store.db = connect(str(run_dir / "run.duckdb"))
        store.db.execute("UPDATE steps SET tps = tps / 10 WHERE step_id = ?", [WINDOWS])
    finally:
        store.close()
    analysis = load_analysis(run_dir, bootstrap=20)
    observed = analysis.observation
    assert observed is not None
    last = observed.windows[-1]
    assert last.status == "short" and last.tps == pytest.approx(COMMITS_PER_S / 10), last
    assert last.seconds == pytest.approx(1.5)
    assert observed.worst_window != WINDOWS and observed.worst_window is not None
    assert WINDOWS not in observed.outliers
    [cell] = [c for c in analysis.scalability.cells if c.repeats]
    assert cell.repeats == WINDOWS - 1
    # A last window of half the length or more is an ordinary one.
    observation_store(tmp_path / "half", pile_up=False, last_s=WINDOW_S / 2)
    half = load_analysis(tmp_path / "half", bootstrap=20).observation
    assert half is not None and half.windows[-1].status == "ok"


def test_a_killed_observation_is_read_from_the_windows_it_closed(tmp_path: Path) -> None:
    """Issue 27: `report` of a killed observation said "Nothing to diagnose". Each window was
    closed as it ended: the analysis reads them, says the observation was interrupted and how
    many windows it kept, and the window never closed is `cut`, out of every judgement."""
    run_dir = tmp_path / "killed"
    observation_store(run_dir, pile_up=True, closing="killed")
    analysis = load_analysis(run_dir, bootstrap=20)
    assert analysis.status == "interrupted"
    assert analysis.status_reason == (
        f"the observation ended without finishing (killed?); the {WINDOWS - 1} windows closed "
        f"before are kept"
    )
    observed = analysis.observation
    assert observed is not None
    assert [w.status for w in observed.windows] == ["ok"] * (WINDOWS - 1) + ["cut"]
    assert observed.outliers == [PILE_UP] and observed.worst_window == PILE_UP
    [cell] = [c for c in analysis.scalability.cells if c.repeats]
    assert cell.repeats == WINDOWS - 1
    assert analysis.diagnosis is not None
    assert not analysis.diagnosis.verdict.startswith("Nothing to diagnose")
    assert analysis.diagnosis.worst_window is not None
    assert analysis.diagnosis.worst_window.findings[0].id == "object-lock-queue"


def test_an_observations_report_names_observes_own_flags(
    analyses: dict[bool, RunAnalysis],
) -> None:
    """A section left empty says how observe would fill it (--trace, --profile), never
    `run`'s --collectors, which observe does not have."""
    page = report_html(analyses[True])
    assert "observe with --trace" in page and "observe with --profile" in page
    assert "--collectors" not in page
