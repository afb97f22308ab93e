"""The perf collector: an on-CPU profile of the target cluster per step of a run.

perf samples `cpu-clock` (a software event: this class of VM has no hardware counters) at 99 Hz
by default, with kernel and user call chains walked by frame pointers (Debian's server keeps
them). By default it samples every CPU (`-a`, no cost per context switch) and folding keeps the
cluster's process tree only: the postmaster and its children, plus every process they fork
while recording (pgbench connects after the step started), from perf's own fork records.
Another cluster's processes are never in the profile. `attach = "process"` uses `perf -p`
with inherited events instead: the kernel isolates, but each context switch of a profiled
process pays for switching its event (docs/collector-perf.md). Costs: ~0.6% of throughput at
99 Hz system-wide, 15% with `attach = "process"` (bench/bench_perf.py); ~0.3 s to attach and
the fold after each step, between steps.

Recording is `perfrecord.py`, folding `perffold.py`, the per-step life `profiling.py`, the
tables `profilestore.py`. Symbols come from `perf script`. The stripped server binary exports
its global functions only: a frame perf cannot name is kept as `postgres+0x34b06c`
(file-relative address), never dropped. Kernel frames carry the ecosystem's `_[k]` suffix.
Each stack is attributed to a process role (backend, walwriter, logger, ...) read from the
process titles while the step runs (`roles.py`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from pgscope.collect.base import CollectorError
from pgscope.collect.profiles.perffold import ProcessTree, fold_perf_script
from pgscope.collect.profiles.perfrecord import (
    CLEAN_EXITS,
    PerfRecording,
    perf_binary,
    start_recording,
)
from pgscope.collect.profiles.profiling import FoldedProfile, ProfileCollector, Segment


class PerfOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hz: int = Field(99, ge=1, le=5000, description="samples per second per CPU")
    attach: Literal["system", "process"] = Field(
        "system",
        description="system: sample all CPUs, keep the cluster's process tree (no cost per "
        "context switch); process: perf -p with inherited per-process events",
    )
    keep_data: bool = Field(False, description="keep each recording's perf.data file")


@dataclass
class _PerfRun:
    """A perf recording and the tree that decides which of its samples are the cluster's."""

    recording: PerfRecording
    tree: ProcessTree

    def finish(self) -> int | None:
        return self.recording.finish()

    def failure(self) -> str | None:
        return self.recording.failure()

    def files(self) -> list[Path]:
        output = self.recording.output
        return [output, Path(f"{output}.log")]


class PerfCollector(ProfileCollector[_PerfRun]):
    name = "perf"
    summary = "on-CPU profile per step (perf, cpu-clock, kernel+user stacks)"
    cost: ClassVar[str] = "see docs/benchmarks.md (on-CPU profile at 99 Hz, bench/bench_perf.py)"
    default_in_runs = False
    Options = PerfOptions
    kind = "cpu"
    tool = "perf"
    what = "profile"

    options: PerfOptions

    @classmethod
    def tool_path(cls) -> str | None:
        return perf_binary()

    def _record(self, postmaster: int, tag: str) -> _PerfRun:
        output = self.ctx.artifacts / f"perf-{tag}.data"
        recording, tree = start_recording(
            self.tool_binary, postmaster, self.options.hz, output, self.options.attach
        )
        return _PerfRun(recording, tree)

    def _keeps_files(self) -> bool:
        return self.options.keep_data

    def _fold(self, segment: Segment[_PerfRun], code: int | None) -> FoldedProfile:
        recording = segment.recording.recording
        if not recording.output.is_file():
            raise CollectorError(f"perf record wrote no data (exit {code})")
        folded = fold_perf_script(recording.script(), segment.recording.tree)
        rows: Counter[tuple[str, str | None, str]] = Counter()
        processes: Counter[tuple[int, str]] = Counter()
        for (pid, stack), count in folded.counts.items():
            role = segment.roles.role_of(pid, stack.split(";"))
            rows[(role, None, stack)] += count
            processes[(pid, role)] += count
        return FoldedProfile(
            rows,
            processes,
            folded.unknown_share,
            hz=self.options.hz,
            note=None if code in CLEAN_EXITS else f"perf record exited {code}",
        )
