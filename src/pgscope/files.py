"""Files pgscope writes whole (summaries, reports): all of the new one, or the old one intact.

A plain `write_text` truncates first: on a full or read-only disk it left an empty
summary.json behind, which readers then took for a broken run.
"""

from __future__ import annotations

import contextlib
import os
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
