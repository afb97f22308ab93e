"""The `--live` view of `sample` and `observe`: the last seconds' waits, redrawn each second
from the run's own store while the collectors write it; for `observe`, with the finding the
rules rank first over those seconds (analyze/live.py).

The view draws from a thread of its own from the moment the store exists, not from the
session's loop: the loop begins only once every collector has started, and kernel tracing and
profiles take seconds to start (issue 30: the view showed its first samples ~11 s after
launch, while the sampler had begun seconds before)."""

from __future__ import annotations

import contextlib
import threading
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live

if TYPE_CHECKING:  # the types only: every command's start pays for what it imports
    from pgscope.store import RunStore


WINDOW_S = 10  # the view shows the waits of the last this many seconds
# How often the sampler writes its rows while the view reads them (instead of every 10 s):
# each write costs a few ms of CPU, which a user watching the view pays.
LIVE_FLUSH_S = 1.0


class LiveWaits:
    """A context manager: shown while the block runs when `enabled`, else nothing.
    `opened` is the collection's `on_store` hook, `refresh` its `every_second` hook."""

    def __init__(
        self, enabled: bool, duration_s: float, console: Console, command: str = "sample"
    ) -> None:
        self.duration_s = duration_s
        self.command = command
        self.store: RunStore | None = None
        self.view: Live | None = None
        # The session's clock, from its first second; None while the collectors start.
        self.elapsed: float | None = None
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        if enabled:
            from pgscope.render.waits import live_view

            self.view = Live(
                live_view(None, None, duration_s, WINDOW_S, command),
                console=console,
                refresh_per_second=2,
            )

    def opened(self, store: RunStore) -> None:
        # A cursor of its own, used by the view's thread alone: the collectors write through
        # the run's handle meanwhile (a shared one failed pgstats' step-edge writes with
        # "unfinished result").
        self.store = store.writer()
        if self.view is not None:
            self.thread = threading.Thread(target=self._draw_each_second, name="live-view")
            self.thread.daemon = True
            self.thread.start()

    def refresh(self, elapsed: float) -> None:
        """The session's every-second hook: its clock, which the next drawing shows."""
        self.elapsed = elapsed

    def _draw_each_second(self) -> None:
        shown = False
        while True:
            # A drawing that fails (the store closed under it at a full disk) is skipped:
            # the view is a window on the collection, never a reason to stop it.
            with contextlib.suppress(Exception):
                shown = self._draw() or shown
            # Until the first samples are in, looked for four times a second: they show
            # within a quarter of a second of their write.
            if self.stopping.wait(1.0 if shown else 0.25):
                return

    def _draw(self) -> bool:
        """Draw the view; whether it showed samples."""
        if self.view is None or self.store is None:
            return False
        from pgscope.analyze import waits
        from pgscope.render.waits import live_view
        from pgscope.store import now_us

        elapsed = self.elapsed

        since = now_us() - WINDOW_S * 1_000_000
        analysis = waits.analyse(self.store.db, start_us=since)
        leading = None
        if self.command == "observe" and analysis is not None:
            from pgscope.analyze.live import client_sessions, leading_finding

            sessions = client_sessions(self.store.db, since)
            leading = leading_finding(analysis.overall, sessions) or "none yet"
        self.view.update(
            live_view(analysis, elapsed, self.duration_s, WINDOW_S, self.command, leading)
        )
        return analysis is not None and analysis.overall.samples > 0

    def __enter__(self) -> LiveWaits:
        if self.view is not None:
            self.view.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=10)
        if self.view is not None:
            self.view.stop()
        if self.store is not None:
            self.store.close()  # the cursor only
