"""Planted host conditions for the diagnosis tests: a host that differs from this one in a
single, known way, so the effect the field cases describe is large enough to name.

- `cold_page_cache`: RAM smaller than the data (the data-file read case).
- `slow_writes`: a disk that writes N bytes a second (the checkpoint case: the field case's
  WAL device saturated by full-page images; this VM's disk absorbs 100 MB/s of them with a
  10% dip, within the noise of a seconds-long test).
- `busy_neighbours`: other processes spinning on the host's CPUs (a workload beside the
  database, as on a shared host).

Both act only on the clusters of this test session (their data directories are in its
TMPDIR), from a thread, and undo themselves on exit.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

BLKIO = Path("/sys/fs/cgroup/blkio")


@contextlib.contextmanager
def repeatedly(action: Callable[[], None], every_s: float) -> Iterator[None]:
    """Run `action` every `every_s` seconds in a thread while the block runs."""
    done = threading.Event()

    def loop() -> None:
        while not done.wait(every_s):
            action()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def cold_page_cache(
    work_dir: Path, every_s: float = 0.2
) -> contextlib.AbstractContextManager[None]:
    """Keep evicting the clusters' data files from the OS page cache (posix_fadvise
    DONTNEED), as a host whose RAM is smaller than the data would. Without it a 300 MB table
    sits in this host's 24 GB of page cache and reads never wait for the disk."""

    def evict() -> None:
        for path in work_dir.glob("pgscope-*/data/base/*/*"):
            with contextlib.suppress(OSError):  # files come and go (temp, dropped)
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)

    return repeatedly(evict, every_s)


def whole_disk(path: Path) -> str | None:
    """`major:minor` of the disk holding `path` (a partition's parent disk: throttles apply
    to disks), or None when it is not a block device (tmpfs, overlay)."""
    dev = os.stat(path).st_dev
    node = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if not node.exists():
        return None
    node = node.resolve()
    if (node / "partition").exists():
        node = node.parent
    return (node / "dev").read_text().strip()


def slow_writes_unavailable(work_dir: Path) -> str | None:
    """Why `slow_writes` cannot run here, or None."""
    if os.geteuid() != 0:
        return "throttling a disk needs root"
    if not (BLKIO / "blkio.throttle.write_bps_device").exists():
        return f"no cgroup v1 blkio throttle at {BLKIO} (kernel without it, or cgroup v2 only)"
    if whole_disk(work_dir) is None:
        return f"{work_dir} is not on a block device"
    return None


def _cluster_processes(work_dir: Path) -> set[int]:
    """The postmasters of the clusters under `work_dir` and their children."""
    postmasters = set()
    for pid_file in work_dir.glob("pgscope-*/data/postmaster.pid"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            postmasters.add(int(pid_file.read_text().split()[0]))
    found = set(postmasters)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) in postmasters:
                found.add(int(stat.parent.name))
    return found


@contextlib.contextmanager
def slow_writes(
    work_dir: Path, bytes_per_s: int, every_s: float = 0.2, *, starters: Iterable[int] = ()
) -> Iterator[None]:
    """Throttle the writes of the clusters under `work_dir` to `bytes_per_s` on their disk
    (a cgroup v1 blkio group the thread keeps their processes in; backends forked later
    inherit it). The `starters` (the processes that start pgscope: tests/cli.py cli_processes)
    join the group first, so everything they start (pgscope, the clusters from their first
    moment) writes slowly, as on a slow disk: otherwise a cluster's first fifth of a second is
    unthrottled. Check `slow_writes_unavailable` first."""
    group = BLKIO / f"pgscope-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()

    def keep_in_group() -> None:
        for pid in _cluster_processes(work_dir):
            with contextlib.suppress(OSError):  # gone meanwhile
                (group / "cgroup.procs").write_text(f"{pid}\n")

    try:
        (group / "blkio.throttle.write_bps_device").write_text(
            f"{whole_disk(work_dir)} {bytes_per_s}\n"
        )
        for pid in starters:
            (group / "cgroup.procs").write_text(f"{pid}\n")
        with repeatedly(keep_in_group, every_s):
            yield
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (BLKIO / "cgroup.procs").write_text(f"{pid}\n")
        group.rmdir()


@contextlib.contextmanager
def busy_neighbours(count: int) -> Iterator[None]:
    """`count` processes, not the cluster's nor pgbench's, each spinning on a CPU."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
