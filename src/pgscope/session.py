"""Standalone collection: one or more collectors for a fixed time against a running server.

`pgscope sample`, `trace`, `profile` and `observe` use this: no pgbench, no steps, but the
same run folder, store and collector protocol as `pgscope run`, so `pgscope report` reads the
result. SIGINT/SIGTERM stop the collectors and keep what they recorded. A full results disk
stops the session too, keeping what was written, and the status says so: the store keeps a
little room (`RunStore.reserve`) for that last word. `observe` cuts its time into windows
(`Windows`) and watches the server (target/watch.py): lost, the observation stops within
seconds, its windows before the loss kept.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgscope import __version__
from pgscope.collect.base import CollectorContext, CollectorEnv, StepInfo
from pgscope.collect.manager import CollectorSet
from pgscope.errors import (
    EnvironmentProblem,
    ExitCode,
    Interrupted,
    PgscopeError,
    TargetError,
)
from pgscope.host import describe_host
from pgscope.runner.run import disk_full, new_run_id
from pgscope.signals import received, signals_as_exceptions
from pgscope.store import RunMeta, RunStore, now_us
from pgscope.target.conn import ConnParams
from pgscope.target.introspect import server_identity, server_version
from pgscope.target.local import LocalServer
from pgscope.target.pgbin import PgBinaries
from pgscope.target.watch import Lost, ServerWatch
from pgscope.windows import CUT, VARIANT, close_windows, open_windows


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


# A collector's "No space left on device" is the results disk's when this little is left there
# (else the server's own disk, say, under a query's temporary file).
NEARLY_FULL_BYTES = 64 << 20


@dataclass
class SessionResult:
    run_dir: Path
    status: str  # "complete", "interrupted" or "stopped" (by `fault`)
    unavailable: dict[str, str]
    collectors_failed: dict[str, str]
    interrupted: Interrupted | None = None
    # What stopped it before its time: the results disk full (EnvironmentProblem), the
    # server lost (TargetError). The store says so too (status "stopped", and why).
    fault: PgscopeError | None = None
    windows_closed: int = 0


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
    on_windows_closed: Callable[[list[int]], None] | None = None,
    before_close: Callable[[], None] | None = None,
) -> SessionResult:
    """Run `selection` against `target` for `duration_s` seconds.

    Raises EnvironmentProblem when every selected collector is unavailable (there would be
    nothing to record). `every_second(elapsed)` drives live views, which may read the store
    handed to `on_store` (from this thread; collectors write through cursors of their own).
    With `window_s` (`pgscope observe`), the time is cut into windows of that length: each is
    a step of the store, the collectors are stepped at its edges, and it is closed (its
    figures filled in, `windows.py`) as soon as what covers it is written; and the server is
    watched: lost, the observation stops. A full results disk stops any session: the store
    keeps what was written, its status says why (`SessionResult.fault`).
    `on_windows_closed(step ids)` is told of each window closed (from this thread), and
    `before_close()` runs before the store is closed, with every row in it (`observe --push`:
    its pusher reads the store from a thread of its own until then).
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
    try:
        store.reserve()
    except OSError as exc:
        store.close()
        raise EnvironmentProblem(
            f"the results disk is full: {exc.strerror} ({run_dir}); free some space there or "
            f"give --results-dir elsewhere"
        ) from None
    if on_store is not None:
        on_store(store)
    status, interrupted, fault = "complete", None, None
    windows: Windows | None = None
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
        watch = ServerWatch(local, conn) if window_s else None
        with signals_as_exceptions():
            try:
                collectors.start(ctx)
                start = time.monotonic()
                if window_s:
                    windows = Windows(
                        store, collectors, window_s, duration_s, start, on_windows_closed
                    )
                    windows.begin()
                fault = _observe(
                    start, duration_s, run_dir, collectors, windows, watch, every_second
                )
            except Interrupted as exc:
                status, interrupted = "interrupted", exc
            except Exception as exc:
                signalled = received()
                if signalled is None:
                    fault = _fault(exc)
                else:  # a Ctrl-C a library answered with its own error ("Query interrupted")
                    status, interrupted = "interrupted", signalled
            finally:
                try:
                    if windows is not None and fault is None:
                        windows.end()
                except Exception as exc:
                    fault = _fault(exc)
                finally:
                    collectors.stop()
                    if watch is not None:
                        watch.close()
        if fault is None:
            # A collector's last rows refused for want of room: what follows would be too.
            fault = _full_disk(collectors, run_dir)
        if fault is None and windows is not None:
            try:
                windows.close_all()
            except Exception as exc:
                fault = _fault(exc)
        if fault is not None:
            status = "stopped"
            _stopped(store, windows, fault)
        else:
            store.finish_run(status, str(interrupted) if interrupted else None)
        failed = {}
        with contextlib.suppress(Exception):  # a full disk's store may be closed by now
            failed = {
                r["name"]: r["error"]
                for r in store.query("SELECT name, error FROM collectors WHERE status = 'failed'")
            }
        closed = windows.closed if windows is not None else 0
        return SessionResult(
            run_dir, status, dict(collectors.unavailable), failed, interrupted, fault, closed
        )
    finally:
        try:
            if before_close is not None:
                before_close()
        finally:
            store.release_reserve()
            with contextlib.suppress(Exception):
                store.close()


def _observe(
    start: float,
    duration_s: float,
    run_dir: Path,
    collectors: CollectorSet,
    windows: Windows | None,
    watch: ServerWatch | None,
    every_second: Callable[[float], None] | None,
) -> PgscopeError | None:
    """The time observed: each second (and at each window's edge) the windows stepped and
    closed, the server and the collectors checked. The fault that ends it early, if any."""
    end, second = start + duration_s, start + 1.0
    while (now := time.monotonic()) < end:
        wake = min(second, end, windows.next_edge if windows is not None else end)
        time.sleep(max(0.0, wake - now))
        if watch is not None and (lost := watch.check()) is not None:
            return ServerLost(lost, start)
        failures = collectors.failures()
        if (full := _full_disk(collectors, run_dir, failures)) is not None:
            return full
        if windows is not None:
            windows.tick(end - time.monotonic())
        if time.monotonic() >= second:
            while second <= time.monotonic():
                second += 1.0
            if every_second is not None:
                every_second(time.monotonic() - start)
        if collectors.active and len(failures) == len(collectors.active):
            break  # nothing is collecting any more: end now, keep what we have
    if watch is not None and (lost := watch.check()) is not None:
        return ServerLost(lost, start)  # in the last second: its edge could not be read
    return None


class ServerLost(TargetError):
    """The observed server died or shut down: the observation stopped."""

    def __init__(self, lost: Lost, start: float) -> None:
        into = time.monotonic() - start - (now_us() - lost.seen_us) / 1e6
        when = time.strftime("%H:%M:%S", time.gmtime(lost.seen_us / 1e6))
        super().__init__(
            f"the server was lost at {when} UTC, {max(0.0, into):.0f} s into the "
            f"observation: {lost.why}"
        )
        self.seen_us = lost.seen_us


def _full_disk(
    collectors: CollectorSet, run_dir: Path, failures: dict[str, str] | None = None
) -> EnvironmentProblem | None:
    """A collector whose writes failed for want of room (it stopped collecting, a hook of it
    raised, or its stop said so): the results disk is full for everyone. Unless the server's
    disk is the full one (a query's temporary file): the error names a file of the run, or
    the results disk is all but full."""
    reasons = [*(failures or {}).values(), *collectors.failed.values()]
    full = next((why for why in reasons if disk_full(RuntimeError(why))), None)
    if full is None:
        return None
    if str(run_dir) not in full and shutil.disk_usage(run_dir).free >= NEARLY_FULL_BYTES:
        return None
    return _disk_full(RuntimeError(full))


def _fault(exc: Exception) -> PgscopeError:
    """A full disk met while observing, as the fault that stopped it; anything else is
    raised again."""
    if disk_full(exc) is None:
        raise exc
    return _disk_full(exc)


def _disk_full(exc: BaseException) -> EnvironmentProblem:
    """A write that failed for want of room, as the fault: the file it could not write where
    the error names it (DuckDB's `Could not write file "..."`, an OSError's filename), else
    `disk_full`'s account."""
    written = re.search(r'file "([^"]+)"', str(exc))
    name = written[1] if written else getattr(exc, "filename", None)
    if name:
        return EnvironmentProblem(f"the results disk is full: no room to write {name}")
    return EnvironmentProblem(f"the results {(disk_full(exc) or '').removeprefix('the ')}")


def _stopped(store: RunStore, windows: Windows | None, fault: PgscopeError) -> None:
    """The store's record of a fault: the windows it cut, the status that names it. On a full
    disk, in the room the reserve kept (`RunStore.last_writes`)."""
    seen_us = fault.seen_us if isinstance(fault, ServerLost) else None

    def writes(s: RunStore) -> None:
        if windows is not None:
            windows.cut(s, str(fault), seen_us)
        s.finish_run("stopped", str(fault))

    if isinstance(fault, ServerLost):
        writes(store)
    elif not store.last_writes(writes):
        fault.add_note("the store could not take its status (it reads as interrupted)")


class Windows:
    """The observation's windows as steps. Edges fall every `window_s` from the start; one
    instant ends a window and begins the next (the collectors read the server there once for
    both), so the windows tile the time however long the work at an edge takes (a profile
    folded: seconds). A window is closed once what covers it is written (the samples within a
    second or two of its end), so a killed observation keeps every window but the last one or
    two."""

    # A window whose samples are not written this long after its end is closed with what is.
    CLOSE_WAIT_S = 5.0

    def __init__(
        self,
        store: RunStore,
        collectors: CollectorSet,
        window_s: float,
        duration_s: float,
        start: float,
        on_closed: Callable[[list[int]], None] | None = None,
    ) -> None:
        self.store, self.collectors, self.window_s = store, collectors, window_s
        self.on_closed = on_closed
        # A window's planned length (steps.duration_s): shorter when the observation is.
        self.planned_s = min(window_s, duration_s)
        self.next_edge = start + window_s
        self.current: StepInfo | None = None
        self.pending: list[tuple[int, int]] = []  # (step id, end us): ended, not closed
        self.closed = 0

    def begin(self) -> None:
        open_windows(self.store)
        self.current = self._open(1, now_us())
        self.collectors.step_started(self.current)

    def _open(self, step_id: int, at_us: int) -> StepInfo:
        step = StepInfo(step_id, VARIANT, 0, 1)
        self.store.begin_step(step_id, VARIANT, 0, 1, 0, self.planned_s, 0.0, False, at_us)
        return step

    def tick(self, left_s: float) -> None:
        """At an edge due, a new window, unless the observation ends within half a window
        (the last one is then longer rather than a stub); then every window whose samples are
        written is closed."""
        if self.current is not None and time.monotonic() >= self.next_edge:
            self.next_edge += self.window_s
            if left_s >= self.window_s / 2:
                self._edge()
        self._close_ready()

    def _edge(self) -> None:
        assert self.current is not None
        ending, at_us = self.current, now_us()
        # Ended, not yet closed: `running` until its figures are in (windows.py).
        self.store.finish_step(ending.step_id, "running", None, {}, at_us)
        self.current = self._open(ending.step_id + 1, at_us)
        self.pending.append((ending.step_id, at_us))
        self.collectors.window_edge(ending, self.current)

    def _close_ready(self) -> None:
        written = self.collectors.written_until()
        now = now_us()
        ready = [
            step_id
            for step_id, end_us in self.pending
            if written is None or written >= end_us or now - end_us > self.CLOSE_WAIT_S * 1e6
        ]
        self._close(ready)

    def _close(self, ready: list[int]) -> None:
        if ready:
            close_windows(self.store, ready)
            self.pending = [p for p in self.pending if p[0] not in ready]
            self.closed += len(ready)
            if self.on_closed is not None:
                self.on_closed(ready)

    def end(self) -> None:
        """The observation's end (its time is up, or Ctrl-C): the last window ends, closed
        with the others once the collectors have written everything (`close_all`)."""
        if self.current is None:
            return
        current, self.current = self.current, None
        at_us = now_us()
        try:
            self.collectors.step_finished(current)
        finally:
            self.store.finish_step(current.step_id, "running", None, {}, at_us)
            self.pending.append((current.step_id, at_us))

    def close_all(self) -> None:
        self._close([step_id for step_id, _ in self.pending])

    def cut(self, store: RunStore, why: str, seen_us: int | None) -> None:
        """A fault: the windows that ended while the server was still seen are closed (the
        collectors, stopped, have written everything); the rest and the one in progress get
        no figures (`cut`, with why). On a full disk (`seen_us` None) none is closed now."""
        self.store = store  # the store may have been opened again (a full disk)
        if seen_us is not None:
            self._close([step_id for step_id, end_us in self.pending if end_us <= seen_us])
        cut = [step_id for step_id, _ in self.pending]
        if self.current is not None:
            store.finish_step(self.current.step_id, "running", None, {}, seen_us)
            cut.append(self.current.step_id)
            self.current = None
        for step_id in cut:
            store.db.execute(
                f"UPDATE steps SET status = '{CUT}', error = ? WHERE step_id = ?",
                [f"not closed: {why}", step_id],
            )
        self.pending = []


def exit_code_for(result: SessionResult) -> int:
    if result.interrupted is not None:
        return int(result.interrupted.exit_code)
    if result.fault is not None:
        return int(result.fault.exit_code)
    return int(ExitCode.RUN_FAILED) if result.collectors_failed else 0
