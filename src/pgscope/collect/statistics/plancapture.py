"""Actual plans of the statements that run, captured by auto_explain on clusters pgscope
starts, for the statements collector: which plan node, trigger or nested statement a
statement's time went to, and how many rows each node read and threw away.

auto_explain times every node of the statements it samples (`log_analyze`, `log_timing`,
`log_buffers`, `log_triggers`, nested statements too) and logs the plan as JSON. Sampling keeps
the cost bounded: about `plans_per_s` top-level statements a second are sampled, whatever the
load's rate. The rate is set before each step from the last step's statements per second, and
corrected once a second into the step from this step's own (`ALTER SYSTEM` of
`auto_explain.sample_rate`, then a reload, which the running sessions take at their next
statement); between steps it is 0. pgscope's own sessions never sample (target/conn.py).

At each step's end the new part of the server log is read (the run's `server.log`, or the
logging collector's current file where a spec turns it on), its plans kept in `plan_samples`:
at most `MAX_PER_STATEMENT` executions per top-level statement and step, each with the plans
of the statements nested in it (at most `MAX_NESTED`).

Never on a user's server: it would change the server's settings.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg

from pgscope.collect.statistics.planlog import LoggedPlan, parse_plans
from pgscope.store import RunStore
from pgscope.target.conn import ConnParams

APPLICATION_NAME = "pgscope-plans"
SETTINGS = {
    # Every statement auto_explain samples is timed and logged, whatever its duration.
    "auto_explain.log_min_duration": "0",
    "auto_explain.log_analyze": "on",
    "auto_explain.log_buffers": "on",
    "auto_explain.log_timing": "on",
    "auto_explain.log_triggers": "on",
    "auto_explain.log_nested_statements": "on",
    "auto_explain.log_format": "json",
    "auto_explain.sample_rate": "0",
}
MAX_PER_STATEMENT = 20
MAX_NESTED = 50
# How long into a step its own rate is measured (the warm-up's first second).
MEASURE_AFTER_S = 1.0
TOP_LEVEL_CALLS_SQL = "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE toplevel"


class PlanCapture:
    """The plans of one run's steps: the sample rate, and the log read after each step."""

    def __init__(
        self, conn: ConnParams, store: RunStore, log: Path, plans_per_s: float, say: Any
    ) -> None:
        self.conn = conn
        self.store = store
        self.log = log
        self.plans_per_s = plans_per_s
        self.say = say
        self.offset = log.stat().st_size if log.is_file() else 0
        self.calls_per_s: float | None = None  # the last step's top-level statements a second
        self.stop_measuring = threading.Event()
        self.measurer: threading.Thread | None = None

    def step_started(self) -> None:
        if self.calls_per_s:
            self._set_rate(self.plans_per_s / self.calls_per_s)
        self.stop_measuring.clear()
        self.measurer = threading.Thread(target=self._measure, name="pgscope-plans", daemon=True)
        self.measurer.start()

    def _measure(self) -> None:
        """The step's own rate, a second in: the sample rate that gives `plans_per_s`."""
        with (
            contextlib.suppress(psycopg.Error, OSError),
            self.conn.connect(application_name=APPLICATION_NAME) as session,
        ):
            if self.stop_measuring.wait(MEASURE_AFTER_S):
                return
            first = _calls(session)
            if self.stop_measuring.wait(1.0):
                return
            rate = _calls(session) - first
            if rate > 0:
                self.calls_per_s = rate
                self._set_rate(self.plans_per_s / rate, session)

    def step_finished(self, step_id: int, started_us: int) -> int:
        """Sampling off, and the step's plans from the log into the store; how many."""
        self.stop_measuring.set()
        if self.measurer is not None:
            self.measurer.join(timeout=5)
        self._set_rate(0.0)
        return self._read_log(step_id, started_us)

    def _set_rate(self, rate: float, session: psycopg.Connection[Any] | None = None) -> None:
        rate = max(0.0, min(1.0, rate))
        with contextlib.ExitStack() as stack:
            if session is None:
                session = stack.enter_context(self.conn.connect(application_name=APPLICATION_NAME))
            session.execute(f"ALTER SYSTEM SET auto_explain.sample_rate = {rate:.6g}")
            session.execute("SELECT pg_reload_conf()")

    def _read_log(self, step_id: int, started_us: int) -> int:
        try:
            with self.log.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return 0
        # Whole lines only: a message still being written is read after the next step.
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        plans = [
            p for p in parse_plans(chunk[:end].decode(errors="replace")) if p.ts_us >= started_us
        ]
        kept = _kept(plans)
        if kept:
            self.store.append(
                "plan_samples",
                {
                    "step_id": [step_id] * len(kept),
                    "ts_us": [p.ts_us for p, _ in kept],
                    "pid": [p.pid for p, _ in kept],
                    "queryid": [p.query_id for p, _ in kept],
                    "execution": [n for _, n in kept],
                    "nested": [p.nested for p, _ in kept],
                    "duration_ms": [p.duration_ms for p, _ in kept],
                    "query_text": [p.query_text[:2000] for p, _ in kept],
                    "context": [p.context[:1000] for p, _ in kept],
                    "plan": [json.dumps(p.plan) for p, _ in kept],
                },
            )
        return sum(1 for p, _ in kept if not p.nested)


def _calls(session: psycopg.Connection[Any]) -> float:
    row = session.execute(TOP_LEVEL_CALLS_SQL).fetchone()
    return float(row[0]) if row else 0.0


def _kept(plans: list[LoggedPlan]) -> list[tuple[LoggedPlan, int]]:
    """Plans grouped into executions (a top-level plan and the nested ones its backend logged
    before it), at most MAX_PER_STATEMENT executions per statement, numbered in the step."""
    kept: list[tuple[LoggedPlan, int]] = []
    waiting: dict[int, list[LoggedPlan]] = defaultdict(list)  # per pid: nested, not yet placed
    per_statement: dict[int | None, int] = defaultdict(int)
    execution = 0
    for plan in plans:
        if plan.nested:
            waiting[plan.pid].append(plan)
            continue
        nested = waiting.pop(plan.pid, [])
        if per_statement[plan.query_id] >= MAX_PER_STATEMENT:
            continue
        per_statement[plan.query_id] += 1
        execution += 1
        kept += [(p, execution) for p in nested[:MAX_NESTED] if p.query_id == plan.query_id]
        kept.append((plan, execution))
    return kept
