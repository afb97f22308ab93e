"""On-CPU profiles: `perf record` of the target cluster's processes, one profile per step.

perf samples `cpu-clock` (a software event: this class of VM has no hardware counters) at 99 Hz
by default, with kernel and user call chains walked by frame pointers (Debian's server keeps
them). By default it samples every CPU (`-a`, no cost per context switch) and folding keeps the
cluster's process tree only: the postmaster and its children, plus every process they fork
while recording (pgbench connects after the step started), from perf's own fork records.
Another cluster's processes are never in the profile. `attach = "process"` uses `perf -p`
with inherited events instead: the kernel isolates, but each context switch of a profiled
process pays for switching its event (docs/collector-perf.md).

Each step gets its own recording, started at `step_started` (the collector waits until perf
acknowledges a `ping` on its control FIFO, i.e. its events are open) and folded right after
`step_finished`, between steps, so that folding does not load the next step. Outside a run's
steps (`pgscope profile`), one recording spans the whole session.

Symbols come from `perf script`. The stripped server binary exports its global functions only:
a frame perf cannot name is kept as `postgres+0x34b06c` (file-relative address), never dropped.
Kernel frames carry the ecosystem's `_[k]` suffix. Each stack is attributed to a process role
(backend, walwriter, logger, ...) read from the process titles while the step runs.

Tables (docs/collector-perf.md): `profiles` (one row per recording), `profile_processes`
(which PIDs) and `profile_stacks` (folded stacks, `value` = samples); the off-CPU collector
(`offcpu.py`) shares them.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from pgscope.collect.base import (
    Availability,
    Collector,
    CollectorContext,
    CollectorEnv,
    CollectorError,
    StepInfo,
)
from pgscope.proc import child_pids, spawn, stop_process
from pgscope.store import RunStore, now_us

PROFILE_SCHEMA = """
CREATE TABLE IF NOT EXISTS profiles (
    step_id INTEGER,          -- NULL: a standalone session (pgscope profile)
    kind VARCHAR NOT NULL,    -- 'cpu' (value = samples) or 'offcpu' (value = microseconds)
    started_us BIGINT,
    ended_us BIGINT,
    hz INTEGER,               -- cpu: sampling frequency
    total BIGINT,             -- sum of value over the recording's stacks
    stacks INTEGER,           -- distinct (role, state, stack) rows stored
    processes INTEGER,        -- distinct processes seen
    unknown_frames DOUBLE,    -- share of user frames without a symbol
    note VARCHAR
);
CREATE TABLE IF NOT EXISTS profile_processes (
    step_id INTEGER,
    kind VARCHAR NOT NULL,
    pid INTEGER NOT NULL,     -- a process of the cluster that was profiled
    role VARCHAR NOT NULL,
    value BIGINT NOT NULL     -- its samples (cpu) or microseconds (offcpu)
);
CREATE TABLE IF NOT EXISTS profile_stacks (
    step_id INTEGER,
    kind VARCHAR NOT NULL,
    role VARCHAR NOT NULL,    -- backend, postmaster, walwriter, checkpointer, logger, ...
    state VARCHAR,            -- offcpu: sleep, disk, runnable (preempted) or other
    stack VARCHAR NOT NULL,   -- folded frames, root first, ';'-separated; kernel frames '_[k]'
    value BIGINT NOT NULL
);
"""

KERNEL_SUFFIX = "_[k]"
READY_TIMEOUT_S = 20.0
# perf record re-raises the SIGINT that stopped it once its file is written.
_CLEAN_EXITS = (0, -signal.SIGINT, None)
STOP_GRACE_S = 30.0

# Process titles after "postgres: " (optionally "cluster_name: "), for PostgreSQL 12-17.
_AUX_ROLES = {
    "logger": "logger",
    "checkpointer": "checkpointer",
    "background writer": "bgwriter",
    "walwriter": "walwriter",
    "autovacuum launcher": "autovacuum",
    "autovacuum worker": "autovacuum",
    "logical replication launcher": "logical-replication",
    "logical replication worker": "logical-replication",
    "logical replication apply worker": "logical-replication",
    "walsender": "walsender",
    "walreceiver": "walreceiver",
    "startup": "startup",
    "archiver": "archiver",
    "stats collector": "stats",
    "parallel worker": "parallel-worker",
    "walsummarizer": "walsummarizer",
}


def process_role(title: str) -> str:
    """The role of a cluster process from its title (`/proc/PID/cmdline`), e.g.
    "postgres: walwriter" -> walwriter, "postgres: bench bench [local] SELECT" -> backend."""
    if not title.startswith("postgres: "):
        return "postmaster"
    rest = title[len("postgres: ") :].strip()
    for candidate in (rest, rest.split(": ", 1)[-1]):  # with or without a cluster_name
        for prefix, role in _AUX_ROLES.items():
            if candidate == prefix or candidate.startswith(prefix + " "):
                return role
    return "backend"


def _title(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def cluster_pids(postmaster: int) -> list[int]:
    """The postmaster and its children (PostgreSQL forks every process from the postmaster)."""
    return [postmaster, *child_pids(postmaster)]


class ProcessRoles:
    """Who is who in the cluster while a recording runs: PID -> role, polled from the process
    titles (every 0.5 s, ~1 ms each), because backends are gone by the time stacks are folded.
    A PID never seen alive falls back to its stack (see role_of)."""

    def __init__(self, postmaster: int, interval_s: float = 0.5) -> None:
        self.postmaster = postmaster
        self.interval_s = interval_s
        self.roles: dict[int, str] = {}
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.poll()

    def poll(self) -> None:
        for pid in cluster_pids(self.postmaster):
            if pid in self.roles:
                continue
            title = _title(pid)
            if title is not None:
                self.roles[pid] = "postmaster" if pid == self.postmaster else process_role(title)

    def start(self) -> None:
        def loop() -> None:
            while not self._done.wait(self.interval_s):
                self.poll()

        self._thread = threading.Thread(target=loop, name="pgscope-roles", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(5)
        self.poll()

    def role_of(self, pid: int, frames: Iterable[str]) -> str:
        known = self.roles.get(pid)
        if known is not None:
            return known
        # Too short-lived for the poll: a connection that started or ended between two
        # polls, or an autovacuum / background worker. Every process here is a postmaster
        # child (perf and offcpu.bt follow nothing else), so the stack decides.
        names = set(frames)
        if "StartAutoVacWorker" in names:
            return "autovacuum"
        if "StartBackgroundWorker" in names:
            return "bgworker"
        if "PostgresMain" in names or "PostmasterMain" in names:
            return "backend"
        return "unknown"


# ---------------------------------------------------------------------------------------------
# Folding `perf script` output

_SAMPLE_HEAD = re.compile(r"^(?P<comm>.*?)\s+(?P<pid>\d+)/(?P<tid>\d+)\s*$")
_TASK_EVENT = re.compile(
    r"PERF_RECORD_(?P<what>FORK|EXIT)\((?P<pid>\d+):\d+\):\((?P<ppid>\d+):\d+\)"
)


@dataclass
class ProcessTree:
    """The cluster's processes as a recording goes on: the postmaster and its children at
    the start, then every process a member forks; a member that exits leaves (its PID may be
    reused by anyone)."""

    members: set[int]
    postmaster: int
    seen: set[int] = field(default_factory=set)

    def fork(self, child: int, parent: int) -> None:
        if parent in self.members:
            self.members.add(child)

    def exit(self, pid: int) -> None:
        if pid != self.postmaster:
            self.members.discard(pid)

    def keeps(self, pid: int) -> bool:
        if pid in self.members:
            self.seen.add(pid)
            return True
        return False


_FRAME = re.compile(r"^\s+(?P<ip>[0-9a-f]+)\s+(?P<sym>.*?)\s+\((?P<dso>.*)\)\s*$")


@dataclass
class Folded:
    """Folded stacks of one recording: (pid, root-first frames) -> value."""

    counts: Counter[tuple[int, str]] = field(default_factory=Counter)
    other: int = 0  # samples of processes outside the cluster (system-wide recordings)
    user_frames: int = 0
    unknown_user_frames: int = 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def unknown_share(self) -> float:
        return self.unknown_user_frames / self.user_frames if self.user_frames else 0.0


def frame_name(ip: str, sym: str, dso: str) -> tuple[str, bool, bool]:
    """(name, is_kernel, is_unknown) of one `perf script` call-chain line."""
    kernel = dso.startswith("[kernel") or dso.startswith("[guest.kernel")
    if kernel:
        return (sym if sym and sym != "[unknown]" else "[unknown]") + KERNEL_SUFFIX, True, False
    if sym and sym != "[unknown]":
        # One frame per function: no "+0x1f" offset, no symbol version ("@@GLIBC_2.2.5").
        return sym.split("+0x", 1)[0].split("@", 1)[0], False, False
    if dso and dso != "[unknown]":
        return f"{os.path.basename(dso)}+0x{int(ip, 16):x}", False, True
    return "[unknown]", False, True


def fold_perf_script(lines: Iterable[str], tree: ProcessTree | None = None) -> Folded:
    """Fold `perf script -F comm,pid,tid,ip,sym,dso --show-task-events` output: one entry
    per distinct (pid, stack). With a `tree`, only its members' samples are kept (fork and
    exit records, in time order with the samples, keep it current); `Folded.other` counts the
    rest. A sample without a call chain counts as `[no stack]`: the cluster's samples are
    never dropped.
    """
    folded = Folded()
    pid: int | None = None
    keep = False
    frames: list[str] = []

    def flush() -> None:
        if pid is not None and keep:
            stack = ";".join(reversed(frames)) if frames else "[no stack]"
            folded.counts[(pid, stack)] += 1
        elif pid is not None:
            folded.other += 1

    for line in lines:
        if not line.strip():
            continue
        task = _TASK_EVENT.search(line) if "PERF_RECORD_" in line else None
        if task is not None:
            if tree is not None:
                if task["what"] == "FORK":
                    tree.fork(int(task["pid"]), int(task["ppid"]))
                else:
                    tree.exit(int(task["pid"]))
            continue
        if not line[0].isspace() or _FRAME.match(line) is None:
            head = _SAMPLE_HEAD.match(line.rstrip("\n"))
            if head is None:
                continue
            flush()
            pid, frames = int(head["pid"]), []
            keep = tree is None or tree.keeps(pid)
            continue
        match = _FRAME.match(line)
        if match is None or pid is None or not keep:
            continue
        name, kernel, unknown = frame_name(match["ip"], match["sym"], match["dso"])
        if name == "[unknown]" and frames and frames[-1] == name:
            continue  # a walk through code without frame pointers: one mark, not 100
        frames.append(name)
        if not kernel:
            folded.user_frames += 1
            folded.unknown_user_frames += unknown
    flush()
    return folded


def store_folded(
    store: RunStore,
    step_id: int | None,
    kind: str,
    rows: Counter[tuple[str, str | None, str]],
    *,
    started_us: int,
    ended_us: int,
    hz: int | None,
    processes: Counter[tuple[int, str]],
    unknown_share: float,
    note: str | None,
) -> int:
    """Write one recording: its `profiles` row, its (role, state, stack) -> value rows and
    its (pid, role) -> value rows."""
    items = sorted(rows.items(), key=lambda kv: -kv[1])
    store.append(
        "profile_stacks",
        {
            "step_id": [step_id] * len(items),
            "kind": [kind] * len(items),
            "role": [k[0] for k, _ in items],
            "state": [k[1] for k, _ in items],
            "stack": [k[2] for k, _ in items],
            "value": [v for _, v in items],
        },
    )
    store.append(
        "profile_processes",
        {
            "step_id": [step_id] * len(processes),
            "kind": [kind] * len(processes),
            "pid": [pid for pid, _ in processes],
            "role": [role for _, role in processes],
            "value": list(processes.values()),
        },
    )
    total = sum(rows.values())
    store.db.execute(
        "INSERT INTO profiles VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            step_id,
            kind,
            started_us,
            ended_us,
            hz,
            total,
            len(items),
            len({pid for pid, _ in processes}),
            unknown_share,
            note,
        ],
    )
    return total


# ---------------------------------------------------------------------------------------------
# One perf recording


def perf_binary() -> str | None:
    return shutil.which("perf")


@dataclass
class PerfRecording:
    """`perf record` of some processes and their future children, into one perf.data file."""

    perf: str
    target: list[str]  # ["-a"] or ["-p", "PID,PID,..."]
    hz: int
    output: Path
    _proc: subprocess.Popen[bytes] | None = None
    _fifo_dir: Path | None = None
    _stderr: Any = None

    def start(self) -> None:
        self._fifo_dir = Path(tempfile.mkdtemp(prefix="pgscope-perfctl-"))
        ctl, ack = self._fifo_dir / "ctl", self._fifo_dir / "ack"
        os.mkfifo(ctl, 0o600)
        os.mkfifo(ack, 0o600)
        self._stderr = (self.output.parent / f"{self.output.name}.log").open("wb")
        argv = [
            self.perf,
            "record",
            "--quiet",
            "-e",
            "cpu-clock",
            "-F",
            str(self.hz),
            "-g",  # frame-pointer call chains, kernel and user
            *self.target,
            "-o",
            str(self.output),
            f"--control=fifo:{ctl},{ack}",
        ]
        self._proc = spawn(
            argv, stdout=self._stderr, stderr=self._stderr, death_signal=signal.SIGINT
        )
        # perf reads its control FIFO only once its events are open and enabled, so the
        # acknowledged ping means "recording" (~0.3 s here).
        ctl_fd = os.open(ctl, os.O_RDWR)
        ack_fd = os.open(ack, os.O_RDWR | os.O_NONBLOCK)
        try:
            os.write(ctl_fd, b"ping\n")
            deadline = time.monotonic() + READY_TIMEOUT_S
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    raise CollectorError(f"perf record exited at start: {self.error_text()}")
                ready, _, _ = select.select([ack_fd], [], [], 0.1)
                if ready and os.read(ack_fd, 64).startswith(b"ack"):
                    return
            raise CollectorError(f"perf record did not start within {READY_TIMEOUT_S:.0f} s")
        finally:
            os.close(ctl_fd)
            os.close(ack_fd)

    def failure(self) -> str | None:
        """Why perf stopped on its own while recording, else None."""
        if self._proc is None or self._proc.poll() is None:
            return None
        return f"perf record exited {self._proc.returncode}: {self.error_text()}"

    def error_text(self) -> str:
        if self._stderr is None:
            return "no output"
        if not self._stderr.closed:  # read by name: a closed file is fine
            self._stderr.flush()
        text = Path(self._stderr.name).read_text(errors="replace").strip().splitlines()
        useful = [ln for ln in text if ln.strip() and not ln.startswith("[ perf record:")]
        return useful[-1] if useful else "no error output"

    def finish(self) -> int | None:
        """Stop recording (SIGINT: perf writes its file and exits); the exit code."""
        code = None
        if self._proc is not None:
            code = stop_process(self._proc, signal.SIGINT, grace_s=STOP_GRACE_S)
            self._proc = None
        if self._fifo_dir is not None:
            shutil.rmtree(self._fifo_dir, ignore_errors=True)
            self._fifo_dir = None
        if self._stderr is not None:
            self._stderr.close()
        return code

    def script(self) -> Iterator[str]:
        """The recording's samples as `perf script` lines (streamed: large profiles stay
        out of memory)."""
        argv = [
            self.perf,
            "script",
            "-i",
            str(self.output),
            "-F",
            "comm,pid,tid,ip,sym,dso",
            "--show-task-events",  # fork and exit records: who belongs to the cluster
        ]
        with subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, errors="replace"
        ) as proc:
            assert proc.stdout is not None
            yield from proc.stdout
            if proc.wait() != 0:
                raise CollectorError(
                    f"perf script failed on {self.output} (exit {proc.returncode})"
                )


def start_recording(
    perf: str, postmaster: int, hz: int, output: Path, attach: str
) -> tuple[PerfRecording, ProcessTree]:
    """Start perf on the cluster; returns the recording and the process tree that decides
    which samples are the cluster's.

    attach="system": sample every CPU (`-a`) and keep the cluster's process tree: the
    postmaster and its children listed once perf records, plus whatever they fork (perf's
    fork records). Per-CPU sampling costs nothing per context switch.
    attach="process": `-p` the postmaster and its children with inherited events: only they
    are sampled, but every context switch of a profiled process reprograms its event. A child
    may exit between listing and attaching; one retry with a fresh list covers that.
    """
    last: CollectorError | None = None
    for _ in range(2):
        pids = cluster_pids(postmaster)
        target = ["-a"] if attach == "system" else ["-p", ",".join(map(str, pids))]
        recording = PerfRecording(perf, target, hz, output)
        try:
            recording.start()
        except CollectorError as exc:
            recording.finish()
            last = exc
            continue
        return recording, ProcessTree({postmaster, *cluster_pids(postmaster)}, postmaster)
    assert last is not None
    raise last


# ---------------------------------------------------------------------------------------------
# The collector


class PerfOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hz: int = Field(99, ge=1, le=5000, description="samples per second per CPU")
    attach: Literal["system", "process"] = Field(
        "system",
        description="system: sample all CPUs, keep the cluster's process tree (no cost per "
        "context switch); process: perf -p with inherited per-process events",
    )
    keep_data: bool = Field(False, description="keep each recording's perf.data file")


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


_PACKAGE = {"perf": "linux-perf", "bpftrace": "bpftrace"}


@dataclass
class _Segment:
    """One recording in progress: a step's, or the session's (step None)."""

    step_id: int | None
    started_us: int
    roles: ProcessRoles
    recording: PerfRecording
    tree: ProcessTree


class PerfCollector(Collector):
    name = "perf"
    summary = "on-CPU profile per step (perf, cpu-clock, kernel+user stacks)"
    cost: ClassVar[str] = "see docs/benchmarks.md (on-CPU profile at 99 Hz, bench/bench_perf.py)"
    default_in_runs = False
    Options = PerfOptions

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        return check_profiling(env, "perf", perf_binary())

    def start(self, ctx: CollectorContext) -> None:
        self.segment: _Segment | None = None  # first: stop() must work whatever fails next
        assert isinstance(self.options, PerfOptions)
        perf = perf_binary()
        if perf is None:
            raise CollectorError("perf not found in PATH")
        self.perf = perf
        self.ctx = ctx
        ctx.store.ensure_schema(PROFILE_SCHEMA)
        self.in_steps = False
        self._begin(None)  # the session's recording, replaced by steps in a run

    def _begin(self, step_id: int | None) -> None:
        assert isinstance(self.options, PerfOptions)
        postmaster = self.ctx.postmaster_pid()
        if postmaster is None:
            raise CollectorError("the server is not running (no postmaster PID)")
        tag = "session" if step_id is None else f"step-{step_id:04d}"
        output = self.ctx.artifacts / f"perf-{tag}.data"
        roles = ProcessRoles(postmaster)
        recording, tree = start_recording(
            self.perf, postmaster, self.options.hz, output, self.options.attach
        )
        roles.start()
        self.segment = _Segment(step_id, now_us(), roles, recording, tree)

    def _end(self, keep: bool) -> None:
        assert isinstance(self.options, PerfOptions)
        segment, self.segment = self.segment, None
        if segment is None:
            return
        recording = segment.recording
        code = recording.finish()
        ended_us = now_us()
        segment.roles.stop()
        try:
            if keep:
                if not recording.output.is_file():
                    raise CollectorError(f"perf record wrote no data (exit {code})")
                folded = fold_perf_script(recording.script(), segment.tree)
                rows: Counter[tuple[str, str | None, str]] = Counter()
                processes: Counter[tuple[int, str]] = Counter()
                for (pid, stack), count in folded.counts.items():
                    role = segment.roles.role_of(pid, stack.split(";"))
                    rows[(role, None, stack)] += count
                    processes[(pid, role)] += count
                store_folded(
                    self.ctx.store,
                    segment.step_id,
                    "cpu",
                    rows,
                    started_us=segment.started_us,
                    ended_us=ended_us,
                    hz=self.options.hz,
                    processes=processes,
                    unknown_share=folded.unknown_share,
                    note=None if code in _CLEAN_EXITS else f"perf record exited {code}",
                )
        finally:
            if not self.options.keep_data or not keep:
                recording.output.unlink(missing_ok=True)
                Path(f"{recording.output}.log").unlink(missing_ok=True)

    def step_started(self, step: StepInfo) -> None:
        if not self.in_steps:
            self.in_steps = True
            self._end(keep=False)  # a run: the time before the first step is not profiled
        self._begin(step.step_id)

    def step_finished(self, step: StepInfo) -> None:
        self._end(keep=True)

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
            return f"folding the last profile failed: {exc}"
        return None
