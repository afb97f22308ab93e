"""The collector protocol: evidence gatherers the runner starts, steps and stops.

A collector is one module in `pgscope/collect/` defining a `Collector` subclass. The registry
finds it by itself, specs name it, `doctor` shows whether it can run here, and runs record
whether it ran and why not. A collector that cannot run says why and the run goes on without it.

Life cycle, all from the runner's main thread:

    check(env)             can it run here? (root, binaries, extension, server rights)
    startup_settings(env)  settings an embedded cluster needs at start (e.g. preload libraries)
    start(ctx)             once, after the target is up; create tables, start threads/processes
    step_started(step)     before each step's load begins
    step_finished(step)    after it ends
    window_edge(a, b)      `observe`: window a ends and window b begins at the same instant
    written_until()        polled: up to when is what it took in written to the store?
    target_restarted()     the embedded server restarted (new PIDs)
    failure()              polled: has it stopped collecting on its own, and why?
    stop()                 once, always (normal end, error, Ctrl-C); must not raise

Collectors write rows with their own `ctx.store.writer()` in their own threads, stamping time as
UTC epoch microseconds from the host clock, the same clock pgbench uses.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from pgscope.store import RunStore
from pgscope.target.conn import ConnParams
from pgscope.target.pgbin import PgBinaries


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str = ""  # when not ok: what is missing and how to fix it, one line

    @classmethod
    def yes(cls) -> Availability:
        return cls(True)

    @classmethod
    def no(cls, reason: str) -> Availability:
        return cls(False, reason)


@dataclass(frozen=True)
class CollectorEnv:
    """What a collector may inspect before the run starts."""

    pg: PgBinaries
    target_kind: str  # "embedded", "server" (by DSN) or "local" (a data directory here)
    conn: ConnParams | None  # None before an embedded cluster exists
    is_root: bool


@dataclass
class CollectorContext:
    """What a started collector works with."""

    env: CollectorEnv
    conn: ConnParams
    store: RunStore  # call .writer() for use in another thread
    run_dir: Path
    postmaster_pid: Callable[[], int | None]  # current postmaster (None on a remote server)
    data_dir: Path | None
    server_version_num: int
    say: Callable[[str], None]  # a progress line for the user
    # The postmasters of the target's standbys and extra instances (a run's topology): its
    # processes too, where a collector counts the server's (host CPU).
    other_postmasters: Callable[[], list[int]] = list

    @property
    def artifacts(self) -> Path:
        path = self.run_dir / "collectors"
        path.mkdir(exist_ok=True)
        return path


@dataclass(frozen=True)
class StepInfo:
    step_id: int
    variant: str
    clients: int
    repeat: int


class CollectorError(Exception):
    """A collector could not start or failed; the run goes on without it."""


class Collector(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]  # what it records, one line
    cost: ClassVar[str]  # what it costs, as measured (docs/benchmarks.md), one line
    default_in_runs: ClassVar[bool] = False
    # Attaches to the server's processes or binary, so that its cost also falls on processes
    # pgscope did not start (every cluster of that binary pays a probe's traps): never by
    # default on a user's server.
    intrusive: ClassVar[bool] = False
    # Runs only on clusters pgscope starts (it writes to the server): never selected for a
    # user's server, nor listed by `run --plan` there.
    embedded_only: ClassVar[bool] = False
    Options: ClassVar[type[BaseModel]] = NoOptions

    def __init__(self, options: BaseModel) -> None:
        self.options = options

    @classmethod
    @abstractmethod
    def check(cls, env: CollectorEnv) -> Availability: ...

    def startup_settings(self, env: CollectorEnv) -> dict[str, str]:
        return {}

    @abstractmethod
    def start(self, ctx: CollectorContext) -> None: ...

    def step_started(self, step: StepInfo) -> None:  # noqa: B027 - optional hook
        pass

    def step_finished(self, step: StepInfo) -> None:  # noqa: B027 - optional hook
        pass

    def window_edge(self, ending: StepInfo, starting: StepInfo) -> None:
        """Between two windows of an observation, which share their edge: `ending` ends
        where `starting` begins, with no time between. By default its end, then the next's
        start; a collector that reads the server at the edges reads it once for both, so the
        windows tile the time (issue 30)."""
        self.step_finished(ending)
        self.step_started(starting)

    def written_until(self) -> int | None:
        """The time (UTC epoch microseconds) up to which everything it took in is in the
        store; None when it keeps nothing back. Its `step_finished` may ask for the rest to be
        written soon: a window is closed once what covers it is written."""
        return None

    def target_restarted(self) -> None:  # noqa: B027 - optional hook
        pass

    def failure(self) -> str | None:
        """While running: why the collector has stopped collecting (it died, lost its
        connection for good), else None. Polled about once a second."""
        return None

    @abstractmethod
    def stop(self) -> str | None:
        """Stop and flush. Returns an error description if the collector failed on the way
        (it died, lost its connection), else None. Must not raise."""

    def options_json(self) -> dict[str, Any]:
        return self.options.model_dump(mode="json")
