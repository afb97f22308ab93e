"""The live progress of a run on the console: implements the runner's Reporter.

Progress goes to stderr (so `--json` on stdout stays clean); on a terminal it is a live status
line, elsewhere one line per step. It lives with the CLI because it drives the runner's own
objects; the summary after a run is a renderer's (`render/console.py`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.status import Status

if TYPE_CHECKING:  # the types only: every command's start pays for what it imports
    from pgscope.drive.pgbench import LatencyStats, ProgressRow
    from pgscope.runner import PlannedStep


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


class ConsoleReporter:
    """Implements runner.Reporter on a rich console."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.status: Status | None = None
        self.label = ""
        self.step_started_at = 0.0
        self.seconds = 0.0

    def phase(self, message: str) -> None:
        self._stop_status()
        self.console.print(f"[dim]· {escape(message)}[/dim]", highlight=False)

    def step_started(self, step: PlannedStep, total: int, seconds: float) -> None:
        self.label = (
            f"step {step.step_id}/{total}  {step.variant}  {step.describe()}  repeat={step.repeat}"
        )
        self.step_started_at = time.monotonic()
        self.seconds = seconds
        if self.console.is_terminal:
            self.status = self.console.status(self.label)
            self.status.start()

    def progress(self, step: PlannedStep, row: ProgressRow) -> None:
        if self.status is not None:
            elapsed = time.monotonic() - self.step_started_at
            self.status.update(
                f"{self.label}  {elapsed:3.0f}/{self.seconds:.0f}s  "
                f"{row.tps:,.0f} tps  lat {_ms(row.latency_ms)} ms"
            )

    def step_finished(
        self,
        step: PlannedStep,
        stats: LatencyStats | None,
        error: str | None,
        status: str | None = None,
    ) -> None:
        self._stop_status()
        if status == "errors":
            self.console.print(
                f"{self.label}  [yellow]errors: {escape(error or '')}[/yellow]",
                highlight=False,
            )
        elif error is not None:
            self.console.print(f"{self.label}  [red]failed: {escape(error)}[/red]", highlight=False)
        elif stats is not None:
            # Open loop: what the server completed of the rate offered, and latency counted
            # from each transaction's scheduled start.
            achieved = f"  ({stats.tps / step.rate:.0%} of the rate)" if step.rate else ""
            self.console.print(
                f"{self.label}  {stats.tps:,.0f} tps{achieved}  p50 {_ms(stats.p50_ms)}  "
                f"p95 {_ms(stats.p95_ms)}  p99 {_ms(stats.p99_ms)} ms",
                highlight=False,
            )

    def _stop_status(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None
