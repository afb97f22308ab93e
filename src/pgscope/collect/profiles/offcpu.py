"""The offcpu collector: where the cluster's processes wait off CPU, with stacks and time,
per step of a run.

An on-CPU profile cannot show a backend that sleeps on a latch, a semaphore or an fsync. This
runs `bpf/offcpu.bt` (sched_switch: stacks at switch-out, time until switch-in) for the
postmaster and its children, one trace per step (`profiling.py`), and stores the result as
folded stacks whose value is microseconds off CPU, split by state (sleep, blocked,
runnable = preempted, waiting for a CPU). Costs: two stack walks and four map updates per
context switch of a cluster process (25% of select-only throughput, bench/bench_perf.py);
~1.5 s to attach and the fold after each step, between steps.

User addresses are named after the step (`offcpufold.py`, `elfsymbols.py`) against the
postmaster's memory map read at the start of the recording: every backend is forked from the
postmaster, so they share its layout, and by the time bpftrace prints, they have exited.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import IO, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from pgscope.collect.base import Availability, CollectorEnv
from pgscope.collect.profiles.elfsymbols import AddressSymbolizer
from pgscope.collect.profiles.offcpufold import fold_offcpu
from pgscope.collect.profiles.profiling import FoldedProfile, ProfileCollector, Segment
from pgscope.collect.tracing.bpftrace import BpftraceProcess, bpftrace_binary
from pgscope.files import open_for_writing

READY_TIMEOUT_S = 60.0  # bpftrace compiles and attaches in ~1.5 s here; a loaded host is slower
STOP_GRACE_S = 60.0


def script_path() -> Traversable:
    return resources.files("pgscope.collect.tracing.bpf").joinpath("offcpu.bt")


@dataclass
class OffCpuTrace:
    """offcpu.bt running for one recording, its output kept in a file to fold after the stop."""

    postmaster: int
    output: Path
    symbolizer: AddressSymbolizer
    process: BpftraceProcess = field(init=False)
    _out: IO[bytes] | None = None

    def __post_init__(self) -> None:
        self.process = BpftraceProcess(
            "offcpu",
            script_path(),
            [str(self.postmaster)],
            on_line=self._write,
            stderr_path=Path(f"{self.output}.log"),
            stop_grace_s=STOP_GRACE_S,
            # Backends exit before the END print, so bpftrace could not name their addresses;
            # the symbolizer does, from the postmaster's map.
            env={"BPFTRACE_NO_USER_SYMBOLS": "1", "BPFTRACE_MAP_KEYS_MAX": "65536"},
        )

    def _write(self, line: bytes) -> None:
        assert self._out is not None
        self._out.write(line)

    def start(self) -> None:
        self._out = open_for_writing(self.output, "wb")
        try:
            self.process.start()
            self.process.wait_ready(READY_TIMEOUT_S)
        except BaseException:
            self.finish()
            raise

    def failure(self) -> str | None:
        return self.process.failure()

    def error_text(self) -> str:
        return self.process.reason()

    def finish(self) -> int | None:
        """SIGINT: bpftrace prints its map and exits; the file then holds all of it."""
        code = self.process.stop()
        if self._out is not None:
            self._out.close()
        return code

    def files(self) -> list[Path]:
        return [self.output, Path(f"{self.output}.log")]


class OffCpuOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    keep_output: bool = Field(False, description="keep bpftrace's raw output per recording")


class OffCpuCollector(ProfileCollector[OffCpuTrace]):
    name = "offcpu"
    summary = "off-CPU time per stack and state, per step (bpftrace sched_switch)"
    cost: ClassVar[str] = "see docs/benchmarks.md (off-CPU tracing, bench/bench_perf.py)"
    default_in_runs = False
    Options = OffCpuOptions
    kind = "offcpu"
    tool = "bpftrace"
    what = "off-CPU profile"

    options: OffCpuOptions

    @classmethod
    def tool_path(cls) -> str | None:
        return bpftrace_binary()

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        verdict = super().check(env)
        if verdict.ok and not script_path().is_file():
            return Availability.no(f"{script_path()} is missing (a broken installation)")
        return verdict

    def _record(self, postmaster: int, tag: str) -> OffCpuTrace:
        symbolizer = AddressSymbolizer.of_process(postmaster)
        trace = OffCpuTrace(postmaster, self.ctx.artifacts / f"offcpu-{tag}.json", symbolizer)
        trace.start()
        return trace

    def _keeps_files(self) -> bool:
        return self.options.keep_output

    def _fold(self, segment: Segment[OffCpuTrace], code: int | None) -> FoldedProfile:
        trace = segment.recording
        with trace.output.open(errors="replace") as text:
            folded = fold_offcpu(text, trace.symbolizer)
        rows: Counter[tuple[str, str | None, str]] = Counter()
        processes: Counter[tuple[int, str]] = Counter()
        for (pid, state, stack), micros in folded.counts.items():
            role = segment.roles.role_of(pid, stack.split(";"))
            rows[(role, state, stack)] += micros
            processes[(pid, role)] += micros
        notes = []
        if code not in (0, None):
            notes.append(f"bpftrace exited {code}: {trace.error_text()}")
        if folded.lost_stacks:
            notes.append(f"{folded.lost_stacks} stacks lost (stack map collisions)")
        return FoldedProfile(
            rows, processes, folded.unknown_share, hz=None, note="; ".join(notes) or None
        )
