"""`observe --live` shows the samples as they come, from the start: the view draws from a
thread of its own, not from the observation's loop, which begins only once every collector has
started (issue 30: kernel tracing and profiles take seconds to start, and the view showed its
first samples ~11 s after launch, seconds after the sampler began)."""

from __future__ import annotations

import contextlib
import os
import pty
import shutil
import sys
import threading
import time
from pathlib import Path

import duckdb
import psycopg
import pytest

from pgscope.target.embedded import EmbeddedCluster

CAN_TRACE = os.geteuid() == 0 and bool(shutil.which("bpftrace")) and bool(shutil.which("perf"))


def _live(args: list[str]) -> tuple[float, float | None, bytes]:
    """Run the CLI on a terminal (a pty: the view draws only on one); (its launch, the moment
    its first drawing with samples arrived, all it wrote)."""
    launched = time.time()
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child becomes the CLI
        os.execv(sys.executable, [sys.executable, "-m", "pgscope", *args])
    out, first = b"", None
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the terminal closed: the CLI exited
            break
        if not chunk:
            break
        out += chunk
        if first is None and b"AAS " in out:
            first = time.time()
    os.waitpid(pid, 0)
    os.close(fd)
    return launched, first, out


@pytest.mark.tracing
@pytest.mark.skipif(not CAN_TRACE, reason="needs root, bpftrace and perf")
def test_the_live_view_shows_samples_while_the_tracers_start(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    sleeper = cluster.conn.connect(application_name="planted-sleeper")

    def sleep() -> None:
        with contextlib.suppress(psycopg.Error):  # cancelled at the end
            sleeper.execute("SELECT pg_sleep(60)")

    thread = threading.Thread(target=sleep, daemon=True)
    thread.start()
    try:
        launched, first, out = _live(
            [
                *("observe", "--data-dir", str(cluster.data_dir), "--duration", "6"),
                *("--window", "3", "--trace", "--profile", "--live"),
                *("--results-dir", str(tmp_path / "results")),
            ]
        )
    finally:
        sleeper.cancel_safe()
        thread.join(timeout=10)
        sleeper.close()
    assert first is not None, out[-3000:]
    [run_dir] = (tmp_path / "results").iterdir()
    db = duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)
    try:
        row = db.execute(
            "SELECT (SELECT min(ts_us) FROM activity_samples), (SELECT min(started_us) FROM steps)"
        ).fetchone()
    finally:
        db.close()
    assert row is not None
    sampled, windows_began = row[0] / 1e6, row[1] / 1e6
    print(
        f"launch to first sample {sampled - launched:.1f} s, to the windows "
        f"{windows_began - launched:.1f} s, to the first drawing of samples "
        f"{first - launched:.1f} s"
    )
    # Within a batch (1 s), its write and a look for it (0.25 s) of the first sample, and so
    # before the observation's loop, which would draw a second into the first window at the
    # earliest.
    assert first - sampled < 4.0
    assert first < windows_began + 1.0
    assert b"starting" in out  # the view said the collectors were starting, meanwhile
