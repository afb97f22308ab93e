"""Usable cores honour the CPU time a cgroup allows, not only the affinity mask (issue 30: a
container limited by cgroup v2's `cpu.max` looked as if it had every host core). Tested in a
real cgroup this test makes and removes (root), with a real process in it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgscope.host import _cgroup_mounts, usable_cores

ASK = (
    "from pgscope.host import usable_cores, cpu_quota; import os; "
    "print(usable_cores(), cpu_quota(), len(os.sched_getaffinity(0)))"
)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="making a cgroup needs root")


def _asked_inside(cgroup: Path) -> tuple[int, float | None, int]:
    """usable_cores(), cpu_quota() and the affinity's size, as a process in `cgroup` sees
    them: it joins the cgroup before it asks (its own pid into cgroup.procs)."""
    join = f"open({str(cgroup / 'cgroup.procs')!r}, 'w').write(str(__import__('os').getpid()))"
    done = subprocess.run(
        [sys.executable, "-c", f"{join}; {ASK}"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    cores, quota, affinity = done.stdout.split()
    return int(cores), None if quota == "None" else float(quota), int(affinity)


@pytest.fixture
def cgroup_of(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh cgroup on the hierarchy that holds the cpu controller (`request.param`:
    "cgroup2" or "cpu"), removed afterwards."""
    kind = request.param
    mount = _cgroup_mounts().get(kind)
    if kind == "cgroup2":
        if mount is None:
            pytest.skip("cgroup v2 is not mounted on this host")
        controllers = (mount[1] / "cgroup.controllers").read_text().split()
        if "cpu" not in controllers:
            v1 = _cgroup_mounts().get("cpu")
            where = f" (v1's hierarchy at {v1[1]} holds it)" if v1 else ""
            print(f"cgroup v2 at {mount[1]} has no cpu controller{where}: no cpu.max to set")
            pytest.skip(f"cgroup v2 at {mount[1]} has no cpu controller{where}")
        subtree = mount[1] / "cgroup.subtree_control"
        if "cpu" not in subtree.read_text().split():
            subtree.write_text("+cpu")
    elif mount is None:
        pytest.skip("no cgroup v1 cpu hierarchy on this host")
    assert mount is not None
    folder = mount[1] / f"pgscope-test-{uuid.uuid4().hex[:12]}"
    folder.mkdir()
    try:
        yield folder
    finally:
        folder.rmdir()  # its one process has exited


@needs_root
@pytest.mark.parametrize("cgroup_of", ["cgroup2", "cpu"], indirect=True)
def test_usable_cores_are_no_more_than_the_cgroup_allows(cgroup_of: Path) -> None:
    here = usable_cores()
    affinity = len(os.sched_getaffinity(0))
    if affinity < 2:
        pytest.skip("one core in the affinity: a half-core limit could not show")
    # No limit set yet: the affinity decides.
    assert _asked_inside(cgroup_of) == (affinity, None, affinity)
    # Half a core's time per period: one usable core, whatever the affinity says.
    if (cgroup_of / "cpu.max").exists():
        (cgroup_of / "cpu.max").write_text("50000 100000")
    else:
        (cgroup_of / "cpu.cfs_period_us").write_text("100000")
        (cgroup_of / "cpu.cfs_quota_us").write_text("50000")
    cores, quota, inside_affinity = _asked_inside(cgroup_of)
    assert (cores, quota, inside_affinity) == (1, 0.5, affinity)
    # 1.5 cores: two usable (time for more than one at once), never more than the affinity.
    if (cgroup_of / "cpu.max").exists():
        (cgroup_of / "cpu.max").write_text("150000 100000")
    else:
        (cgroup_of / "cpu.cfs_quota_us").write_text("150000")
    assert _asked_inside(cgroup_of) == (min(2, affinity), 1.5, affinity)
    assert usable_cores() == here  # this process is not in it


def test_cpu_max_is_read_as_cgroup_v2_writes_it(tmp_path: Path) -> None:
    """The file's format, where this host's cgroup v2 has no cpu controller to make a real
    one with (the test above then skips its v2 case, saying so): "QUOTA PERIOD", or "max
    PERIOD" for no limit."""
    from pgscope.host import _v2_limit

    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert _v2_limit(tmp_path) is None
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert _v2_limit(tmp_path) == 1.5
    assert _v2_limit(tmp_path / "absent") is None
