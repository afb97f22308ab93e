"""How perf records the cluster: `perf record` started (and known to be recording),
stopped, and read back with `perf script`.

Costs what perf costs while it samples (docs/collector-perf.md: ~0.6% at 99 Hz system-wide),
~0.3 s to attach, and a few MB of perf.data per minute.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgscope.collect.base import CollectorError
from pgscope.collect.profiles.perffold import ProcessTree
from pgscope.collect.roles import cluster_pids
from pgscope.files import open_for_writing
from pgscope.leftovers import claim
from pgscope.proc import spawn, stop_process

READY_TIMEOUT_S = 20.0
# perf record re-raises the SIGINT that stopped it once its file is written.
CLEAN_EXITS = (0, -signal.SIGINT, None)
STOP_GRACE_S = 30.0


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
        claim(self._fifo_dir)
        ctl, ack = self._fifo_dir / "ctl", self._fifo_dir / "ack"
        os.mkfifo(ctl, 0o600)
        os.mkfifo(ack, 0o600)
        self._stderr = open_for_writing(self.output.parent / f"{self.output.name}.log", "wb")
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
