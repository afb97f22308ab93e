"""Kernel-side tracing of PostgreSQL's static (USDT) probes with bpftrace.

One bpftrace program per question (`bpf/*.bt`: lwlock, lwlock_hold, locks, checkpoint, io),
each a separate bpftrace process filled with three positional parameters: the server's
binary, its postmaster's PID and the offset between the wall clock and the monotonic clock.
The programs aggregate in BPF maps and print them cumulatively at every wall-clock second
(`bpftrace -f json`); a reader thread per process turns the differences into rows as they
arrive. docs/collector-usdt.md documents the tables.

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

import contextlib
import importlib.resources
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pgscope.collect.base import (
    Availability,
    Collector,
    CollectorContext,
    CollectorEnv,
    CollectorError,
)
from pgscope.collect.bpf import (
    PROGRAMS,
    LatencySeries,
    Program,
    argument_problems,
    checkpoint_flags_text,
    checkpoint_phases,
    lock_mode_name,
    lock_type_name,
    lwlock_mode_name,
)
from pgscope.collect.elfprobes import list_probes
from pgscope.errors import EnvironmentProblem, PgscopeError
from pgscope.proc import spawn, stop_process
from pgscope.store import RunStore, now_us
from pgscope.target.conn import ConnParams
from pgscope.target.local import LocalServer

ProgramName = Literal["lwlock", "locks", "checkpoint", "io"]
DEFAULT_PROGRAMS: list[ProgramName] = ["lwlock", "locks", "checkpoint"]
MIN_BPFTRACE = (0, 17)
READY_TIMEOUT_S = 90.0  # LLVM compiles each program; on a loaded 2-core host that takes seconds
STOP_GRACE_S = 20.0
REFCOUNT_FORMAT = Path("/sys/bus/event_source/devices/uprobe/format/ref_ctr_offset")
KERNEL_BTF = Path("/sys/kernel/btf/vmlinux")
TRACEFS_PATHS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
# bpftrace asks for an unlimited RLIMIT_MEMLOCK and says so when a container forbids it;
# kernels >= 5.11 account BPF memory to the cgroup instead, so it is noise, not an error.
_STDERR_NOISE = re.compile(r"couldn't set RLIMIT_MEMLOCK|^Attaching \d+ probes")

SCHEMA = """
CREATE TABLE IF NOT EXISTS usdt_seconds (
    second_us BIGINT NOT NULL,   -- the wall-clock second a flush closed (its start)
    program VARCHAR NOT NULL,    -- lwlock, lwlock_hold, locks, checkpoint, io
    start_us BIGINT NOT NULL,    -- what the second's rows cover: from the previous flush
    end_us BIGINT NOT NULL       --   (or the attach) to this one
);
CREATE TABLE IF NOT EXISTS usdt_latency (
    second_us BIGINT NOT NULL,
    event VARCHAR NOT NULL,      -- lwlock_wait, lwlock_hold, lock_wait, smgr_read, ...
    object VARCHAR,              -- LWLock tranche, lock tag type; NULL for io events
    mode VARCHAR,                -- exclusive/shared/wait_until_free, AccessShareLock, ...
    count BIGINT NOT NULL,       -- events that ended in the second
    total_ns BIGINT NOT NULL     -- their summed duration
);
CREATE TABLE IF NOT EXISTS usdt_latency_hist (
    second_us BIGINT NOT NULL,
    event VARCHAR NOT NULL,
    object VARCHAR,
    mode VARCHAR,
    lo_ns BIGINT NOT NULL,       -- log2 bucket [lo_ns, hi_ns)
    hi_ns BIGINT NOT NULL,
    count BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS usdt_counters (
    second_us BIGINT NOT NULL,
    counter VARCHAR NOT NULL,    -- xact_commit, buffer_accesses, deadlocks, ...
    value BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS usdt_checkpoints (
    start_us BIGINT NOT NULL,    -- checkpoint__start: also the checkpoint's id
    end_us BIGINT,               -- checkpoint__done; NULL when the trace ended first
    status VARCHAR NOT NULL,     -- complete, incomplete
    pid INTEGER,
    flags INTEGER,
    flags_text VARCHAR,          -- as the server log says it: immediate force wait ...
    total_ns BIGINT,
    phases_ns BIGINT,            -- the sum of the phases measured (usdt_checkpoint_phases)
    buffers_total INTEGER,       -- NBuffers
    buffers_to_write INTEGER,    -- dirty buffers marked for this checkpoint
    buffers_written INTEGER,     -- shared buffers it wrote (pg_stat_bgwriter.buffers_checkpoint)
    flushes BIGINT,              -- buffer flushes timed (usdt_checkpoint_flush_hist)
    flush_ns BIGINT              -- their summed latency: time spent writing, sleeps excluded
);
CREATE TABLE IF NOT EXISTS usdt_checkpoint_phases (
    checkpoint_start_us BIGINT NOT NULL,
    seq SMALLINT NOT NULL,       -- order within the checkpoint
    phase VARCHAR NOT NULL,      -- prepare, clog, subtrans, multixact, marking, write, sync, ...
    start_us BIGINT NOT NULL,
    end_us BIGINT NOT NULL,
    duration_ns BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS usdt_checkpoint_flush_hist (
    checkpoint_start_us BIGINT NOT NULL,
    lo_ns BIGINT NOT NULL,
    hi_ns BIGINT NOT NULL,
    count BIGINT NOT NULL
);
"""


# -- finding the server's processes ---------------------------------------------------------


def running_binary(pid: int) -> Path:
    """The executable a running postmaster was started from (what the uprobes go on)."""
    try:
        target = os.readlink(f"/proc/{pid}/exe")
    except FileNotFoundError:
        raise CollectorError(f"postmaster PID {pid} is not running") from None
    except PermissionError:
        raise CollectorError(f"cannot read /proc/{pid}/exe (tracing needs root)") from None
    if target.endswith(" (deleted)"):
        raise CollectorError(
            f"the server's binary {target[: -len(' (deleted)')]} was replaced since the "
            f"server started (a package upgrade?); restart the server to trace it"
        )
    return Path(target)


def _postmasters() -> Iterator[tuple[int, Path]]:
    """(pid, data directory) of every postmaster on this host: a postgres process whose
    parent is not one (the postmaster chdirs to its data directory)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            comm, rest = stat.read_text().rsplit(")", 1)
            if not comm.endswith("(postgres"):
                continue
            parent = int(rest.split()[1])
            parent_comm = Path(f"/proc/{parent}/comm").read_text().strip() if parent else ""
            if parent_comm == "postgres":
                continue
            yield int(stat.parent.name), Path(os.readlink(stat.parent / "cwd"))
        except (OSError, ValueError, IndexError):
            continue


def local_server_for(conn: ConnParams) -> LocalServer | None:
    """The server behind `conn` when it runs on this host, else None.

    A DSN names no process. A server is this one when a local postmaster's postmaster.pid
    gives the port the server reports (`current_setting('port')`) and the same start time
    (`pg_postmaster_start_time()`, to the second): a remote server would have to share both.
    Needs root to see other users' postmasters.
    """
    with conn.connect() as session:
        row = session.execute(
            "SELECT current_setting('port')::int, "
            "extract(epoch FROM pg_postmaster_start_time())::bigint"
        ).fetchone()
    if row is None:
        return None
    port, started = int(row[0]), int(row[1])
    for pid, data_dir in _postmasters():
        try:
            lines = (data_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            continue
        if len(lines) < 4 or lines[0].strip() != str(pid) or not lines[2].strip().isdigit():
            continue
        if lines[3].strip() == str(port) and abs(int(lines[2]) - started) <= 1:
            try:
                return LocalServer.from_data_dir(data_dir)
            except PgscopeError:
                continue
    return None


# -- capabilities ----------------------------------------------------------------------------


def _run(argv: list[str]) -> str | None:
    """What a command printed (bpftrace --info writes to stderr), None if it failed."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout + out.stderr if out.returncode == 0 else None


@cache
def bpftrace_version(path: str) -> tuple[int, ...] | None:
    text = _run([path, "--version"]) or ""
    found = re.search(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g) for g in found.groups() if g is not None) if found else None


@cache
def bpftrace_info(path: str) -> str:
    """`bpftrace --info` (needs root)."""
    return _run([path, "--info"]) or ""


def tracefs_mounted() -> bool:
    return any((path / "events").is_dir() for path in TRACEFS_PATHS)


def capability_problems(is_root: bool, binary: Path | None) -> list[str]:
    """What this host lacks for tracing `binary`'s probes, each with its fix. Without root
    only root and bpftrace are checked: the rest is not visible to other users."""
    problems = []
    bpftrace = shutil.which("bpftrace")
    if not is_root:
        problems.append(
            "tracing needs root: bpftrace loads BPF programs and places uprobes "
            "(fix: run pgscope as root, e.g. with sudo)"
        )
    if bpftrace is None:
        problems.append("bpftrace is not installed (fix: apt-get install bpftrace)")
    if not is_root:
        return problems
    if bpftrace is not None:
        version = bpftrace_version(bpftrace)
        if version is None or version[:2] < MIN_BPFTRACE:
            shown = ".".join(map(str, version)) if version else "of unknown version"
            problems.append(
                f"bpftrace {shown} at {bpftrace} is too old: pgscope needs "
                f"{'.'.join(map(str, MIN_BPFTRACE))} or newer"
            )
        elif not re.search(r"uprobe refcount.*: yes", bpftrace_info(bpftrace)):
            problems.append(
                "bpftrace here cannot raise USDT semaphores for a whole cluster (bpftrace "
                "--info: uprobe refcount is not 'yes'), and PostgreSQL's probes all sit "
                "behind semaphores (fix: Linux >= 4.20 and a bpftrace built on bcc with "
                "uprobe refcount support, as Debian 12's is)"
            )
    if not REFCOUNT_FORMAT.exists():
        problems.append(
            f"the kernel has no uprobe reference counters ({REFCOUNT_FORMAT} is missing), "
            f"needed to raise the probes' semaphores in every backend (fix: Linux >= 4.20)"
        )
    if not KERNEL_BTF.exists():
        problems.append(
            f"no kernel BTF ({KERNEL_BTF}): the programs read the task struct to keep only "
            f"the cluster's processes (fix: a kernel built with CONFIG_DEBUG_INFO_BTF=y)"
        )
    if not tracefs_mounted():
        problems.append(
            "tracefs is not mounted: bpftrace removes its uprobes through it "
            "(fix: mount -t tracefs nodev /sys/kernel/tracing)"
        )
    if binary is not None:
        try:
            probes = list_probes(binary)
        except OSError as exc:
            problems.append(f"cannot read {binary}: {exc.strerror}")
        else:
            if not probes:
                problems.append(
                    f"{binary} has no USDT probes (.note.stapsdt): it was built without "
                    f"--enable-dtrace (Debian's and PGDG's packages have them)"
                )
    return problems


# -- options and the collector ----------------------------------------------------------------


class UsdtOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    programs: list[ProgramName] = Field(
        default_factory=lambda: list(DEFAULT_PROGRAMS),
        min_length=1,
        description="which bpftrace programs to run (io costs tens of uprobe traps per "
        "transaction: on request only)",
    )
    lwlock_hold: bool = Field(
        False,
        description="also time LWLock holds (two traps per acquisition: diagnostic "
        "traces only, it costs more throughput than it measures)",
    )

    def program_names(self) -> list[str]:
        names: list[str] = list(dict.fromkeys(self.programs))
        if self.lwlock_hold:
            names.append("lwlock_hold")
        return names


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
        ctx.store.ensure_schema(SCHEMA)
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


# -- one bpftrace process and the rows it yields ----------------------------------------------


@dataclass
class Cumulative:
    """bpftrace prints each map's running total; the store wants each second's share."""

    last: dict[tuple[str, tuple[str, ...], tuple[int, int] | None], int] = field(
        default_factory=dict
    )

    def delta(
        self, name: str, key: tuple[str, ...], bucket: tuple[int, int] | None, value: int
    ) -> int:
        slot = (name, key, bucket)
        change = value - self.last.get(slot, 0)
        self.last[slot] = value
        return change


Buckets = dict[tuple[int, int], int]  # (min, max) inclusive -> count


def _buckets(printed: Any) -> Buckets:
    """A printed bpftrace histogram: [{"min": lo, "max": hi, "count": n}, ...]."""
    if not isinstance(printed, list):
        return {}
    return {(int(b["min"]), int(b["max"])): int(b["count"]) for b in printed}


def _split_key(key: str, parts: int) -> tuple[str, ...]:
    """bpftrace joins a map's key fields with commas; only the first may hold text."""
    return (key,) if parts <= 1 else tuple(key.rsplit(",", parts - 1))


class _Rows:
    """Column-wise rows for RunStore.append."""

    def __init__(self, *columns: str) -> None:
        self.columns: dict[str, list[Any]] = {c: [] for c in columns}

    def add(self, *values: Any) -> None:
        for column, value in zip(self.columns.values(), values, strict=True):
            column.append(value)


@dataclass
class CheckpointTrace:
    """The events of one checkpoint, in nanoseconds of the monotonic clock."""

    pid: int
    flags: int
    events: dict[str, int] = field(default_factory=dict)
    buffers_total: int | None = None
    buffers_to_write: int | None = None
    buffers_written: int | None = None


class Tracer:
    """One bpftrace process running one program, and the thread that stores its output."""

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
        self.store = store
        self.server_version_num = server_version_num
        self.stderr_path = stderr_path
        self.stderr_start = 0
        self.cumulative = Cumulative()
        self.maps: dict[str, Any] = {}  # latest print of each map since the last flush
        self.ready = threading.Event()
        self.ended = False
        self.stopping = False
        self.error: str | None = None
        self.checkpoint: CheckpointTrace | None = None
        self.proc: subprocess.Popen[str] | None = None
        self.thread: threading.Thread | None = None
        self._file_context: contextlib.ExitStack | None = None

    # -- process ----------------------------------------------------------------------------

    def spawn(self) -> None:
        bpftrace = shutil.which("bpftrace")
        if bpftrace is None:
            raise CollectorError("bpftrace is not installed")
        stack = contextlib.ExitStack()
        path = stack.enter_context(importlib.resources.as_file(self.program.source()))
        self._file_context = stack
        # Wall clock minus monotonic clock (bpftrace's nsecs): flushes fall on wall-clock
        # seconds and printed times become epoch microseconds.
        self.offset_ns = time.time_ns() - time.monotonic_ns()
        self.last_flush_us = now_us()
        with self.stderr_path.open("a") as stderr:  # kept across re-attaches
            self.stderr_start = stderr.tell()
            self.proc = spawn(
                [
                    bpftrace,
                    "-f",
                    "json",
                    path,
                    self.binary,
                    str(self.postmaster_pid),
                    str(self.offset_ns),
                ],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                death_signal=signal.SIGINT,
            )
        self.thread = threading.Thread(
            target=self._read, name=f"pgscope-usdt-{self.program.name}", daemon=True
        )
        self.thread.start()

    def wait_ready(self, timeout_s: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(0.1):
            if self.proc.poll() is not None:
                self._close_file()
                raise CollectorError(
                    f"bpftrace ({self.program.name}) exited at start with code "
                    f"{self.proc.returncode}: {self._stderr_reason()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise CollectorError(
                    f"bpftrace ({self.program.name}) did not attach within {timeout_s:.0f} s"
                )
        self._close_file()  # bpftrace has read the program by now

    def _close_file(self) -> None:
        if self._file_context is not None:
            self._file_context.close()
            self._file_context = None

    def _stderr_reason(self) -> str:
        """What this bpftrace process said on stderr (the file holds earlier ones too)."""
        try:
            with self.stderr_path.open("rb") as handle:
                handle.seek(self.stderr_start)
                lines = handle.read().decode(errors="replace").splitlines()
        except OSError:
            return "no message"
        useful = [ln.strip() for ln in lines if ln.strip() and not _STDERR_NOISE.search(ln)]
        return " ".join(useful[:3]) or "no message"

    def failure(self) -> str | None:
        if self.error:
            return self.error
        if self.proc is not None and not self.stopping and self.proc.poll() is not None:
            return (
                f"bpftrace ({self.program.name}) exited with code {self.proc.returncode}: "
                f"{self._stderr_reason()}"
            )
        return None

    def interrupt(self) -> None:
        """SIGINT: bpftrace runs its END probe (a last flush) and exits."""
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGINT)

    def stop(self) -> str | None:
        """Interrupt (if not yet), wait for the last flush, drain; say what went wrong."""
        if self.proc is None:
            return None
        failed = self.failure()
        self.interrupt()
        try:
            self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            stop_process(self.proc, signal.SIGKILL, 5)
        if self.thread is not None:
            self.thread.join(STOP_GRACE_S)
        self._close_file()
        self.finish_checkpoint(None)
        if failed:
            return failed
        if self.error:
            return self.error
        if not self.ended and self.ready.is_set():
            return (
                f"bpftrace ({self.program.name}) ended without its last flush "
                f"(code {self.proc.returncode}): {self._stderr_reason()}"
            )
        return None

    # -- output -----------------------------------------------------------------------------

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        stream: IO[str] = self.proc.stdout
        try:
            for line in stream:
                if line.strip():
                    self._handle(json.loads(line))
        except Exception as exc:  # keep the process drained; report through failure()
            self.error = f"usdt {self.program.name}: {type(exc).__name__}: {exc}"
            for _ in stream:
                pass

    def _handle(self, message: dict[str, Any]) -> None:
        kind, data = message.get("type"), message.get("data")
        if kind in ("map", "hist") and isinstance(data, dict):
            self.maps.update(data)
        elif kind == "printf" and isinstance(data, str):
            self._handle_text(data.split())
        elif kind == "lost_events" and isinstance(data, dict):
            now = now_us()
            self.store.add_gap(
                "usdt",
                self.last_flush_us,
                now,
                f"bpftrace ({self.program.name}) lost {data.get('events')} output events",
            )

    def _handle_text(self, words: list[str]) -> None:
        if not words:
            return
        if words[0] == "pgscope-ready":
            self.last_flush_us = self._epoch_us(int(words[1]))
            self.ready.set()
        elif words[0] in ("pgscope-flush", "pgscope-end"):
            self._flush(int(words[1]) * 1_000_000, self._epoch_us(int(words[2])))
            if words[0] == "pgscope-end":
                self.ended = True
        elif words[0] == "pgscope-ckpt":
            self._checkpoint_event(words[1], int(words[2]), int(words[3]), words[4:])

    def _epoch_us(self, nsecs: int) -> int:
        return (nsecs + self.offset_ns) // 1000

    def _flush(self, second_us: int, at_us: int) -> None:
        latency = _Rows("second_us", "event", "object", "mode", "count", "total_ns")
        hist = _Rows("second_us", "event", "object", "mode", "lo_ns", "hi_ns", "count")
        for series in self.program.latency:
            for key, buckets in self._hist_entries(series).items():
                obj, mode = self._names(series.event, key)
                count = 0
                for (lo, hi), value in sorted(buckets.items()):
                    change = self.cumulative.delta(series.hist_map, key, (lo, hi), value)
                    if change:
                        count += change
                        unit = series.hist_unit_ns
                        hist.add(
                            second_us, series.event, obj, mode, lo * unit, (hi + 1) * unit, change
                        )
                total = self.cumulative.delta(
                    series.sum_map, key, None, self._sum_entry(series, key)
                )
                if count or total:
                    latency.add(second_us, series.event, obj, mode, count, total)
        counters = _Rows("second_us", "counter", "value")
        for counter in self.program.counters:
            printed = self.maps.get(counter.map_name)
            if isinstance(printed, int):
                change = self.cumulative.delta(counter.map_name, (), None, printed)
                if change:
                    counters.add(second_us, counter.counter, change)
        self.store.append("usdt_latency", latency.columns)
        self.store.append("usdt_latency_hist", hist.columns)
        self.store.append("usdt_counters", counters.columns)
        seconds = _Rows("second_us", "program", "start_us", "end_us")
        seconds.add(second_us, self.program.name, self.last_flush_us, at_us)
        self.store.append("usdt_seconds", seconds.columns)
        self.last_flush_us = at_us

    def _hist_entries(self, series: LatencySeries) -> dict[tuple[str, ...], Buckets]:
        raw = self.maps.get(series.hist_map)
        if raw is None:
            return {}
        keyed = {"": raw} if series.key_parts == 0 else raw
        out: dict[tuple[str, ...], Buckets] = {}
        for key, buckets in keyed.items():
            out[_split_key(key, series.key_parts)] = _buckets(buckets)
        return out

    def _sum_entry(self, series: LatencySeries, key: tuple[str, ...]) -> int:
        raw = self.maps.get(series.sum_map)
        if series.key_parts == 0:
            return int(raw) if isinstance(raw, int) else 0
        if not isinstance(raw, dict):
            return 0
        return int(raw.get(",".join(key), 0))

    def _names(self, event: str, key: tuple[str, ...]) -> tuple[str | None, str | None]:
        if event in ("lwlock_wait", "lwlock_hold"):
            return key[0], lwlock_mode_name(int(key[1]))
        if event == "lock_wait":
            kind, mode = int(key[0]), int(key[1])
            return (
                lock_type_name(kind, self.server_version_num),
                lock_mode_name(mode),
            )
        return None, None

    # -- checkpoints ------------------------------------------------------------------------

    def _checkpoint_event(self, event: str, nsecs: int, pid: int, args: list[str]) -> None:
        if event == "start":
            if self.checkpoint is not None:  # no done for the last one: its process died
                self.finish_checkpoint(None)
            self.checkpoint = CheckpointTrace(pid, int(args[0]))
        ckpt = self.checkpoint
        if ckpt is None or ckpt.pid != pid:
            return
        ckpt.events[event] = nsecs
        if event == "sync_start":
            ckpt.buffers_total, ckpt.buffers_to_write = int(args[0]), int(args[1])
        elif event == "sync_done":
            ckpt.buffers_written = int(args[0])
        elif event == "done":
            self.finish_checkpoint(nsecs)

    def finish_checkpoint(self, done: int | None) -> None:
        """Store the checkpoint in progress: complete at its done event, else as far as it
        got (the trace ended first). Its flush histogram was printed just before."""
        ckpt, self.checkpoint = self.checkpoint, None
        if ckpt is None:
            return
        buckets = _buckets(self.maps.pop("@flush_us", None))
        flush_ns = self.maps.pop("@flush_ns", None)
        start = ckpt.events["start"]
        start_us = self._epoch_us(start)
        phases = checkpoint_phases(ckpt.events)
        record = _Rows(
            "start_us",
            "end_us",
            "status",
            "pid",
            "flags",
            "flags_text",
            "total_ns",
            "phases_ns",
            "buffers_total",
            "buffers_to_write",
            "buffers_written",
            "flushes",
            "flush_ns",
        )
        record.add(
            start_us,
            self._epoch_us(done) if done is not None else None,
            "complete" if done is not None else "incomplete",
            ckpt.pid,
            ckpt.flags,
            checkpoint_flags_text(ckpt.flags),
            done - start if done is not None else None,
            sum(end - begin for _, begin, end in phases),
            ckpt.buffers_total,
            ckpt.buffers_to_write,
            ckpt.buffers_written,
            sum(buckets.values()),
            flush_ns if isinstance(flush_ns, int) else 0,
        )
        self.store.append("usdt_checkpoints", record.columns)
        rows = _Rows("checkpoint_start_us", "seq", "phase", "start_us", "end_us", "duration_ns")
        for seq, (name, begin, end) in enumerate(phases, 1):
            rows.add(start_us, seq, name, self._epoch_us(begin), self._epoch_us(end), end - begin)
        self.store.append("usdt_checkpoint_phases", rows.columns)
        flushes = _Rows("checkpoint_start_us", "lo_ns", "hi_ns", "count")
        for (lo, hi), count in sorted(buckets.items()):
            if count:
                flushes.add(start_us, lo * 1000, (hi + 1) * 1000, count)
        self.store.append("usdt_checkpoint_flush_hist", flushes.columns)
