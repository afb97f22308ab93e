"""Where did the cluster wait off CPU: offcpu.bt's printed map folded into
(pid, state, root-first stack) -> microseconds, user addresses named.

Costs one pass over the map bpftrace prints at the end of a recording (one JSON line, up to
BPFTRACE_MAP_KEYS_MAX keys) and a symbol lookup per distinct address, between steps.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import IO

from pgscope.collect.profiles.elfsymbols import AddressSymbolizer
from pgscope.collect.profiles.profilestore import KERNEL_SUFFIX


def state_name(prev_state: int) -> str:
    """sched_switch's prev_state: 0, or TASK_REPORT_MAX (>= 0x100) when preempted, means the
    task was still runnable; 1 interruptible sleep; 2 uninterruptible (disk, some locks)."""
    if prev_state == 0 or prev_state >= 0x100:
        return "runnable"
    if prev_state & 1:
        return "sleep"
    if prev_state & 2:
        return "blocked"
    return "other"


@dataclass
class OffCpuFolded:
    counts: Counter[tuple[int, str, str]] = field(default_factory=Counter)  # pid, state, stack
    user_frames: int = 0
    unknown_user_frames: int = 0
    lost_stacks: int = 0

    @property
    def unknown_share(self) -> float:
        return self.unknown_user_frames / self.user_frames if self.user_frames else 0.0


def fold_offcpu_key(key: str) -> tuple[int, int, list[str], list[int]]:
    """Split one @offcpu_us key: "pid,state,\\n<kernel frames>\\n,\\n<user frames>\\n".

    Kernel frames come as "    name+off", user frames as "\\taddr 0xaddr ([unknown])"; both
    leaf first."""
    pid_text, state_text, rest = key.split(",", 2)
    kernel: list[str] = []
    user: list[int] = []
    for line in rest.split("\n"):
        if line.startswith("\t"):
            token = line.strip().split(" ", 1)[0]
            try:
                user.append(int(token, 16))
            except ValueError:
                continue
        elif line.startswith("    "):
            kernel.append(line.strip().split("+", 1)[0])
    return int(pid_text), int(state_text), kernel, user


def fold_offcpu(output: IO[str], symbolizer: AddressSymbolizer) -> OffCpuFolded:
    """Fold bpftrace's JSON output of offcpu.bt into (pid, state, stack) -> microseconds."""
    folded = OffCpuFolded()
    names: dict[int, tuple[str, bool]] = {}
    for line in output:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            continue
        if message.get("type") != "map":
            continue
        for key, micros in message["data"].get("@offcpu_us", {}).items():
            pid, state, kernel, user = fold_offcpu_key(key)
            frames: list[str] = []
            for address in reversed(user):
                if address not in names:
                    names[address] = symbolizer.frame(address)
                name, known = names[address]
                if name == "[unknown]" and frames and frames[-1] == name:
                    continue  # a garbage walk through code without frame pointers
                frames.append(name)
                folded.user_frames += 1
                folded.unknown_user_frames += not known
            frames.extend(f"{k}{KERNEL_SUFFIX}" for k in reversed(kernel))
            if not kernel and not user:
                folded.lost_stacks += 1
            stack = ";".join(frames) if frames else "[lost stack]"
            folded.counts[(pid, state_name(state), stack)] += int(micros)
    return folded
