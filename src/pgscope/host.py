"""What the host is: recorded with every run, because figures mean little without it."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def usable_cores() -> int:
    """CPUs this process may run on (a cgroup or taskset may allow fewer than exist)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


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
        "memory_bytes": memory_bytes(),
        "kernel": platform.release(),
        "os": _os_release(),
        "python": platform.python_version(),
    }
