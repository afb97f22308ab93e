"""The real CLI, run as a user runs it: in a process of its own, its output read, its errors
one line."""

from __future__ import annotations

import json
import locale
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# `python -m pgscope` spends a second importing before it does anything, and the suite runs it
# about a hundred times. A zygote imports pgscope once; each call is a fork of it that becomes
# `python -m pgscope ARGS`: its own process, environment, working directory, stdin /dev/null,
# stdout and stderr to files, its exit status as the interpreter's. PGSCOPE_TEST_ZYGOTE=0
# runs `python -m pgscope` instead.
ZYGOTE = r"""
import ctypes, json, os, pkgutil, importlib, runpy, signal, sys, tempfile
ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # gone with the test session
import pgscope
for found in pkgutil.walk_packages(pgscope.__path__, "pgscope.", onerror=lambda name: None):
    if not found.name.endswith("__main__"):
        try:
            importlib.import_module(found.name)
        except Exception:
            pass  # the fork imports it again, and fails as `python -m pgscope` would

def become(request, replies):
    replies.close()
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, request["out"]), (2, request["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    os.closerange(3, 256)
    sys.stdin = open(0, closefd=False)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None
    sys.argv = ["-m", *request["args"]]
    runpy.run_module("pgscope", run_name="__main__", alter_sys=True)  # raises SystemExit

replies = os.fdopen(os.dup(1), "w", buffering=1)
for line in sys.stdin:
    request = json.loads(line)
    child = os.fork()
    if child == 0:
        become(request, replies)
        sys.exit(0)
    replies.write(f"{child}\n")
    replies.write(f"{os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])}\n")
"""


class Zygote:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self.pending = b""

    def _line(self, deadline: float | None) -> str | None:
        assert self.proc.stdout is not None
        while b"\n" not in self.pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"the CLI zygote exited ({self.proc.wait()})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode()

    def run(
        self, args: list[str], env: dict[str, str], cwd: Path | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        assert self.proc.stdin is not None
        with tempfile.TemporaryDirectory(prefix="cli-") as tmp:
            out, err = Path(tmp, "out"), Path(tmp, "err")
            request = {"args": args, "env": env, "cwd": str(cwd or Path.cwd())}
            self.proc.stdin.write(
                json.dumps({**request, "out": str(out), "err": str(err)}).encode()
            )
            self.proc.stdin.write(b"\n")
            self.proc.stdin.flush()
            pid = int(self._line(None) or 0)
            code = self._line(time.monotonic() + timeout)
            argv = [sys.executable, "-m", "pgscope", *args]
            if code is None:
                os.kill(pid, signal.SIGKILL)
                self._line(None)
                raise subprocess.TimeoutExpired(argv, timeout, _read(out), _read(err))
            return subprocess.CompletedProcess(argv, int(code), _read(out), _read(err))

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _read(path: Path) -> str:
    with path.open(encoding=locale.getpreferredencoding(False)) as f:  # as text=True reads
        return f.read()


_zygote: Zygote | None = None


def pgscope(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a process of its own, as a user would."""
    full_env = {**os.environ, **(env or {})}
    if os.environ.get("PGSCOPE_TEST_ZYGOTE") == "0":
        return subprocess.run(
            [sys.executable, "-m", "pgscope", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
            cwd=cwd,
        )
    return _live_zygote().run(list(args), full_env, cwd, timeout)


def _live_zygote() -> Zygote:
    global _zygote
    if _zygote is None or _zygote.proc.poll() is not None:
        _zygote = Zygote()
    return _zygote


def zygote_pid() -> int | None:
    return None if _zygote is None else _zygote.proc.pid


def stop_zygote() -> None:
    if _zygote is not None:
        _zygote.stop()


def cli_processes() -> list[int]:
    """The processes that start pgscope's CLI: this one and the zygote that forks `pgscope`'s
    runs (started now if it is not yet, so that it exists before anything joins a group)."""
    if os.environ.get("PGSCOPE_TEST_ZYGOTE") == "0":
        return [os.getpid()]
    return [os.getpid(), _live_zygote().proc.pid]


def start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """The real CLI in the background, its stderr to read line by line (see wait_for_line)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pgscope", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def wait_for_line(proc: subprocess.Popen[str], pattern: str, timeout: float = 180) -> list[str]:
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if re.search(pattern, line):
            return seen
    proc.kill()  # never left running behind a failed test
    raise AssertionError(f"no line matching {pattern!r} in: {seen}")


def stop_within(proc: subprocess.Popen[str], sig: signal.Signals, seconds: float = 10) -> str:
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=seconds + 5)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"no exit within {seconds} s of {sig.name}") from None
    assert time.monotonic() - sent < seconds, "slower than promised"
    return err


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The error a user sees: exactly one line on stderr, never a traceback."""
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    assert lines, f"no error message; stdout: {result.stdout[-500:]}"
    last = lines[-1]
    assert last.startswith("pgscope: error: "), result.stderr
    assert sum(1 for ln in lines if ln.startswith("pgscope: error")) == 1, result.stderr
    return last
