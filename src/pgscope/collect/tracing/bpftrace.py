"""One bpftrace process: is it tracing yet, is it still tracing, and if not, why not?

The usdt collector runs one per program, the off-CPU collector one per step; both go through
this. It costs one reader thread per process (draining stdout, a few lines a second while a
program traces) on top of what the program itself costs (each `.bt` header says).

The protocol with a program: `-f json` output; the program's BEGIN prints
`pgscope-ready <nsecs>` (its probes are attached by then); SIGINT runs its END probe (a last
print) and bpftrace exits. A program that would otherwise print nothing for long prints
`pgscope-heartbeat` every second, which is dropped here: bpftrace 0.17 was seen to sit on a
SIGINT for 60 s while idle in epoll_wait, and any output wakes it.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import IO

from pgscope.collect.base import CollectorError
from pgscope.files import open_for_writing
from pgscope.proc import spawn, stop_process

# Matched on the raw line, so that a multi-megabyte map print is never parsed twice.
_READY = b'"data": "pgscope-ready'
_HEARTBEAT = b'{"type": "printf", "data": "pgscope-heartbeat'
# bpftrace asks for an unlimited RLIMIT_MEMLOCK and says so when a container forbids it;
# kernels >= 5.11 account BPF memory to the cgroup instead, so it is noise, not an error.
_STDERR_NOISE = re.compile(r"couldn't set RLIMIT_MEMLOCK|^Attaching \d+ probes")


def bpftrace_binary() -> str | None:
    return shutil.which("bpftrace")


class BpftraceProcess:
    """bpftrace running one program, its stdout handed line by line to `on_line` (from the
    reader thread), its stderr appended to `stderr_path`."""

    def __init__(
        self,
        label: str,
        program: Traversable,
        args: Sequence[str | os.PathLike[str]],
        *,
        on_line: Callable[[bytes], None],
        stderr_path: Path,
        stop_grace_s: float,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.label = label
        self.program = program
        self.args = list(args)
        self.on_line = on_line
        self.stderr_path = stderr_path
        self.stop_grace_s = stop_grace_s
        self.env = env
        self.error: str | None = None  # the reader failed; the process was drained
        self.stopping = False
        self.killed = False  # did not exit within the grace after SIGINT
        self.proc: subprocess.Popen[bytes] | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._stderr_start = 0
        self._program_file: contextlib.ExitStack | None = None

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    def start(self) -> None:
        """Spawn, without waiting for the attach: callers starting several let the LLVM
        compiles overlap. From the main thread only (the parent-death signal is per thread)."""
        bpftrace = bpftrace_binary()
        if bpftrace is None:
            raise CollectorError("bpftrace is not installed")
        stack = contextlib.ExitStack()
        path = stack.enter_context(importlib.resources.as_file(self.program))
        self._program_file = stack
        # Appended, never truncated: a collector that re-attaches keeps every attempt's
        # messages, and reason() reads only this process's part.
        with open_for_writing(self.stderr_path, "ab") as stderr:
            self._stderr_start = stderr.tell()
            self.proc = spawn(
                [bpftrace, "-f", "json", path, *self.args],
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=self.env,
                death_signal=signal.SIGINT,  # bpftrace's own way out: END runs, probes detach
            )
        self._thread = threading.Thread(
            target=self._read, name=f"pgscope-bpftrace-{self.label}", daemon=True
        )
        self._thread.start()

    def wait_ready(self, timeout_s: float) -> None:
        """Until the program's BEGIN has printed (its probes are attached), or raise."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.1):
            if self.proc.poll() is not None:
                self._release_program()
                raise CollectorError(
                    f"bpftrace ({self.label}) exited at start with code "
                    f"{self.proc.returncode}: {self.reason()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise CollectorError(
                    f"bpftrace ({self.label}) did not attach within {timeout_s:.0f} s"
                )
        self._release_program()  # bpftrace has read the program by now

    def _release_program(self) -> None:
        if self._program_file is not None:
            self._program_file.close()
            self._program_file = None

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        stream: IO[bytes] = self.proc.stdout
        try:
            for line in stream:
                if not line.strip() or line.startswith(_HEARTBEAT):
                    continue
                self.on_line(line)
                if not self._ready.is_set() and _READY in line:
                    self._ready.set()  # after on_line: the reader has seen the ready line
        except Exception as exc:  # keep the process drained; report through failure()
            self.error = f"bpftrace ({self.label}) output: {type(exc).__name__}: {exc}"
            for _ in stream:
                pass

    def reason(self) -> str:
        """What this process said on stderr, noise left out; the first lines, where bpftrace
        names the error (the lines after it point into the program's source)."""
        try:
            with self.stderr_path.open("rb") as handle:
                handle.seek(self._stderr_start)
                lines = handle.read().decode(errors="replace").splitlines()
        except OSError:
            return "no message"
        useful = [ln.strip() for ln in lines if ln.strip() and not _STDERR_NOISE.search(ln)]
        return " ".join(useful[:3]) or "no message"

    def failure(self) -> str | None:
        """Why it stopped tracing on its own, else None."""
        if self.error:
            return self.error
        if self.proc is not None and not self.stopping and self.proc.poll() is not None:
            return (
                f"bpftrace ({self.label}) exited with code {self.proc.returncode}: {self.reason()}"
            )
        return None

    def interrupt(self) -> None:
        """SIGINT without waiting: several processes then print their last maps at once."""
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGINT)

    def stop(self) -> int | None:
        """SIGINT (if not yet), the grace for the END probe's print, then SIGKILL of its
        process group; the output drained. The exit code; None if it never started."""
        if self.proc is None:
            return None
        self.interrupt()
        try:
            self.proc.wait(self.stop_grace_s)
        except subprocess.TimeoutExpired:
            self.killed = True
            stop_process(self.proc, signal.SIGKILL, 5)
        if self._thread is not None:
            self._thread.join(self.stop_grace_s)
        self._release_program()
        return self.proc.returncode
