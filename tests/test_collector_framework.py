"""The collector protocol through a real run: unavailable, crashing and working collectors."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pgscope.collect import registry
from pgscope.collect.base import (
    Availability,
    Collector,
    CollectorContext,
    CollectorEnv,
    StepInfo,
)
from pgscope.runner.run import RunOptions, execute
from pgscope.spec import load_spec


class Quiet:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def phase(self, message: str) -> None:
        self.lines.append(message)

    def step_started(self, *args: object) -> None: ...
    def progress(self, *args: object) -> None: ...
    def step_finished(self, *args: object) -> None: ...


class Absent(Collector):
    name = "test-absent"
    summary = "never available"
    cost = "none"

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        return Availability.no("needs the moon (fix: wait for night)")

    def start(self, ctx: CollectorContext) -> None:
        raise AssertionError("an unavailable collector must not start")

    def stop(self) -> str | None:
        return None


class Crashing(Collector):
    name = "test-crashing"
    summary = "fails at the second step"
    cost = "none"

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        return Availability.yes()

    def start(self, ctx: CollectorContext) -> None:
        self.steps = 0

    def step_started(self, step: StepInfo) -> None:
        self.steps += 1
        if self.steps == 2:
            raise RuntimeError("probe vanished")

    def stop(self) -> str | None:
        return None


class Ticker(Collector):
    """Writes one row per 100 ms from its own thread, and asks for a startup setting."""

    name = "test-ticker"
    summary = "ticks"
    cost = "none"

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        return Availability.yes()

    def startup_settings(self, env: CollectorEnv) -> dict[str, str]:
        return {"work_mem": "7MB"}

    def start(self, ctx: CollectorContext) -> None:
        self.step_id: int | None = None
        self.done = threading.Event()
        self.steps_seen: list[int] = []
        store = ctx.store.writer()

        def tick() -> None:
            while not self.done.wait(0.1):
                store.append(  # a table every store has (pgscope.tables declares the rest)
                    "events",
                    {"ts_us": [time.time_ns() // 1000], "step_id": [self.step_id],
                     "kind": ["tick"]},
                )  # fmt: skip

        self.thread = threading.Thread(target=tick, daemon=True)
        self.thread.start()

    def step_started(self, step: StepInfo) -> None:
        self.step_id = step.step_id
        self.steps_seen.append(step.step_id)

    def step_finished(self, step: StepInfo) -> None:
        self.step_id = None

    def stop(self) -> str | None:
        self.done.set()
        self.thread.join(5)
        return None


@pytest.fixture
def test_collectors() -> Iterator[None]:
    known = registry()
    for cls in (Absent, Crashing, Ticker):
        known[cls.name] = cls
    yield
    for cls in (Absent, Crashing, Ticker):
        known.pop(cls.name)


@pytest.mark.server
def test_a_run_survives_absent_and_crashing_collectors(
    test_collectors: None, tmp_path: Path
) -> None:
    selection = {"test-absent": {}, "test-crashing": {}, "test-ticker": {}}
    loaded = load_spec(
        "scaling",
        overrides={
            "clients": [1, 2, 3],
            "duration": 1,
            "warmup": 0,
            "repeats": 1,
            "scale": 1,
            "order": "sequential",
            "collectors": selection,
            "settings": {"shared_buffers": "128MB"},
        },
    )
    reporter = Quiet()
    outcome = execute(loaded, RunOptions(tmp_path, "pgscope test"), reporter)
    assert outcome.status == "complete", outcome.error
    db = duckdb.connect(str(outcome.run_dir / "run.duckdb"), read_only=True)
    try:
        rows = {
            r[0]: r[1:]
            for r in db.execute(
                "SELECT name, available, reason, status, error FROM collectors"
            ).fetchall()
        }
        assert rows["test-absent"] == (False, "needs the moon (fix: wait for night)", "off", None)
        assert rows["test-crashing"][:2] == (True, None)
        assert rows["test-crashing"][2:] == ("failed", "step start failed: probe vanished")
        assert rows["test-ticker"] == (True, None, "complete", None)
        ticks = db.execute(
            "SELECT step_id, count(*) FROM events WHERE kind = 'tick' AND step_id IS NOT NULL "
            "GROUP BY 1 ORDER BY 1"
        ).fetchall()
        assert [s for s, _ in ticks] == [1, 2, 3]
        assert all(n >= 5 for _, n in ticks), ticks
        work_mem = db.execute("SELECT setting FROM settings WHERE name = 'work_mem'").fetchall()
        assert work_mem == [(str(7 * 1024),)]
        statuses = db.execute("SELECT status FROM steps").fetchall()
        assert statuses == [("ok",)] * 3, "a crashing collector must not fail the steps"
    finally:
        db.close()
    said = " | ".join(reporter.lines)
    assert "collector test-absent unavailable: needs the moon" in said
    assert "collector test-crashing stopped: step start failed: probe vanished" in said


def test_the_host_collector_survives_a_process_that_vanishes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process that exits between listing /proc and reading its stat file is skipped, not an
    error that stops the host collector for the rest of the run."""
    from pgscope.collect.statistics import host

    victim = str(os.getpid())
    read = host.Path.read_text

    def vanishing(self: Path, *args: Any, **kwargs: Any) -> str:
        if self.parent.name == victim:
            raise FileNotFoundError(self)
        return read(self, *args, **kwargs)

    monkeypatch.setattr(host.Path, "read_text", vanishing)
    found = host._processes()
    assert os.getpid() not in found
    assert found[1].parent == 0, "the others are read"
    assert host._process_ticks(os.getpid()) == 0
