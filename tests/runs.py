"""Runs as tests read them: the session's reference run, a run's JSON document, its diagnosis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pgscope.target.pgbin import PgBinaries
from tests.cli import pgscope

DATA = Path(__file__).parent / "data"

# The session's reference run, for the tests that only read a run (the JSON document, the
# store, `runs`, `report` in its formats, the report of a run whose tracers could not run):
# select-only at scale 2, 3 client counts x 2 repeats of 1 + 2 s, asking for the usdt and perf
# collectors with neither bpftrace nor perf on PATH. No tracer runs: their start-up would
# delay the first transaction, which the step-window checks time.
REFERENCE_RUN = [
    *("run", "scaling", "--clients", "1,2,3", "--repeats", "2"),
    *("--duration", "2", "--warmup", "1", "--set", "shared_buffers=128MB", "--scale", "2"),
    *("--collectors", "activity,usdt,perf", "--json"),
]


@pytest.fixture(scope="session")
def reference_run(
    pg: PgBinaries, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    """The reference run's folder (alone in its results folder) and its JSON document. Its
    readers may add files to the folder (a re-rendered report), never change what was
    measured."""
    results = tmp_path_factory.mktemp("reference")
    # Only the venv's and PostgreSQL's programs (not /bin either: it links to /usr/bin here).
    path = f"{Path(sys.executable).parent}:{pg.bindir}"
    result = pgscope(*REFERENCE_RUN, "--results-dir", str(results), env={"PATH": path})
    assert result.returncode == 0, result.stderr[-3000:]
    document: dict[str, Any] = json.loads(result.stdout)
    return Path(document["run_dir"]), document


FACTS = DATA / "facts"


def run_doc(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON document of a run that must have succeeded, every step of it."""
    assert result.returncode == 0, result.stderr[-3000:]
    doc: dict[str, Any] = json.loads(result.stdout)
    assert all(s["status"] == "ok" for s in doc["steps"]), doc["steps"]
    return doc


def diagnosis(doc: dict[str, Any], case: str, expected: str) -> dict[str, Any]:
    """The run's diagnosis. With PGSCOPE_RECORD_FACTS=1, also records the run's facts as the
    fixture tests/test_diagnose.py replays (tests/data/facts/<case>.json)."""
    if os.environ.get("PGSCOPE_RECORD_FACTS"):
        write_facts(doc, case, expected)
    return dict(doc["diagnosis"])


def write_facts(doc: dict[str, Any], case: str, expected: str) -> Path:
    """A run's fact sheets, as tests/test_diagnose.py replays them (tests/data/facts/)."""
    FACTS.mkdir(parents=True, exist_ok=True)
    path = FACTS / f"{case}.json"
    path.write_text(
        json.dumps(
            {
                "case": case,
                "expected_top": expected,
                "recorded_from": doc["command_line"],
                "sheets": doc["facts"],
            },
            indent=1,
        )
        + "\n"
    )
    return path


def top_finding(diag: dict[str, Any]) -> str:
    assert diag["findings"], diag
    return str(diag["findings"][0]["id"])
