"""What the embedded server's own log says happened, brought into the store as events.

Checkpoints above all: the benchmark defaults turn on `log_checkpoints`, and the log gives each
checkpoint's start (with its reason: time, wal, immediate, shutdown...) and its end (buffers
written, write and sync times) to the millisecond, which nothing cheaper does. The line
format is the embedded cluster's own `log_line_prefix` ('%m [%p] %q%u@%d %Q ').
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pgscope.files import read_regular

_LINE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) (?P<tz>\S+) \[(?P<pid>\d+)\] "
    r"(?:\S*@\S* (?:-?\d+ )?)?LOG:\s+"
    r"(?P<what>checkpoint (?:starting|complete)|restartpoint (?:starting|complete)): ?"
    r"(?P<detail>.*)$"
)


@dataclass(frozen=True)
class LogEvent:
    ts_us: int
    kind: str  # "checkpoint-start", "checkpoint-done" (restartpoints on standbys likewise)
    detail: str


def checkpoint_events(log: Path) -> list[LogEvent]:
    """Checkpoint starts and ends in a server log; an unreadable log gives none, and so does
    anything but a regular file at its name (a link is not followed, a FIFO not waited on)."""
    try:
        lines = read_regular(log).decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    events = []
    for line in lines:
        match = _LINE.match(line)
        if match is None or match["tz"] not in ("UTC", "Etc/UTC", "GMT"):
            continue  # pgscope's clusters log in UTC; anything else we would misplace
        when = datetime.fromisoformat(match["ts"] + "+00:00")
        kind = "checkpoint-start" if match["what"].endswith("starting") else "checkpoint-done"
        events.append(LogEvent(round(when.timestamp() * 1_000_000), kind, match["detail"]))
    return events
