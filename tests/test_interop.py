"""pgscope among other tools: pipes, CSV shapes, JSON a jq user can trust, the store opened by
the DuckDB CLI the README names, the store exported as CSV and Parquet. No server, but for the
tests that read the session's reference run."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pgscope.store import RunMeta, RunStore
from tests.cli import pgscope

if TYPE_CHECKING:
    from pgscope.analyze.model import RunAnalysis

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent
# Installed by `make setup` from scripts/duckdb-cli.txt (scripts/setup.sh).
DUCKDB_CLI = ROOT / ".tools" / "duckdb-cli" / "bin" / "duckdb"


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
        ["runs", "--results-dir", "{results}", "--json"],
        ["compare", "{run}", "{run}"],
        ["compare", "{run}", "{run}", "--json"],
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


# Query ids use all 64 bits: these three are beyond 2^53, where a double (jq, JavaScript)
# can no longer hold every integer.
BIG_IDS = (-1341806190259997187, 311837492616827217, 2**63 - 1)


def _with_big_query_ids(run_dir: Path) -> RunAnalysis:
    from pgscope.analyze.load import load_analysis
    from pgscope.analyze.statements import Statements, StatementStep
    from pgscope.analyze.waits import Profile, QueryProfile, WaitAnalysis

    analysis = load_analysis(_small_run(run_dir), bootstrap=0)
    counters = dict.fromkeys(
        f.name
        for f in dataclasses.fields(StatementStep)
        if f.name not in ("step_id", "queryid", "toplevel")
    )
    return dataclasses.replace(
        analysis,
        statements=Statements(
            read=True,
            statements_read=True,
            statements=[StatementStep(1, qid, **{k: 1.0 for k in counters}) for qid in BIG_IDS],
            texts={str(qid): "SELECT 1" for qid in BIG_IDS},
        ),
        waits=WaitAnalysis(
            overall=Profile([], 0, 0, 0.0),
            by_clients=[],
            queries=[QueryProfile(qid, "SELECT 1", 0.3, "CPU", 1.0) for qid in BIG_IDS]
            + [QueryProfile(None, None, 0.1, "CPU", 1.0)],
            rate=None,
            versus_pgws=None,
        ),
    )


def _as_jq_reads_it(document: dict[str, Any]) -> Any:
    return json.loads(json.dumps(document), parse_int=float)


def test_query_ids_are_json_strings_in_every_document(tmp_path: Path) -> None:
    from pgscope.analyze.model import from_document, to_document

    analysis = _with_big_query_ids(tmp_path / "20261124-000000-scaling-0000")
    wanted = [str(qid) for qid in BIG_IDS]
    run_doc = _as_jq_reads_it(to_document(analysis))  # summary.json, report/run --json
    assert [s["queryid"] for s in run_doc["statements"]["statements"]] == wanted
    assert [q["query_id"] for q in run_doc["waits"]["queries"]] == [*wanted, None]
    sample_doc = _as_jq_reads_it(analysis.waits.to_json())  # sample --json, its summary.json
    assert [q["query_id"] for q in sample_doc["top_queries"]] == [*wanted, None]
    # The HTML report renders from summary.json alone: it reads the ids back exactly.
    again = from_document(json.loads(json.dumps(to_document(analysis))))
    assert [s.queryid for s in again.statements.statements] == list(BIG_IDS)
    assert again.waits is not None
    assert [q.query_id for q in again.waits.queries] == [*BIG_IDS, None]


def _pinned_cli_version() -> str:
    pin = re.search(r"^duckdb-cli==(\S+)", (ROOT / "scripts" / "duckdb-cli.txt").read_text(), re.M)
    assert pin, "scripts/duckdb-cli.txt pins no duckdb-cli version"
    return pin[1]


def _store_tables(run_dir: Path) -> dict[str, int]:
    from pgscope.duck import connect

    with contextlib.closing(connect(str(run_dir / "run.duckdb"), read_only=True)) as db:
        names = [
            str(r[0])
            for r in db.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'"
            ).fetchall()
        ]
        return {n: int(db.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0]) for n in names}


def test_a_new_store_is_written_in_the_storage_version_older_duckdbs_read(
    tmp_path: Path,
) -> None:
    from pgscope.duck import STORAGE_VERSION, connect

    run = _small_run(tmp_path / "20261124-000000-scaling-0000")
    with contextlib.closing(connect(str(run / "run.duckdb"), read_only=True)) as db:
        row = db.execute(
            "SELECT tags['storage_version'] FROM duckdb_databases() WHERE NOT internal"
        ).fetchone()
    assert row is not None and row[0] == f"{STORAGE_VERSION}+", row


def test_the_duckdb_cli_the_readme_names_opens_a_real_runs_store(
    reference_run: tuple[Path, dict[str, Any]],
) -> None:
    version = _pinned_cli_version()
    assert f"DuckDB CLI {version}" in (ROOT / "README.md").read_text()
    if not DUCKDB_CLI.exists():
        pytest.skip(f"the DuckDB CLI is not installed at {DUCKDB_CLI} (make setup installs it)")
    shown = subprocess.run([DUCKDB_CLI, "--version"], capture_output=True, text=True, check=True)
    assert shown.stdout.startswith(f"v{version} "), shown.stdout
    run_dir, document = reference_run
    tables = _store_tables(run_dir)
    query = " UNION ALL ".join(
        f"SELECT '{name}' AS t, count(*) AS n FROM \"{name}\"" for name in sorted(tables)
    )
    opened = subprocess.run(
        [DUCKDB_CLI, "-readonly", "-json", str(run_dir / "run.duckdb"), "-c", query],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert opened.returncode == 0, opened.stderr
    assert {r["t"]: r["n"] for r in json.loads(opened.stdout)} == tables
    assert tables["steps"] == len(document["steps"]) and tables["activity_samples"] > 0


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_writes_every_table_of_a_real_run(
    fmt: str, reference_run: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    from pgscope.duck import connect

    run_dir = reference_run[0]
    out = tmp_path / "out"
    result = pgscope("export", str(run_dir), "--format", fmt, "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    listed = json.loads(result.stdout)
    tables = _store_tables(run_dir)
    assert listed["out"] == str(out) and listed["format"] == fmt
    assert {f["table"]: f["rows"] for f in listed["files"]} == tables
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{t}.{fmt}" for t in tables)
    reader = "read_csv" if fmt == "csv" else "read_parquet"
    for entry in listed["files"]:
        assert Path(entry["path"]).parent == out
        with contextlib.closing(connect()) as db:  # never fetches an extension
            rows = db.execute(f"SELECT count(*) FROM {reader}('{entry['path']}')").fetchall()
        assert rows == [(entry["rows"],)], entry
    if fmt == "csv":  # times and 64-bit ids as exact digits
        header, first = (out / "run.csv").read_text().splitlines()[:2]
        assert header.startswith("run_id,") and run_dir.name in first


def test_export_defaults_to_the_run_folder_and_says_what_it_wrote(tmp_path: Path) -> None:
    run = _small_run(tmp_path / "20261124-000000-scaling-0000")
    result = pgscope("export", str(run))
    assert result.returncode == 0, result.stderr
    tables = _store_tables(run)
    assert sorted(p.name for p in (run / "export").iterdir()) == sorted(f"{t}.csv" for t in tables)
    assert f"{run / 'export' / 'steps.csv'}  1 row" in result.stdout.splitlines()
    bad = pgscope("export", str(run), "--format", "xlsx")
    assert bad.returncode == 2 and "--format 'xlsx': expected csv or parquet" in bad.stderr
