"""Files written whole or not at all: a failure or a Ctrl-C mid-write keeps the old file; a
scratch tree is removed even while a straggler still writes into it."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pgscope.errors import EnvironmentProblem
from pgscope.files import remove_tree, write_atomic
from tests.poll import wait_until


def test_a_write_replaces_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    target.write_text("old")
    assert write_atomic(target, "new") == target
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


@pytest.mark.parametrize(
    "fault", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()]
)
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: BaseException
) -> None:
    target = tmp_path / "summary.json"
    target.write_text("old")

    def failing_fsync(fd: int) -> None:
        raise fault

    monkeypatch.setattr(os, "fsync", failing_fsync)
    if isinstance(fault, OSError):
        with pytest.raises(EnvironmentProblem) as caught:
            write_atomic(target, "new")
        assert str(caught.value) == (
            f"cannot write {target}: No space left on device (the previous summary.json is "
            f"unchanged)"
        )
    else:
        with pytest.raises(KeyboardInterrupt):
            write_atomic(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


# A process that outlived its postmaster: it keeps creating files in the cluster's folders for
# a while, as an orphaned backend does, then exits.
STRAGGLER = """
import os, sys, time
root = sys.argv[1]
end = time.monotonic() + float(sys.argv[2])
i = 0
while time.monotonic() < end:
    i += 1
    try:
        open(os.path.join(root, "base", "1", str(i)), "w").close()
    except FileNotFoundError:  # its folder is gone already
        pass
"""


def _straggling_tree(root: Path, for_s: float, files: int = 300) -> subprocess.Popen[bytes]:
    (root / "base" / "1").mkdir(parents=True)
    for j in range(files):
        (root / "base" / "1" / f"old{j}").touch()
    proc = subprocess.Popen([sys.executable, "-c", STRAGGLER, str(root), str(for_s)])
    # Until it writes: its first file (on a loaded host the interpreter takes a while to start,
    # and an rmtree before the first write would race nothing).
    wait_until(lambda: (root / "base" / "1" / "1").exists(), "the writer's first file")
    return proc


def test_a_tree_with_a_straggling_writer_is_removed_once_the_writer_stops(
    tmp_path: Path,
) -> None:
    # The control: one rmtree while the writer runs leaves the tree (what left a cluster's
    # directory behind).
    # A race: the writer must create a file while rmtree empties the folder. With thousands
    # of files to remove it nearly always does; three tries make a lost race all but never.
    lost = []
    for attempt in range(3):
        control = tmp_path / f"control{attempt}"
        proc = _straggling_tree(control, 1.0, files=5000)
        shutil.rmtree(control, ignore_errors=True)
        lost.append(control.exists())
        proc.wait(timeout=10)
        if lost[-1]:
            break
    assert any(lost), "one rmtree raced the writer and lost"
    root = tmp_path / "cluster"
    proc = _straggling_tree(root, 0.5)
    try:
        assert remove_tree(root, within_s=5.0)
    finally:
        proc.wait(timeout=10)
    assert not root.exists()
