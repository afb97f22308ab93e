"""`pgscope observe` ends honestly (issues 27 and 30): its windows tile the time observed,
each is closed as it ends, and a kill, a full results disk or a lost server leaves the windows
closed before it readable by `report`, with a status that says what happened.

Each test observes a throw-away cluster of its own under a light load the test starts
(pgbench, two clients, a `\\sleep` between statements): pgscope only watches.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pgscope.session import Windows
from pgscope.store import now_us
from pgscope.target.embedded import EmbeddedCluster
from pgscope.target.pgbin import PgBinaries
from pgscope.target.watch import LOST_AFTER_S, ServerWatch
from tests.cli import one_line_error, pgscope, start, wait_for_line
from tests.poll import elapse, wait_until
from tests.servers import tmpfs

pytestmark = [pytest.mark.server, pytest.mark.load]

# About 150 transactions a second per client, each session active (in pg_sleep) three fifths
# of the time: light on the CPU, and every window sees both sessions and their commits. It
# reads a table: on PostgreSQL 15 a session whose transactions touch none never adds its
# commits to pg_stat_database (they wait for relation statistics to flush with).
LIGHT = "SELECT pg_sleep(0.003) FROM pg_class LIMIT 1;\n\\sleep 2 ms\n"
CAN_TRACE = os.geteuid() == 0 and bool(shutil.which("bpftrace")) and bool(shutil.which("perf"))


@pytest.fixture
def light_load(pg: PgBinaries, cluster: EmbeddedCluster, tmp_path: Path) -> Iterator[None]:
    """Two pgbench clients for up to two minutes, stopped when the test ends."""
    script = tmp_path / "light.sql"
    script.write_text(LIGHT)
    script.chmod(0o644)
    load = subprocess.Popen(
        [
            str(pg.path("pgbench")), "-n", "-f", str(script), "-c", "2", "-j", "1",
            "-T", "120", cluster.conn.conninfo(),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield
    finally:
        load.terminate()
        try:
            load.wait(timeout=30)
        except subprocess.TimeoutExpired:
            load.kill()
            load.wait()


WINDOW_S = 2
# A window's samples are written within a second or two of its end (the sampler's batch, then
# the flush its end asks for), and it is closed at the next tick (a second at most) after
# they are, or after Windows.CLOSE_WAIT_S without them: one that ended this long before a
# kill or a fault is closed, however late a loaded host wrote its samples.
CLOSED_WITHIN_S = Windows.CLOSE_WAIT_S + 1.0
# Time observed before the blow: at least two windows ended CLOSED_WITHIN_S before it.
OBSERVED_S = 2 * WINDOW_S + CLOSED_WITHIN_S + 3


def windows_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["observation"]["windows"])


def assert_tiled(windows: list[dict[str, Any]]) -> None:
    """Window N ends where N+1 begins (to the millisecond)."""
    for before, after in itertools.pairwise(windows):
        assert abs(after["start_us"] - before["end_us"]) <= 1000, (before, after)


def report(run_dir: Path) -> dict[str, Any]:
    """`pgscope report --json` of a run folder, as a user reads it afterwards."""
    result = pgscope("report", str(run_dir), "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def measured_cells(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The cells the windows measured (a window left out, `cut` or idle, has its own empty
    cell at its rounded concurrency)."""
    return [c for c in doc["scalability"]["cells"] if c["repeats"]]


def observing(cluster: EmbeddedCluster, results: Path) -> subprocess.Popen[str]:
    """`pgscope observe` of the cluster for two minutes in windows of 2 s, in the background,
    once it has begun."""
    watcher = start(
        [
            "observe", "--data-dir", str(cluster.data_dir), "--duration", "120", "--window",
            str(WINDOW_S), "--results-dir", str(results),
        ]
    )  # fmt: skip
    wait_for_line(watcher, "observing postmaster", timeout=60)
    return watcher


def let_windows_pass(seconds: float) -> None:
    """What these tests count is time observed: they let it pass, then judge the windows by
    the store's own times (its first window's start, and when the test struck)."""
    elapse(seconds, "time observed")


def assert_closed_before(windows: list[dict[str, Any]], struck_us: int) -> list[dict[str, Any]]:
    """Every window that ended CLOSED_WITHIN_S before `struck_us` is closed, with figures;
    none ended after it; the rest are `cut`. Returns the closed ones."""
    first_us = windows[0]["start_us"]
    ended = int((struck_us - first_us) / 1e6 // WINDOW_S)
    closed = [w for w in windows if w["status"] != "cut"]
    print(f"\n{ended} windows ended before the blow, {len(closed)} closed, {len(windows)} in all")
    assert len(closed) >= ended - CLOSED_WITHIN_S // WINDOW_S - 1, windows
    for w in windows:
        if w["end_us"] is not None and w["end_us"] <= struck_us - CLOSED_WITHIN_S * 1e6:
            assert w["status"] == "ok", w
    for w in closed:
        assert w["end_us"] <= struck_us, w
        assert w["status"] == "ok", w
        assert w["tps"] > 50 and 1.5 <= w["concurrency"] <= 2.5, w
    assert_tiled(closed)
    assert all(w["status"] == "cut" for w in windows[len(closed) :]), windows
    return closed


def covered_s(windows: list[dict[str, Any]]) -> float:
    """The time the windows cover, each from its start to its end."""
    return sum((w["end_us"] - w["start_us"]) / 1e6 for w in windows if w["end_us"])


@pytest.mark.tracing
@pytest.mark.skipif(not CAN_TRACE, reason="needs root, bpftrace and perf")
@pytest.mark.usefixtures("light_load")
def test_windows_cover_the_observation_under_trace_and_profile(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    """Issue 30: with --trace --profile the work at each window's edge (perf's recording
    stopped and folded, the next one started) took seconds, and it fell between windows: 87 s
    of 120 covered. The windows now share their edges: they cover the time asked for."""
    result = pgscope(
        "observe", "--data-dir", str(cluster.data_dir), "--duration", "30", "--window", "5",
        "--trace", "--profile", "--json", "--results-dir", str(tmp_path / "results"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    windows = windows_of(doc)
    covered = covered_s(windows)
    print(f"\ncovered {covered:.2f} s of 30 s ({covered / 30:.1%}) in {len(windows)} windows")
    assert covered / 30 >= 0.95, windows
    assert_tiled(windows)
    # The profiles cover the edges too: each window's recording stops after the next began.
    db = duckdb.connect(str(Path(doc["run_dir"]) / "run.duckdb"), read_only=True)
    try:
        recordings = db.execute(
            "SELECT step_id, started_us, ended_us FROM profiles WHERE kind = 'cpu' ORDER BY step_id"
        ).fetchall()
    finally:
        db.close()
    assert [r[0] for r in recordings] == [w["step_id"] for w in windows], recordings
    for (_, _, ended), (_, started, _) in itertools.pairwise(recordings):
        assert ended >= started, recordings


def test_windows_tile_and_cover_an_ordinary_observation(
    cluster: EmbeddedCluster, light_load: None, tmp_path: Path
) -> None:
    """Window N ends where N+1 begins, the last one ends with the observation, and each is
    an ordinary window of the load."""
    result = pgscope(
        "observe", "--dsn", cluster.conn.conninfo(), "--duration", "8", "--window", "2",
        "--json", "--results-dir", str(tmp_path / "results"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    assert doc["status"] == "complete"
    windows = windows_of(doc)
    assert len(windows) == 4, windows
    assert_tiled(windows)
    assert covered_s(windows) >= 0.95 * 8, windows
    for w in windows:
        assert w["status"] == "ok", w
        assert 1.5 <= w["concurrency"] <= 2.5 and w["tps"] > 50, w


def test_a_killed_observation_keeps_every_window_closed_before_the_kill(
    cluster: EmbeddedCluster, light_load: None, tmp_path: Path
) -> None:
    """Issue 27: after SIGKILL `report` said "Nothing to diagnose" although 1,050 samples
    were kept (windows were filled in only at a normal end). Each window is now closed as it
    ends: `report` reads every one closed before the kill, and says the observation was
    interrupted."""
    watcher = observing(cluster, tmp_path / "results")
    try:
        let_windows_pass(OBSERVED_S)
        killed_us = now_us()
        watcher.send_signal(signal.SIGKILL)
        watcher.wait(timeout=10)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    [run_dir] = list((tmp_path / "results").iterdir())
    doc = report(run_dir)
    assert doc["status"] == "interrupted", doc["status"]
    assert "killed" in doc["status_reason"], doc["status_reason"]
    closed = assert_closed_before(windows_of(doc), killed_us)
    assert len(closed) >= 2
    assert f"the {len(closed)} windows closed before are kept" in doc["status_reason"]
    # Judged from those windows: the load's own cell, not "Nothing to diagnose".
    assert not doc["diagnosis"]["verdict"].startswith("Nothing to diagnose"), doc["diagnosis"]
    [cell] = measured_cells(doc)
    assert cell["clients"] == 2 and cell["repeats"] == len(closed), cell


def fill(mount: Path) -> None:
    """Take every byte left on the file system at `mount` (while pgscope writes there too)."""
    fd = os.open(mount / "filler", os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        for chunk in (1 << 20, 4096):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)


def test_a_full_results_disk_stops_the_observation_and_keeps_its_windows(
    cluster: EmbeddedCluster, light_load: None, tmp_path: Path
) -> None:
    """Issue 27: a full results disk ended `observe` with exit 1, "internal error", and no
    sample kept. Now the observation stops, keeps what was written, says so in one line with
    the environment's exit code (4), and its status names the fault; `report` afterwards, the
    disk still full, reads every window closed before it."""
    with tmpfs(tmp_path / "results", "32m") as results:
        watcher = observing(cluster, results)
        try:
            let_windows_pass(OBSERVED_S)
            filled_us = now_us()
            fill(results)
            _, err = watcher.communicate(timeout=90)
        finally:
            if watcher.poll() is None:
                watcher.kill()
                watcher.wait()
        error = one_line_error(subprocess.CompletedProcess([], watcher.returncode, "", err))
        print(error, sorted(p.name for p in results.rglob("*")))
        assert watcher.returncode == 4, err[-3000:]
        assert error.startswith("pgscope: error: the results disk is full"), error
        [run_dir] = [p for p in results.iterdir() if p.is_dir()]
        assert f"closed before it in {run_dir}" in error, error
        doc = report(run_dir)
        assert doc["status"] == "stopped", doc["status"]
        assert doc["status_reason"].startswith("the results disk is full"), doc["status_reason"]
        closed = assert_closed_before(windows_of(doc), filled_us)
        assert len(closed) >= 2
        assert f"kept the {len(closed)} windows closed before it" in error, error
        stopped_us = doc["ended_us"]
        assert stopped_us - filled_us < 5e6, "stopped within seconds of the disk filling"


def test_a_lost_server_ends_the_observation_within_seconds(
    cluster: EmbeddedCluster, light_load: None, tmp_path: Path
) -> None:
    """Issue 27: after `kill -9` of the postmaster, `observe` watched a dead server for the
    rest of its 120 s, then said "complete" with a CPU-bound verdict. Now it notices within
    seconds, stops, keeps the windows closed before the loss, and says the server was lost,
    and when, with the target's exit code (5)."""
    watcher = observing(cluster, tmp_path / "results")
    postmaster = cluster.postmaster_pid
    assert postmaster is not None
    try:
        let_windows_pass(OBSERVED_S)
        killed_us = now_us()
        os.kill(postmaster, signal.SIGKILL)
        _, err = watcher.communicate(timeout=90)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    error = one_line_error(subprocess.CompletedProcess([], watcher.returncode, "", err))
    print(error)
    assert watcher.returncode == 5, err[-3000:]
    assert "the server was lost at" in error and f"postmaster {postmaster} exited" in error
    [run_dir] = list((tmp_path / "results").iterdir())
    doc = report(run_dir)
    assert doc["status"] == "stopped", doc["status"]
    assert doc["status_reason"].startswith("the server was lost at"), doc["status_reason"]
    assert doc["ended_us"] - killed_us < 5e6, "stopped within seconds of the loss"
    closed = assert_closed_before(windows_of(doc), killed_us)
    assert len(closed) >= 2
    assert f"kept the {len(closed)} windows closed before it" in error, error
    # Judged on the windows before the loss alone: every cell is theirs.
    [cell] = measured_cells(doc)
    assert cell["clients"] == 2 and cell["repeats"] == len(closed), cell


def test_a_server_elsewhere_is_lost_after_seconds_without_an_answer(
    cluster: EmbeddedCluster,
) -> None:
    """A server not on this host has no process to watch: a probe of its own, and lost after
    LOST_AFTER_S without an answer (here: shut down)."""
    watch = ServerWatch(None, cluster.conn)
    try:
        answered_us = now_us()
        assert watch.check() is None
        cluster.stop()
        stopped_us = now_us()
        lost = wait_until(watch.check, "the loss noticed", LOST_AFTER_S + 5, every=0.2)
        noticed_us = now_us()
        # Last seen while it answered (at or after the check above, before the stop ended),
        # and lost only once LOST_AFTER_S have passed since, however long the stop took.
        assert answered_us <= lost.seen_us <= stopped_us, (answered_us, lost, stopped_us)
        assert noticed_us - lost.seen_us >= LOST_AFTER_S * 1e6, "a dropped connection is no loss"
        assert lost.why.startswith("no answer from"), lost.why
    finally:
        watch.close()
