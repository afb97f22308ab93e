"""SQL run at fixed times into a step, beside the load (e.g. a CHECKPOINT 10 s in).

A thread with its own connection, opened before the step so that connecting does not delay
the first action; each action waits for its time, runs, and is timed on the host clock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import psycopg

from pgscope.errors import TargetError
from pgscope.spec import StepAction
from pgscope.store import now_us
from pgscope.target.conn import ConnParams


@dataclass(frozen=True)
class ActionResult:
    action: StepAction
    started_us: int | None  # None: the step ended before the action's time
    ended_us: int | None
    error: str | None

    def describe(self) -> str:
        if self.started_us is None:
            return f"{self.action.sql} at +{self.action.at:g} s: not run (the step ended first)"
        took = ((self.ended_us or self.started_us) - self.started_us) / 1000
        outcome = f"failed: {self.error}" if self.error else f"took {took:.0f} ms"
        return f"{self.action.sql} at +{self.action.at:g} s: {outcome}"


class StepActions:
    def __init__(self, conn: ConnParams, actions: list[StepAction]) -> None:
        self.conn = conn
        self.actions = sorted(actions, key=lambda a: a.at)
        self.results: list[ActionResult] = []
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        """Call just before the load starts: times count from here."""
        if not self.actions:
            return
        session = self.conn.connect(application_name="pgscope-actions")
        t0 = time.monotonic()
        self.thread = threading.Thread(
            target=self._run, args=(session, t0), daemon=True, name="pgscope-actions"
        )
        self.thread.start()

    def _run(self, session: psycopg.Connection[tuple[object, ...]], t0: float) -> None:
        with session:
            for action in self.actions:
                if self.done.wait(max(0.0, t0 + action.at - time.monotonic())):
                    self.results.append(ActionResult(action, None, None, None))
                    continue
                started = now_us()
                error = None
                try:
                    session.execute(action.sql.encode())
                except psycopg.Error as exc:
                    error = " ".join(str(exc.diag.message_primary or exc).split())
                self.results.append(ActionResult(action, started, now_us(), error))

    def finish(self) -> list[ActionResult]:
        """After the load: actions not yet due are skipped; one in flight is waited for."""
        self.done.set()
        if self.thread is not None:
            self.thread.join(timeout=600)
            if self.thread.is_alive():
                raise TargetError("a step action did not finish within 10 minutes")
        return self.results
