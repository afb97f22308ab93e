"""What the host is: recorded with every run, because figures mean little without it."""

from __future__ import annotations

import math
import os
import platform
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any


def usable_cores() -> int:
    """CPUs this process may use: those its affinity allows (taskset, a cpuset), and no more
    than the CPU time its cgroup allows, rounded up (a container limited to 1.5 CPUs by
    cgroup v2's `cpu.max`, or v1's CFS quota, may have every host core in its affinity)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        cores = os.cpu_count() or 1
    quota = cpu_quota()
    return max(1, min(cores, math.ceil(quota))) if quota is not None else cores


def cpu_quota(pid: int | str = "self") -> float | None:
    """The CPUs' worth of time a process's cgroup allows it: the tightest quota / period of
    its cgroup and every cgroup above it, cgroup v2's `cpu.max` where the cpu controller is
    on the unified hierarchy, else cgroup v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us`.
    None: no limit, or none readable (not Linux, no cgroup file system mounted)."""
    try:
        memberships = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        mounts = _cgroup_mounts()
    except OSError:
        return None
    limits = []
    for line in memberships:
        hierarchy, controllers, path = [*line.split(":", 2), "", ""][:3]
        if hierarchy == "0" and not controllers:  # the unified hierarchy (v2)
            found = _limits(mounts.get("cgroup2"), path, _v2_limit)
        elif "cpu" in controllers.split(","):
            found = _limits(mounts.get("cpu"), path, _v1_limit)
        else:
            continue
        limits += found
    return min(limits, default=None)


def _cgroup_mounts() -> dict[str, tuple[str, Path]]:
    """Where the cgroup hierarchies that can limit CPU time are mounted: "cgroup2" (the
    unified hierarchy) and "cpu" (v1's cpu controller), each as (the cgroup path at the
    mount's root, its mount point), from /proc/self/mountinfo."""
    found: dict[str, tuple[str, Path]] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, after = left.split(), right.split()
        if len(fields) < 5 or len(after) < 3:
            continue
        root, point = _unescape(fields[3]), Path(_unescape(fields[4]))
        if after[0] == "cgroup2":
            found.setdefault("cgroup2", (root, point))
        elif after[0] == "cgroup" and "cpu" in after[2].split(","):
            found.setdefault("cpu", (root, point))
    return found


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (a space is written \\040) undone."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def _limits(
    mount: tuple[str, Path] | None, path: str, limit: Callable[[Path], float | None]
) -> list[float]:
    """The limits set on the cgroup at `path` and on each cgroup above it that the mount
    shows (a container sees its own part of the tree)."""
    if mount is None:
        return []
    root, point = mount
    relative = Path(path).relative_to(root) if Path(path).is_relative_to(root) else None
    if relative is None:
        return []
    folder, out = point / relative, []
    while True:
        value = limit(folder)
        if value is not None:
            out.append(value)
        if folder == point:
            return out
        folder = folder.parent


def _v2_limit(folder: Path) -> float | None:
    """cgroup v2: `cpu.max` is "QUOTA PERIOD", QUOTA `max` for none."""
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" or int(period) <= 0 else int(quota) / int(period)


def _v1_limit(folder: Path) -> float | None:
    """cgroup v1: `cpu.cfs_quota_us` (-1 for none) over `cpu.cfs_period_us`."""
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota < 0 or period <= 0 else quota / period


def memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _os_release() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.platform()


def describe_host() -> dict[str, Any]:
    return {
        "hostname": platform.node(),
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable_cores(),
        "cpu_quota": cpu_quota(),
        "memory_bytes": memory_bytes(),
        "kernel": platform.release(),
        "os": _os_release(),
        "python": platform.python_version(),
    }
