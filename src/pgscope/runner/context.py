"""What one run works with, passed explicitly (no global state), and the progress it reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pgscope.collect.manager import CollectorSet
from pgscope.drive.pgbench import LatencyStats, Pgbench, ProgressRow
from pgscope.runner.plan import PlannedStep
from pgscope.runner.topology import Topology
from pgscope.spec import LoadedSpec, Spec
from pgscope.store import RunStore


class Reporter(Protocol):
    """Progress for the user while the run goes on (the console renderer implements it)."""

    def phase(self, message: str) -> None: ...
    def step_started(self, step: PlannedStep, total: int, seconds: float) -> None: ...
    def progress(self, step: PlannedStep, row: ProgressRow) -> None: ...
    def step_finished(
        self,
        step: PlannedStep,
        stats: LatencyStats | None,
        error: str | None,
        status: str | None = None,  # "ok", "errors", "failed"; None: by `error`
    ) -> None: ...


@dataclass
class RunContext:
    """Everything one run works with, passed explicitly (no global state)."""

    loaded: LoadedSpec
    steps: list[PlannedStep]
    store: RunStore
    reporter: Reporter
    collectors: CollectorSet
    cores: int
    keep_xact_logs: bool
    cpu_list: list[int]  # the CPUs pgscope may use, in order
    servers: Topology
    driver: Pgbench | None = None  # once the target is up

    @property
    def pgbench(self) -> Pgbench:
        assert self.driver is not None, "the target is not up yet"
        return self.driver

    @property
    def spec(self) -> Spec:
        return self.loaded.spec
