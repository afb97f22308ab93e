"""The usdt collector: PostgreSQL's static (USDT) probes traced by bpftrace for a whole run.

One bpftrace process per program (`bpf/*.bt`, one question each; `usdtoptions.py` says which
run), attached when the target is up, re-attached when it restarts, stopped at the end; each
process's lines become rows in `usdtoutput.py`. Costs: per program, ~1-3 s of LLVM compile at
attach (the programs compile in parallel) and its uprobe traps while it runs (its header,
docs/collector-usdt.md).

Which processes are traced. PostgreSQL's probes all sit behind USDT semaphores: a probe site
runs only while its semaphore is non-zero in that process. bpftrace 0.17 offers two ways:
`-p PID` (the kernel raises the semaphores in that one process and the uprobe fires only
there: a postmaster's backends, although forked with its memory, are never traced) or a
file-wide attach (on kernels with uprobe reference counters, >= 4.20, the kernel raises the
semaphores in every process that maps the binary, now or later; `--usdt-file-activation` is
the same thing there). Only the file-wide attach sees backends that start later, so that is
what pgscope uses, and each program's predicates keep only the postmaster and its children
(`curtask->real_parent->tgid`): other clusters running the same binary are not recorded, but
while a trace runs their probe sites are live too and they pay the uprobe traps.
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel

from pgscope.collect.base import (
    Availability,
    Collector,
    CollectorContext,
    CollectorEnv,
    CollectorError,
)
from pgscope.collect.localserver import local_server_for, running_binary
from pgscope.collect.tracing.bpf import PROGRAMS, Program, argument_problems
from pgscope.collect.tracing.bpftrace import BpftraceProcess
from pgscope.collect.tracing.elfprobes import list_probes
from pgscope.collect.tracing.usdthost import capability_problems
from pgscope.collect.tracing.usdtoptions import UsdtOptions
from pgscope.collect.tracing.usdtoutput import UsdtOutput
from pgscope.errors import EnvironmentProblem, PgscopeError
from pgscope.store import RunStore, now_us

READY_TIMEOUT_S = 90.0  # LLVM compiles each program; on a loaded 2-core host that takes seconds
STOP_GRACE_S = 20.0


class UsdtCollector(Collector):
    name = "usdt"
    summary = (
        "LWLock and lock waits, checkpoint phases and I/O latency from PostgreSQL's "
        "static probes, aggregated in the kernel by bpftrace"
    )
    cost = (
        "two uprobe traps per LWLock or lock wait, three per buffer a checkpoint writes; "
        "io: tens per transaction; see docs/benchmarks.md"
    )
    default_in_runs = True
    intrusive = True
    Options = UsdtOptions

    options: UsdtOptions

    def __init__(self, options: BaseModel) -> None:
        super().__init__(options)
        self.tracers: list[Tracer] = []

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        binary: Path | None = None
        if env.target_kind == "embedded":
            try:
                binary = env.pg.path("postgres")
            except EnvironmentProblem as exc:
                return Availability.no(str(exc))
        problems = capability_problems(env.is_root, binary)
        if not problems and env.target_kind == "server" and env.conn is not None:
            try:
                local = local_server_for(env.conn)
            except PgscopeError as exc:
                return Availability.no(str(exc))
            if local is None:
                problems.append(
                    "the --dsn server does not run on this host (no local postmaster has "
                    "its port and start time); tracing needs its processes: run pgscope on "
                    "the database host"
                )
        return Availability.no("; ".join(problems)) if problems else Availability.yes()

    def start(self, ctx: CollectorContext) -> None:
        self.ctx = ctx
        pid = self._postmaster_pid()
        self.binary = running_binary(pid)
        probes = list_probes(self.binary)
        for name in self.options.program_names():
            problems = argument_problems(PROGRAMS[name], probes)
            if problems:
                raise CollectorError(
                    f"program {name} cannot trace {self.binary}: {'; '.join(problems)}"
                )
        ctx.store.create_tables("usdt")
        self._start_tracers(pid)
        ctx.say(
            f"usdt: tracing {', '.join(self.options.program_names())} in the cluster of "
            f"postmaster {pid} ({self.binary})"
        )

    def _postmaster_pid(self) -> int:
        pid = self.ctx.postmaster_pid()
        if pid is not None:
            return pid
        local = local_server_for(self.ctx.conn)
        if local is None:
            raise CollectorError(
                "the server does not run on this host; tracing needs its processes"
            )
        return local.pid

    def _start_tracers(self, pid: int) -> None:
        tracers = [
            Tracer(
                PROGRAMS[name],
                self.binary,
                pid,
                self.ctx.store.writer(),
                self.ctx.server_version_num,
                self.ctx.artifacts / f"usdt-{name}.stderr",
            )
            for name in self.options.program_names()
        ]
        self.tracers = tracers
        for tracer in tracers:  # spawn all, then wait: the compiles overlap
            tracer.spawn()
        for tracer in tracers:
            tracer.wait_ready(READY_TIMEOUT_S)

    def target_restarted(self) -> None:
        """New postmaster, new PIDs: re-attach (the maps start again from zero)."""
        if not self.tracers:  # not started yet (a restart for the first variant)
            return
        gap_start = now_us()
        errors = [e for t in self.tracers if (e := t.stop())]
        if errors:
            raise CollectorError("; ".join(errors))
        pid = self._postmaster_pid()
        self._start_tracers(pid)
        self.ctx.store.add_gap(
            self.name, gap_start, now_us(), f"server restarted; re-attached to postmaster {pid}"
        )

    def failure(self) -> str | None:
        for tracer in self.tracers:
            reason = tracer.failure()
            if reason:
                return reason
        if self.tracers and not Path(f"/proc/{self.tracers[0].postmaster_pid}").exists():
            # A restart the runner drives is re-attached before anyone asks; this one
            # was not (the server stopped under a standalone trace): nothing left to see.
            return f"postmaster {self.tracers[0].postmaster_pid} exited; nothing left to trace"
        return None

    def stop(self) -> str | None:
        failed = self.failure()
        for tracer in self.tracers:  # all flush at once, then each is drained
            tracer.interrupt()
        errors = [e for t in self.tracers if (e := t.stop())]
        self.tracers = []
        if failed and failed not in errors:
            errors.insert(0, failed)
        return "; ".join(errors) or None


class Tracer:
    """One program traced by one bpftrace process, its lines stored as they arrive."""

    def __init__(
        self,
        program: Program,
        binary: Path,
        postmaster_pid: int,
        store: RunStore,
        server_version_num: int,
        stderr_path: Path,
    ) -> None:
        self.program = program
        self.binary = binary
        self.postmaster_pid = postmaster_pid
        self.output = UsdtOutput(program, store, server_version_num)
        self.process = BpftraceProcess(
            program.name,
            program.source(),
            [],
            on_line=self.output.handle_line,
            stderr_path=stderr_path,
            stop_grace_s=STOP_GRACE_S,
        )

    def spawn(self) -> None:
        # Wall clock minus monotonic clock (bpftrace's nsecs): flushes fall on wall-clock
        # seconds and printed times become epoch microseconds.
        offset_ns = time.time_ns() - time.monotonic_ns()
        self.output.attached(offset_ns)
        self.process.args = [self.binary, str(self.postmaster_pid), str(offset_ns)]
        self.process.start()

    def wait_ready(self, timeout_s: float) -> None:
        self.process.wait_ready(timeout_s)

    def failure(self) -> str | None:
        return self.process.failure()

    def interrupt(self) -> None:
        """SIGINT: bpftrace runs its END probe (a last flush) and exits."""
        self.process.interrupt()

    def stop(self) -> str | None:
        """Interrupt (if not yet), wait for the last flush, drain; say what went wrong."""
        if self.process.proc is None:
            return None
        failed = self.failure()
        code = self.process.stop()
        self.output.finish_checkpoint(None)
        if failed:
            return failed
        if self.process.error:
            return self.process.error
        if not self.output.ended and self.process.ready:
            return (
                f"bpftrace ({self.program.name}) ended without its last flush "
                f"(code {code}): {self.process.reason()}"
            )
        return None
