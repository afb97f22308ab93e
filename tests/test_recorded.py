"""The planted cases, replayed from their recorded stores (tests/data/runs, made by
`python -m tests.record`): loading, the facts, the diagnosis, the account of active time, the
JSON document and the report, without a server. tests/test_findings.py runs each live."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import duckdb
import pytest

from pgscope import tables
from pgscope.analyze.load import load_analysis
from pgscope.analyze.model import RunAnalysis, from_document, to_document
from pgscope.render.html import report_html
from tests.evidence import shortfalls
from tests.planted import CASES, EVIDENCE, spec_text

RUNS = Path(__file__).parent / "data" / "runs"
RECORDED = sorted(p.name for p in RUNS.glob("*") if (p / "run.duckdb.gz").is_file())


def _unpacked(case: str, folder: Path) -> Path:
    """The recorded case's run folder, its store unpacked into `folder`."""
    run_dir = folder / f"20260101-000000-{case}-0000"
    run_dir.mkdir()
    with (
        gzip.open(RUNS / case / "run.duckdb.gz", "rb") as src,
        (run_dir / "run.duckdb").open("wb") as dst,
    ):
        shutil.copyfileobj(src, dst)
    return run_dir


def _replayed(case: str, folder: Path) -> RunAnalysis:
    return load_analysis(_unpacked(case, folder), bootstrap=50)


def test_every_planted_case_is_proven_twice_live_and_recorded() -> None:
    """Each planted case declares the evidence a live run must show (tests/test_findings.py)
    and has a recording whose verdict is replayed here."""
    assert set(RECORDED) == set(CASES), "record the missing ones: python -m tests.record NAME"
    unproven = sorted(c for c in CASES if not EVIDENCE.get(c))
    assert not unproven, f"declare what a live run must show in tests/planted.py: {unproven}"
    assert set(EVIDENCE) == set(CASES), sorted(set(EVIDENCE) - set(CASES))


def _needed_collectors(case: str) -> set[str]:
    """The collectors the case's run asks for: its spec's, or its --collectors flag's."""
    flags = CASES[case].flags
    if "--collectors" in flags:
        return set(flags[flags.index("--collectors") + 1].split(","))
    return set(tomllib.loads(spec_text(case))["collectors"])


@pytest.mark.parametrize("case", RECORDED)
def test_a_recording_is_as_fresh_as_the_store_and_has_every_collector_its_case_needs(
    case: str, tmp_path: Path
) -> None:
    """A recording made by an older store version, or without a collector its case asks
    for, would replay what today's pgscope no longer records: record it again."""
    run_dir = _unpacked(case, tmp_path)
    db = duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)
    try:
        [(version,)] = db.execute("SELECT version FROM schema_info").fetchall()
        ran = {
            name
            for name, available, status in db.execute(
                "SELECT name, available, status FROM collectors"
            ).fetchall()
            if available and status == "complete"
        }
    finally:
        db.close()
    again = f"record it again: python -m tests.record {case}"
    assert version == tables.STORE_VERSION, f"store version {version}; {again}"
    assert _needed_collectors(case) <= ran, f"{sorted(_needed_collectors(case) - ran)}; {again}"


@pytest.mark.parametrize("case", RECORDED)
def test_a_recorded_case_replays_its_finding_its_account_and_its_report(
    case: str, tmp_path: Path
) -> None:
    analysis = _replayed(case, tmp_path)
    document = json.loads(json.dumps(to_document(analysis), default=str))
    # The recording shows what its live run must (a run without the cause proves nothing).
    assert not shortfalls(document, EVIDENCE[case])
    assert analysis.diagnosis is not None
    top = analysis.diagnosis.findings[0]
    assert top.id == CASES[case].expected, [
        (f.id, f.confidence) for f in analysis.diagnosis.findings[:4]
    ]
    for word in CASES[case].named:
        assert word.lower() in top.title.lower(), (word, top.title)
    # Every cell's account: the classes' shares sum to 1.
    assert analysis.accounts
    for account in analysis.accounts:
        if account.samples:
            assert sum(c.share for c in account.root.children) == pytest.approx(1, abs=0.01)
    # The JSON document reads back to the same analysis, and the report renders from it,
    # drawing the account.
    again = from_document(document)
    assert json.loads(json.dumps(to_document(again), default=str)) == document
    page = report_html(again)
    assert 'id="chart-account-0"' in page and "Where active time went" in page


# The cases whose reports differed between two processes before ties were broken by value
# and the lock holders' means rounded: a lock holder's seconds (a sum in the order DuckDB's
# threads finish), the statements' texts (a parallel GROUP BY) and a profile's functions of
# equal counts (a set's order, seeded per process).
@pytest.mark.parametrize("case", ["extension-lock-queue", "foreign-key-check", "partition-locks"])
def test_a_store_reads_to_the_same_bytes_in_every_process(case: str, tmp_path: Path) -> None:
    """An analysis is a function of its store: `report --format json` in two processes, with
    different string hashing, prints the same bytes (a central repository's report is
    compared byte for byte with the folder's)."""
    run_dir = _unpacked(case, tmp_path)
    printed = [
        subprocess.run(
            [sys.executable, "-m", "pgscope", "report", str(run_dir), "--format", "json"],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    ]
    assert printed[0] and printed[0] == printed[1]
