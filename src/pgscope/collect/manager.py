"""Driving a set of collectors through a run, so that no collector can stop the run.

Every hook call is guarded: a collector that raises is stopped, recorded as failed with its
reason (table `collectors`), and the run goes on without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from pgscope.collect import build, registry
from pgscope.collect.base import Collector, CollectorContext, CollectorEnv, StepInfo
from pgscope.errors import Interrupted
from pgscope.signals import received
from pgscope.store import RunStore, now_us


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


class CollectorSet:
    def __init__(
        self,
        selection: dict[str, dict[str, Any]],
        env: CollectorEnv,
        store: RunStore,
        say: Callable[[str], None],
    ) -> None:
        self.store = store
        self.say = say
        self.active: list[Collector] = []
        self.started = False
        self.dead: dict[str, tuple[int, str]] = {}  # name -> (since, why)
        # name -> why it failed: a hook raised (it was stopped), or its stop said so
        self.failed: dict[str, str] = {}
        self.unavailable: dict[str, str] = {}
        for name, options in selection.items():
            cls = registry()[name]
            availability = cls.check(env)
            collector = build(name, options)
            store.set_collector(
                name, availability.ok, availability.reason or None, collector.options_json()
            )
            if availability.ok:
                self.active.append(collector)
            else:
                self.unavailable[name] = availability.reason
                say(f"collector {name} unavailable: {availability.reason}")

    def startup_settings(self, env: CollectorEnv) -> dict[str, str]:
        merged: dict[str, str] = {}
        for collector in self.active:
            for name, value in collector.startup_settings(env).items():
                if name == "shared_preload_libraries" and merged.get(name):
                    value = f"{merged[name]},{value}"
                merged[name] = value
        return merged

    def start(self, ctx: CollectorContext) -> None:
        self.started = True
        for collector in list(self.active):
            try:
                collector.start(ctx)
            except Exception as exc:
                self._drop(collector, "start failed", exc)
            else:
                self.store.collector_started(collector.name)

    def _each(self, hook: Callable[[Collector], None], what: str) -> None:
        for collector in list(self.active):
            try:
                hook(collector)
            except Interrupted:
                raise  # Ctrl-C, not the collector's failure
            except Exception as exc:
                signalled = received()
                if signalled is not None:  # a Ctrl-C a library answered with its own error
                    raise signalled from exc
                self._drop(collector, what, exc)

    def step_started(self, step: StepInfo) -> None:
        self._each(lambda c: c.step_started(step), "step start failed")

    def step_finished(self, step: StepInfo) -> None:
        self._each(lambda c: c.step_finished(step), "step end failed")

    def window_edge(self, ending: StepInfo, starting: StepInfo) -> None:
        self._each(lambda c: c.window_edge(ending, starting), "window edge failed")

    def written_until(self) -> int | None:
        """The earliest time up to which a running collector has written what it took in
        (None: none keeps anything back)."""
        times = []
        for collector in self.active:
            try:
                until = collector.written_until()
            except Exception:  # a health question must not stop the run
                continue
            if until is not None:
                times.append(until)
        return min(times, default=None)

    def target_restarted(self) -> None:
        self._each(lambda c: c.target_restarted(), "restart handling failed")

    def failures(self) -> dict[str, str]:
        """Collectors that stopped collecting on their own, with why."""
        found = {}
        for collector in self.active:
            try:
                reason = collector.failure()
            except Exception as exc:
                reason = f"health check raised {_describe(exc)}"
            if reason:
                found[collector.name] = reason
        return found

    def reap(self) -> None:
        """Stop and record the collectors that stopped collecting on their own. What they
        miss from now to the end of the run is a gap, recorded when the run stops."""
        for name, reason in self.failures().items():
            collector = next(c for c in self.active if c.name == name)
            self.dead[name] = (now_us(), reason)
            self._drop(collector, "stopped collecting", RuntimeError(reason))

    def stop(self) -> None:
        """Stop every collector; never raises. Every collector is stopped (its tracer or
        profiler killed) even when the store cannot take the record of it (a full disk)."""
        for name, (since, reason) in self.dead.items():
            with contextlib.suppress(Exception):
                self.store.add_gap(name, since, now_us(), f"stopped collecting: {reason}")
        self.dead = {}
        for collector in self.active:
            if not self.started:  # the run ended before collection began
                with contextlib.suppress(Exception):
                    self.store.collector_stopped(collector.name, "not started", None)
                continue
            try:
                error = collector.stop()
            except Exception as exc:  # a bug in the collector: keep the run's data anyway
                error = f"stop raised {_describe(exc)}"
            with contextlib.suppress(Exception):
                self.store.collector_stopped(
                    collector.name, "failed" if error else "complete", error
                )
            if error:
                self.failed[collector.name] = error
                self.say(f"collector {collector.name}: {error}")
        self.active = []

    def _drop(self, collector: Collector, what: str, exc: BaseException) -> None:
        reason = f"{what}: {_describe(exc)}"
        self.say(f"collector {collector.name} stopped: {reason}")
        self.failed[collector.name] = reason
        with contextlib.suppress(Exception):  # already failing; the first reason is the one
            collector.stop()
        self.active.remove(collector)
        # The reason is kept above even when the store cannot take it (a full disk).
        with contextlib.suppress(Exception):
            self.store.collector_stopped(collector.name, "failed", reason)
