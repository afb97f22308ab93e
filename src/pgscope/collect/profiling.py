"""When does a stack profile start and end, and what becomes of it? The per-step life shared
by the profile collectors (perf on-CPU, offcpu).

Each step gets its own recording, started at `step_started` and, at `step_finished`, stopped,
folded and stored before the next step starts, so that folding never loads a measured step.
Between two windows of an observation, which share their edge, the next window's recording
starts first and the last one is folded after: the fold's seconds fall inside a window.
Outside a run's steps (`pgscope profile`), one recording spans the whole session. This costs
nothing itself; the recorder's attach (~0.3 s perf, ~1.5 s bpftrace) and the fold (seconds
per minute of profile) fall between steps.
"""

from __future__ import annotations

from abc import abstractmethod
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Generic, Protocol, TypeVar

from pgscope.collect.base import (
    Availability,
    Collector,
    CollectorContext,
    CollectorEnv,
    CollectorError,
    StepInfo,
)
from pgscope.collect.profilestore import store_folded
from pgscope.collect.roles import ProcessRoles
from pgscope.store import now_us

_PACKAGE = {"perf": "linux-perf", "bpftrace": "bpftrace"}


def check_profiling(env: CollectorEnv, tool: str, path: str | None) -> Availability:
    """What perf and bpftrace profiles both need: root, the tool, and a server on this host."""
    if env.target_kind == "server":
        return Availability.no(
            "profiles need the server's processes on this host: use an embedded cluster or "
            "pgscope profile --data-dir"
        )
    if not env.is_root:
        return Availability.no(f"{tool} profiles of the server's processes need root (run as root)")
    if path is None:
        return Availability.no(f"{tool} not found in PATH (apt-get install {_PACKAGE[tool]})")
    return Availability.yes()


class Recording(Protocol):
    """A recorder attached to the cluster (started and ready when it is handed over)."""

    def finish(self) -> int | None:
        """Stop it; its exit code."""

    def failure(self) -> str | None:
        """Why it stopped on its own while recording, else None."""

    def files(self) -> list[Path]:
        """What it left in the run folder, removed unless the options keep it."""


R = TypeVar("R", bound=Recording)


@dataclass
class Segment(Generic[R]):
    """One recording in progress: a step's, or the session's (step None)."""

    step_id: int | None
    started_us: int
    roles: ProcessRoles
    recording: R


@dataclass
class FoldedProfile:
    """A recording folded, ready for the profile tables."""

    rows: Counter[tuple[str, str | None, str]]  # (role, state, stack) -> value
    processes: Counter[tuple[int, str]]  # (pid, role) -> value
    unknown_share: float
    hz: int | None
    note: str | None


class ProfileCollector(Collector, Generic[R]):
    intrusive = True
    """Base of the profile collectors; not a collector itself (no `name`, abstract)."""

    kind: ClassVar[str]  # profiles.kind: cpu, offcpu
    tool: ClassVar[str]  # the program that records: perf, bpftrace
    what: ClassVar[str]  # the profile's name in an error message

    @classmethod
    @abstractmethod
    def tool_path(cls) -> str | None: ...

    @abstractmethod
    def _record(self, postmaster: int, tag: str) -> R:
        """Start recording the cluster of `postmaster` into artifacts named by `tag`;
        cleaned up when it fails to start."""

    @abstractmethod
    def _fold(self, segment: Segment[R], code: int | None) -> FoldedProfile: ...

    @abstractmethod
    def _keeps_files(self) -> bool: ...

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        return check_profiling(env, cls.tool, cls.tool_path())

    def start(self, ctx: CollectorContext) -> None:
        self.segment: Segment[R] | None = None  # first: stop() must work whatever fails next
        path = self.tool_path()
        if path is None:
            raise CollectorError(f"{self.tool} not found in PATH")
        self.tool_binary = path
        self.ctx = ctx
        ctx.store.create_tables("profiles")
        self.in_steps = False
        self._begin(None)  # the session's recording, replaced by steps in a run

    def _begin(self, step_id: int | None) -> None:
        postmaster = self.ctx.postmaster_pid()
        if postmaster is None:
            raise CollectorError("the server is not running (no postmaster PID)")
        tag = "session" if step_id is None else f"step-{step_id:04d}"
        roles = ProcessRoles(postmaster)
        recording = self._record(postmaster, tag)
        roles.start()
        self.segment = Segment(step_id, now_us(), roles, recording)

    def _end(self, keep: bool) -> None:
        segment, self.segment = self.segment, None
        if segment is not None:
            self._finish(segment, keep)

    def _finish(self, segment: Segment[R], keep: bool) -> None:
        """Stop a recording; folded and stored when `keep`, its files removed unless kept."""
        code = segment.recording.finish()
        ended_us = now_us()
        segment.roles.stop()
        try:
            if keep:
                folded = self._fold(segment, code)
                store_folded(
                    self.ctx.store,
                    segment.step_id,
                    self.kind,
                    folded.rows,
                    started_us=segment.started_us,
                    ended_us=ended_us,
                    hz=folded.hz,
                    processes=folded.processes,
                    unknown_share=folded.unknown_share,
                    note=folded.note,
                )
        finally:
            if not self._keeps_files() or not keep:
                for path in segment.recording.files():
                    path.unlink(missing_ok=True)

    def step_started(self, step: StepInfo) -> None:
        if not self.in_steps:
            self.in_steps = True
            self._end(keep=False)  # a run: the time before the first step is not profiled
        self._begin(step.step_id)

    def step_finished(self, step: StepInfo) -> None:
        self._end(keep=True)

    def window_edge(self, ending: StepInfo, starting: StepInfo) -> None:
        """Between two windows of an observation: the next window's recording starts before
        this one's is stopped and folded, so the profiles cover the edge too (the two overlap
        by the attach, ~0.3 s for perf)."""
        if not self.in_steps:
            self.step_started(starting)
            return
        ending_segment, self.segment = self.segment, None
        try:
            self._begin(starting.step_id)
        finally:
            if ending_segment is not None:
                self._finish(ending_segment, keep=True)

    def target_restarted(self) -> None:
        pass  # recordings start per step, from the current postmaster

    def failure(self) -> str | None:
        segment = self.segment
        if segment is None:
            return None
        return segment.recording.failure()

    def stop(self) -> str | None:
        try:
            self._end(keep=True)
        except Exception as exc:
            return f"folding the last {self.what} failed: {exc}"
        return None
