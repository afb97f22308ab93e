"""Files pgscope writes whole (summaries, reports): all of the new one, or the old one intact;
and scratch trees removed whole.

A plain `write_text` truncates first: on a full or read-only disk it left an empty
summary.json behind, which readers then took for a broken run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

from pgscope.errors import EnvironmentProblem


def write_atomic(path: Path, text: str) -> Path:
    """Write `text` to a temporary file beside `path`, then rename it over `path`. Raises
    EnvironmentProblem, one line, when the folder cannot take it (full, read-only, gone)."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    existed = path.exists()
    try:
        with temp.open("w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())  # the rename must not outlive the data on a crash
        os.replace(temp, path)
    except OSError as exc:
        _discard(temp)
        kept = f" (the previous {path.name} is unchanged)" if existed else ""
        raise EnvironmentProblem(f"cannot write {path}: {exc.strerror or exc}{kept}") from None
    except BaseException:  # a Ctrl-C mid-write leaves no half file behind either
        _discard(temp)
        raise
    return path


def _discard(temp: Path) -> None:
    with contextlib.suppress(OSError):
        temp.unlink()


def remove_tree(path: Path, within_s: float = 5.0) -> bool:
    """Remove `path` and everything in it; True when it is gone. One `rmtree` is not enough
    for a cluster's directory: a server process that outlived its postmaster (killed after a
    shutdown that timed out) can still create files while the tree is removed, and the
    directory stayed behind (once, in a suite run on a host loaded by other work)."""
    deadline = time.monotonic() + within_s
    while True:
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists() or time.monotonic() > deadline:
            return not path.exists()
        time.sleep(0.1)
