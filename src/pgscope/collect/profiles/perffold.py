"""Which stacks did perf sample in the cluster: `perf script` output folded into
(pid, root-first stack) -> samples, with frame names cleaned up.

Only the cluster's process tree is kept (perf's fork and exit records keep it current).
Costs the parse of `perf script`'s text: ~1.6 s for a 60-second whole-cluster profile here,
run between steps.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from pgscope.collect.profiles.profilestore import KERNEL_SUFFIX

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
