"""Can this host trace a cluster's USDT probes with bpftrace, and if not, what is the fix?

Runs `bpftrace --version` and `--info` once per process (cached) and reads a few /sys files;
shown by `pgscope doctor` and checked before a trace starts.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

from pgscope.collect.tracing.elfprobes import list_probes

MIN_BPFTRACE = (0, 17)
REFCOUNT_FORMAT = Path("/sys/bus/event_source/devices/uprobe/format/ref_ctr_offset")
KERNEL_BTF = Path("/sys/kernel/btf/vmlinux")
TRACEFS_PATHS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))


def _run(argv: list[str]) -> str | None:
    """What a command printed (bpftrace --info writes to stderr), None if it failed."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout + out.stderr if out.returncode == 0 else None


@cache
def bpftrace_version(path: str) -> tuple[int, ...] | None:
    text = _run([path, "--version"]) or ""
    found = re.search(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g) for g in found.groups() if g is not None) if found else None


@cache
def bpftrace_info(path: str) -> str:
    """`bpftrace --info` (needs root)."""
    return _run([path, "--info"]) or ""


def tracefs_mounted() -> bool:
    return any((path / "events").is_dir() for path in TRACEFS_PATHS)


def capability_problems(is_root: bool, binary: Path | None) -> list[str]:
    """What this host lacks for tracing `binary`'s probes, each with its fix. Without root
    only root and bpftrace are checked: the rest is not visible to other users."""
    problems = []
    bpftrace = shutil.which("bpftrace")
    if not is_root:
        problems.append(
            "tracing needs root: bpftrace loads BPF programs and places uprobes "
            "(fix: run pgscope as root, e.g. with sudo)"
        )
    if bpftrace is None:
        problems.append("bpftrace is not installed (fix: apt-get install bpftrace)")
    if not is_root:
        return problems
    if bpftrace is not None:
        version = bpftrace_version(bpftrace)
        if version is None or version[:2] < MIN_BPFTRACE:
            shown = ".".join(map(str, version)) if version else "of unknown version"
            problems.append(
                f"bpftrace {shown} at {bpftrace} is too old: pgscope needs "
                f"{'.'.join(map(str, MIN_BPFTRACE))} or newer"
            )
        elif not re.search(r"uprobe refcount.*: yes", bpftrace_info(bpftrace)):
            problems.append(
                "bpftrace here cannot raise USDT semaphores for a whole cluster (bpftrace "
                "--info: uprobe refcount is not 'yes'), and PostgreSQL's probes all sit "
                "behind semaphores (fix: Linux >= 4.20 and a bpftrace built on bcc with "
                "uprobe refcount support, as Debian 12's is)"
            )
    if not REFCOUNT_FORMAT.exists():
        problems.append(
            f"the kernel has no uprobe reference counters ({REFCOUNT_FORMAT} is missing), "
            f"needed to raise the probes' semaphores in every backend (fix: Linux >= 4.20)"
        )
    if not KERNEL_BTF.exists():
        problems.append(
            f"no kernel BTF ({KERNEL_BTF}): the programs read the task struct to keep only "
            f"the cluster's processes (fix: a kernel built with CONFIG_DEBUG_INFO_BTF=y)"
        )
    if not tracefs_mounted():
        problems.append(
            "tracefs is not mounted: bpftrace removes its uprobes through it "
            "(fix: mount -t tracefs nodev /sys/kernel/tracing)"
        )
    if binary is not None:
        try:
            probes = list_probes(binary)
        except OSError as exc:
            problems.append(f"cannot read {binary}: {exc.strerror}")
        else:
            if not probes:
                problems.append(
                    f"{binary} has no USDT probes (.note.stapsdt): it was built without "
                    f"--enable-dtrace (Debian's and PGDG's packages have them)"
                )
    return problems
