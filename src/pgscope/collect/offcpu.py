"""Off-CPU profiles: where the cluster's processes wait, with stacks and time, per step.

An on-CPU profile cannot show a backend that sleeps on a latch, a semaphore or an fsync. This
collector runs `bpf/offcpu.bt` (sched_switch: stacks at switch-out, time until switch-in) for
the postmaster and its children, one trace per step like the perf collector, and stores the
result as folded stacks whose value is microseconds off CPU, split by state (sleep, blocked,
runnable = preempted, waiting for a CPU).

User addresses are symbolised after the step (`elfsymbols.py`) against the postmaster's memory
map (read at the start of the recording): every backend is forked from the postmaster, so they
share its layout, and by the time bpftrace prints, they have exited.
"""

from __future__ import annotations

import json
import select
import shutil
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import IO, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from pgscope.collect.base import (
    Availability,
    Collector,
    CollectorContext,
    CollectorEnv,
    CollectorError,
    StepInfo,
)
from pgscope.collect.elfsymbols import AddressSymbolizer
from pgscope.collect.perf import (
    KERNEL_SUFFIX,
    PROFILE_SCHEMA,
    ProcessRoles,
    check_profiling,
    store_folded,
)
from pgscope.proc import spawn, stop_process
from pgscope.store import now_us

READY_LINE = "pgscope-offcpu-ready"
READY_TIMEOUT_S = 60.0  # bpftrace compiles and attaches in ~1.5 s here; a loaded host is slower
STOP_GRACE_S = 60.0


def script_path() -> Path:
    return Path(str(resources.files("pgscope") / "collect" / "bpf" / "offcpu.bt"))


def bpftrace_binary() -> str | None:
    return shutil.which("bpftrace")


def state_name(prev_state: int) -> str:
    """sched_switch's prev_state: 0, or TASK_REPORT_MAX (>= 0x100) when preempted, means the
    task was still runnable; 1 interruptible sleep; 2 uninterruptible (disk, some locks)."""
    if prev_state == 0 or prev_state >= 0x100:
        return "runnable"
    if prev_state & 1:
        return "sleep"
    if prev_state & 2:
        return "blocked"
    return "other"


# ---------------------------------------------------------------------------------------------
# Parsing bpftrace's map


@dataclass
class OffCpuFolded:
    counts: Counter[tuple[int, str, str]] = field(default_factory=Counter)  # pid, state, stack
    user_frames: int = 0
    unknown_user_frames: int = 0
    lost_stacks: int = 0

    @property
    def unknown_share(self) -> float:
        return self.unknown_user_frames / self.user_frames if self.user_frames else 0.0


def fold_offcpu_key(key: str) -> tuple[int, int, list[str], list[int]]:
    """Split one @offcpu_us key: "pid,state,\\n<kernel frames>\\n,\\n<user frames>\\n".

    Kernel frames come as "    name+off", user frames as "\\taddr 0xaddr ([unknown])"; both
    leaf first."""
    pid_text, state_text, rest = key.split(",", 2)
    kernel: list[str] = []
    user: list[int] = []
    for line in rest.split("\n"):
        if line.startswith("\t"):
            token = line.strip().split(" ", 1)[0]
            try:
                user.append(int(token, 16))
            except ValueError:
                continue
        elif line.startswith("    "):
            kernel.append(line.strip().split("+", 1)[0])
    return int(pid_text), int(state_text), kernel, user


def fold_offcpu(output: IO[str], symbolizer: AddressSymbolizer) -> OffCpuFolded:
    """Fold bpftrace's JSON output of offcpu.bt into (pid, state, stack) -> microseconds."""
    folded = OffCpuFolded()
    names: dict[int, tuple[str, bool]] = {}
    for line in output:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            continue
        if message.get("type") != "map":
            continue
        for key, micros in message["data"].get("@offcpu_us", {}).items():
            pid, state, kernel, user = fold_offcpu_key(key)
            frames: list[str] = []
            for address in reversed(user):
                if address not in names:
                    names[address] = symbolizer.frame(address)
                name, known = names[address]
                if name == "[unknown]" and frames and frames[-1] == name:
                    continue  # a garbage walk through code without frame pointers
                frames.append(name)
                folded.user_frames += 1
                folded.unknown_user_frames += not known
            frames.extend(f"{k}{KERNEL_SUFFIX}" for k in reversed(kernel))
            if not kernel and not user:
                folded.lost_stacks += 1
            stack = ";".join(frames) if frames else "[lost stack]"
            folded.counts[(pid, state_name(state), stack)] += int(micros)
    return folded


# ---------------------------------------------------------------------------------------------
# One bpftrace run


@dataclass
class OffCpuTrace:
    bpftrace: str
    postmaster: int
    output: Path
    _proc: subprocess.Popen[bytes] | None = None
    _out: Any = None
    _err: Any = None

    def start(self) -> None:
        self._out = self.output.open("wb")
        self._err = Path(f"{self.output}.log").open("wb")  # noqa: SIM115 - closed in finish()
        self._proc = spawn(
            [self.bpftrace, "-f", "json", str(script_path()), str(self.postmaster)],
            stdout=self._out,
            stderr=self._err,
            env={"BPFTRACE_NO_USER_SYMBOLS": "1", "BPFTRACE_MAP_KEYS_MAX": "65536"},
            death_signal=signal.SIGINT,
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        with self.output.open("rb") as reader:
            while time.monotonic() < deadline:
                if READY_LINE.encode() in reader.read():
                    return
                if self._proc.poll() is not None:
                    raise CollectorError(f"bpftrace exited at start: {self.error_text()}")
                select.select([], [], [], 0.05)
        raise CollectorError(f"bpftrace did not attach within {READY_TIMEOUT_S:.0f} s")

    def failure(self) -> str | None:
        """Why bpftrace stopped on its own while tracing, else None."""
        if self._proc is None or self._proc.poll() is None:
            return None
        return f"bpftrace exited {self._proc.returncode}: {self.error_text()}"

    def error_text(self) -> str:
        if not self._err.closed:  # after finish() the file is closed; it is read by name
            self._err.flush()
        lines = Path(self._err.name).read_text(errors="replace").splitlines()
        # The kernel accounts BPF memory to the cgroup; bpftrace's RLIMIT warning is noise.
        useful = [ln for ln in lines if ln.strip() and "RLIMIT_MEMLOCK" not in ln]
        return useful[-1] if useful else "no error output"

    def finish(self) -> int | None:
        """SIGINT: bpftrace prints its map and exits."""
        code = None
        if self._proc is not None:
            code = stop_process(self._proc, signal.SIGINT, grace_s=STOP_GRACE_S)
            self._proc = None
        for handle in (self._out, self._err):
            if handle is not None:
                handle.close()
        return code


# ---------------------------------------------------------------------------------------------
# The collector


class OffCpuOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    keep_output: bool = Field(False, description="keep bpftrace's raw output per recording")


@dataclass
class _Segment:
    step_id: int | None
    started_us: int
    roles: ProcessRoles
    symbolizer: AddressSymbolizer
    trace: OffCpuTrace


class OffCpuCollector(Collector):
    name = "offcpu"
    summary = "off-CPU time per stack and state, per step (bpftrace sched_switch)"
    cost: ClassVar[str] = "see docs/benchmarks.md (off-CPU tracing, bench/bench_perf.py)"
    default_in_runs = False
    Options = OffCpuOptions

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        verdict = check_profiling(env, "bpftrace", bpftrace_binary())
        if verdict.ok and not script_path().is_file():
            return Availability.no(f"{script_path()} is missing (a broken installation)")
        return verdict

    def start(self, ctx: CollectorContext) -> None:
        self.segment: _Segment | None = None  # first: stop() must work whatever fails next
        bpftrace = bpftrace_binary()
        if bpftrace is None:
            raise CollectorError("bpftrace not found in PATH")
        self.bpftrace = bpftrace
        self.ctx = ctx
        ctx.store.ensure_schema(PROFILE_SCHEMA)
        self.in_steps = False
        self._begin(None)

    def _begin(self, step_id: int | None) -> None:
        postmaster = self.ctx.postmaster_pid()
        if postmaster is None:
            raise CollectorError("the server is not running (no postmaster PID)")
        tag = "session" if step_id is None else f"step-{step_id:04d}"
        symbolizer = AddressSymbolizer.of_process(postmaster)
        roles = ProcessRoles(postmaster)
        trace = OffCpuTrace(self.bpftrace, postmaster, self.ctx.artifacts / f"offcpu-{tag}.json")
        try:
            trace.start()
        except BaseException:
            trace.finish()
            raise
        roles.start()
        self.segment = _Segment(step_id, now_us(), roles, symbolizer, trace)

    def _end(self, keep: bool) -> None:
        assert isinstance(self.options, OffCpuOptions)
        segment, self.segment = self.segment, None
        if segment is None:
            return
        code = segment.trace.finish()
        ended_us = now_us()
        segment.roles.stop()
        output = segment.trace.output
        try:
            if keep:
                with output.open(errors="replace") as text:
                    folded = fold_offcpu(text, segment.symbolizer)
                rows: Counter[tuple[str, str | None, str]] = Counter()
                processes: Counter[tuple[int, str]] = Counter()
                for (pid, state, stack), micros in folded.counts.items():
                    role = segment.roles.role_of(pid, stack.split(";"))
                    rows[(role, state, stack)] += micros
                    processes[(pid, role)] += micros
                notes = []
                if code not in (0, None):
                    notes.append(f"bpftrace exited {code}: {segment.trace.error_text()}")
                if folded.lost_stacks:
                    notes.append(f"{folded.lost_stacks} stacks lost (stack map collisions)")
                store_folded(
                    self.ctx.store,
                    segment.step_id,
                    "offcpu",
                    rows,
                    started_us=segment.started_us,
                    ended_us=ended_us,
                    hz=None,
                    processes=processes,
                    unknown_share=folded.unknown_share,
                    note="; ".join(notes) or None,
                )
        finally:
            if not self.options.keep_output or not keep:
                output.unlink(missing_ok=True)
                Path(f"{output}.log").unlink(missing_ok=True)

    def step_started(self, step: StepInfo) -> None:
        if not self.in_steps:
            self.in_steps = True
            self._end(keep=False)
        self._begin(step.step_id)

    def failure(self) -> str | None:
        segment = self.segment
        if segment is None:
            return None
        return segment.trace.failure()

    def step_finished(self, step: StepInfo) -> None:
        self._end(keep=True)

    def stop(self) -> str | None:
        try:
            self._end(keep=True)
        except Exception as exc:
            return f"folding the last off-CPU profile failed: {exc}"
        return None
