"""Files written whole or not at all: a failure or a Ctrl-C mid-write keeps the old file."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from pgscope.errors import EnvironmentProblem
from pgscope.files import write_atomic


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
