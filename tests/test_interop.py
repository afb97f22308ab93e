"""pgscope among other tools: pipes, CSV shapes, JSON a jq user can trust. No server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgscope.store import RunMeta, RunStore

DATA = Path(__file__).parent / "data"


def _small_run(run_dir: Path) -> Path:
    """A run store with one measured step, as the runner leaves it: no server needed."""
    store = RunStore.create(
        run_dir,
        RunMeta(run_dir.name, "scaling", "recipe scaling", "", "{}", "pgscope run", "0",
                "server", "host=db1", {}),
    )  # fmt: skip
    store.begin_step(1, "base", 1, 1, 1, 2.0, 0.0, False)
    store.finish_step(1, "failed", "pgbench: error: planted", {})
    store.finish_run("failed", "planted")
    store.close()
    return run_dir


def _into_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """The command with its stdout a pipe nobody reads any more (`pgscope ... | head -1`
    after head has gone): its first write fails with EPIPE, every time."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "pgscope", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    "command",
    [
        ["report", "{run}"],
        ["report", "{run}", "--json"],
        ["recipes"],
        ["recipes", "scaling"],
        ["runs", "--results-dir", "{results}"],
        ["fit", "usl", str(DATA / "cisco.csv")],
        ["fit", "usl", str(DATA / "cisco.csv"), "--json"],
        ["--help"],
    ],
    ids=" ".join,
)
def test_a_closed_stdout_ends_quietly_with_0(command: list[str], tmp_path: Path) -> None:
    run = _small_run(tmp_path / "results" / "20261124-000000-scaling-0000")
    args = [a.format(run=run, results=run.parent) for a in command]
    result = _into_closed_pipe(*args)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_recipes_json_lists_every_recipe_and_shows_one_spec() -> None:
    from pgscope.spec import load_spec, recipe_names

    listed = subprocess.run(
        [sys.executable, "-m", "pgscope", "recipes", "--json"], capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr
    entries = json.loads(listed.stdout)
    assert [e["name"] for e in entries] == recipe_names()
    for entry in entries:
        assert entry["summary"] and Path(entry["path"]).is_file()
    shown = subprocess.run(
        [sys.executable, "-m", "pgscope", "recipes", "scaling", "--json"],
        capture_output=True,
        text=True,
    )
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document["name"] == "scaling"
    spec = load_spec("scaling").spec
    assert document["spec"]["workload"] == spec.workload
    assert document["spec"]["repeats"] == spec.repeats
    assert "quick" in document["spec"]
