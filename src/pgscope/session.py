"""Standalone collection: one or more collectors for a fixed time against a running server.

`pgscope sample`, `trace` and `profile` use this: no pgbench, no steps, but the same run
folder, store and collector protocol as `pgscope run`, so `pgscope report` reads the result.
SIGINT/SIGTERM stop the collectors and keep what they recorded.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgscope import __version__
from pgscope.collect.base import CollectorContext, CollectorEnv, StepInfo
from pgscope.collect.manager import CollectorSet
from pgscope.errors import EnvironmentProblem, ExitCode, Interrupted
from pgscope.host import describe_host
from pgscope.runner.run import new_run_id
from pgscope.signals import signals_as_exceptions
from pgscope.store import RunMeta, RunStore
from pgscope.target.conn import ConnParams
from pgscope.target.introspect import server_identity, server_version
from pgscope.target.local import LocalServer
from pgscope.target.pgbin import PgBinaries
from pgscope.windows import VARIANT, close_windows, open_windows


@dataclass(frozen=True)
class SessionTarget:
    """A running server: by DSN (anywhere) and/or by data directory (this host)."""

    conn: ConnParams | None
    local: LocalServer | None

    @property
    def kind(self) -> str:
        return "local" if self.local is not None else "server"

    def conninfo(self) -> str:
        if self.conn is not None:
            return self.conn.conninfo()
        assert self.local is not None
        return f"data_dir={self.local.data_dir}"


@dataclass
class SessionResult:
    run_dir: Path
    status: str  # "complete" or "interrupted"
    unavailable: dict[str, str]
    collectors_failed: dict[str, str]
    interrupted: Interrupted | None = None


def collect(
    *,
    name: str,
    selection: dict[str, dict[str, Any]],
    target: SessionTarget,
    pg: PgBinaries,
    duration_s: float,
    results_dir: Path,
    command_line: str,
    say: Callable[[str], None],
    every_second: Callable[[float], None] | None = None,
    on_store: Callable[[RunStore], None] | None = None,
    window_s: float | None = None,
) -> SessionResult:
    """Run `selection` against `target` for `duration_s` seconds.

    Raises EnvironmentProblem when every selected collector is unavailable (there would be
    nothing to record). `every_second(elapsed)` drives live views, which may read the store
    handed to `on_store` (from this thread; collectors write through cursors of their own).
    With `window_s` (`pgscope observe`), the time is cut into windows of that length: each is
    a step of the store, the collectors are stepped at its edges, and its figures are filled
    in at the end (`windows.py`).
    """
    run_id = new_run_id(name)
    run_dir = results_dir / run_id
    meta = RunMeta(
        run_id,
        name,
        f"pgscope {name}",
        "",
        "{}",
        command_line,
        __version__,
        target.kind,
        target.conninfo(),
        describe_host(),
    )
    conn = target.conn
    env = CollectorEnv(pg, target.kind, conn, os.geteuid() == 0)
    store = RunStore.create(run_dir, meta)
    if on_store is not None:
        on_store(store)
    status, interrupted = "complete", None
    try:
        collectors = CollectorSet(selection, env, store, say)
        if not collectors.active:
            reasons = "; ".join(f"{n}: {r}" for n, r in collectors.unavailable.items())
            store.finish_run("failed", f"nothing could collect: {reasons}")
            raise EnvironmentProblem(reasons)
        version_num = 0
        if conn is not None:
            with conn.connect() as session:
                version, version_num = server_version(session)
                identity = server_identity(session)
            store.set_server(version, version_num, identity)
        local = target.local
        ctx = CollectorContext(
            env=env,
            conn=conn or ConnParams(),
            store=store,
            run_dir=run_dir,
            postmaster_pid=lambda: local.current_pid() if local is not None else None,
            data_dir=local.data_dir if local is not None else None,
            server_version_num=version_num,
            say=say,
        )
        windows = Windows(store, collectors, window_s) if window_s else None
        with signals_as_exceptions():
            try:
                collectors.start(ctx)
                start = time.monotonic()
                if windows is not None:
                    windows.begin()
                while (elapsed := time.monotonic() - start) < duration_s:
                    time.sleep(min(1.0, duration_s - elapsed))
                    if windows is not None:
                        windows.tick(duration_s - (time.monotonic() - start))
                    if every_second is not None:
                        every_second(time.monotonic() - start)
                    if collectors.active and len(collectors.failures()) == len(collectors.active):
                        break  # nothing is collecting any more: end now, keep what we have
            except Interrupted as exc:
                status, interrupted = "interrupted", exc
            finally:
                try:
                    if windows is not None:
                        windows.end()
                finally:
                    collectors.stop()
        if windows is not None:
            close_windows(store)
        failed = {
            r["name"]: r["error"]
            for r in store.query("SELECT name, error FROM collectors WHERE status = 'failed'")
        }
        store.finish_run(status, str(interrupted) if interrupted else None)
        return SessionResult(run_dir, status, dict(collectors.unavailable), failed, interrupted)
    finally:
        store.close()


class Windows:
    """The observation's windows as steps: one opens as the last closes, the collectors
    stepped at each edge (their readings there bound the window)."""

    def __init__(self, store: RunStore, collectors: CollectorSet, window_s: float) -> None:
        self.store, self.collectors, self.window_s = store, collectors, window_s
        self.current: StepInfo | None = None
        self.opened = 0.0

    def begin(self) -> None:
        open_windows(self.store)
        self._open(1)

    def _open(self, step_id: int) -> None:
        self.current = StepInfo(step_id, VARIANT, 0, 1)
        self.store.begin_step(step_id, VARIANT, 0, 1, 0, self.window_s, 0.0, False)
        self.opened = time.monotonic()
        self.collectors.step_started(self.current)

    def tick(self, left_s: float) -> None:
        """A new window when this one is due to close, unless the observation ends within
        half a window (the last one is then longer rather than a stub)."""
        if self.current is None or time.monotonic() - self.opened < self.window_s:
            return
        if left_s < self.window_s / 2:
            return
        step_id = self.current.step_id
        self.end()
        self._open(step_id + 1)

    def end(self) -> None:
        if self.current is None:
            return
        current, self.current = self.current, None
        try:
            self.collectors.step_finished(current)
        finally:
            self.store.finish_step(current.step_id, "ok", None, {})


def exit_code_for(result: SessionResult) -> int:
    if result.interrupted is not None:
        return int(result.interrupted.exit_code)
    return int(ExitCode.RUN_FAILED) if result.collectors_failed else 0
