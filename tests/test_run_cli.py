"""`pgscope run` end to end on an embedded cluster: JSON, store, listing, report, signals."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tests.cli import pgscope
from tests.poll import elapse
from tests.suite import server_processes, wait_for_nothing_left, wait_for_programs

SHORT = ["--duration", "2", "--warmup", "1", "--set", "shared_buffers=128MB"]


@pytest.fixture(scope="module")
def finished_run(reference_run: tuple[Path, dict]) -> tuple[Path, dict]:
    """The session's reference run (tests/runs.py): `pgscope run scaling --clients 1,2,3
    --repeats 2`, SHORT's timing and settings, at scale 2."""
    return reference_run


def test_json_document_has_steps_percentiles_cis_and_fit(finished_run: tuple[Path, dict]) -> None:
    run_dir, doc = finished_run
    assert doc["status"] == "complete" and doc["recipe"] == "scaling"
    steps = doc["steps"]
    assert len(steps) == 6
    assert sorted((s["clients"], s["repeat"]) for s in steps) == [
        (1, 1),
        (1, 2),
        (2, 1),
        (2, 2),
        (3, 1),
        (3, 2),
    ]
    for step in steps:
        assert step["variant"] == "base" and step["status"] == "ok"
        assert step["tps"] > 0
        lat = step["latency_ms"]
        assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]
    for cell in doc["scalability"]["cells"]:
        lo, hi = cell["tps_ci95"]
        assert lo <= cell["tps_mean"] <= hi and cell["repeats"] == 2
    usl = doc["scalability"]["fits"]["base"]
    assert set(usl) >= {"lam", "sigma", "kappa", "n_star", "x_max"}
    assert usl["lam"] > 0 and usl["sigma"] >= 0 and usl["kappa"] >= 0
    assert any("fewer than 6" in w for w in usl["warnings"])
    assert "PostgreSQL 15" in doc["target"]["server_version"]
    assert (run_dir / "summary.json").is_file() and (run_dir / "summary.txt").is_file()


def test_store_holds_metadata_timeline_and_settings(finished_run: tuple[Path, dict]) -> None:
    run_dir, _ = finished_run
    db = duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)
    try:
        run = db.execute(
            "SELECT command_line, pgscope_version, server_version_num, host_json, status FROM run"
        ).fetchall()[0]
        assert run[0].startswith("pgscope run scaling --clients 1,2,3")
        assert run[1] and run[2] >= 150000 and '"usable_cpus"' in run[3]
        assert run[4] == "complete"
        # Live progress: about one row per second of each 3-second step.
        per_step = db.execute("SELECT step_id, count(*) FROM timeline GROUP BY step_id").fetchall()
        assert len(per_step) == 6 and all(2 <= n <= 4 for _, n in per_step)
        # The step's window excludes the warm-up second.
        windows = db.execute(
            "SELECT window_start_us - started_us, window_end_us - window_start_us FROM steps"
        ).fetchall()
        assert all(0.9e6 < a < 1.6e6 and 1.5e6 < b < 2.5e6 for a, b in windows), windows
        settings = dict(db.execute("SELECT name, setting FROM settings").fetchall())
        assert settings["shared_buffers"] == str(128 * 1024 // 8)
        assert settings["compute_query_id"] == "on"
        archived = db.execute("SELECT sum(xacts) FROM latency_seconds").fetchall()[0][0]
        logs = db.execute("SELECT list(xact_log) FROM steps").fetchall()[0][0]
    finally:
        db.close()
    parquet_rows = duckdb.sql(
        f"SELECT count(*) FROM read_parquet({[str(run_dir / p) for p in logs]})"
    ).fetchall()
    assert parquet_rows == [(archived,)], "per-second stats and the kept log agree"


def test_runs_lists_it_and_report_rerenders_it(finished_run: tuple[Path, dict]) -> None:
    run_dir, doc = finished_run
    listed = pgscope("runs", "--results-dir", str(run_dir.parent), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["run_id"] for r in rows] == [doc["run_id"]]
    assert rows[0]["steps_ok"] == 6 and rows[0]["status"] == "complete"
    again = pgscope("report", str(run_dir), "--format", "json")
    assert again.returncode == 0, again.stderr
    redone = json.loads(again.stdout)
    assert redone["steps"] == doc["steps"]
    assert redone["scalability"]["cells"] == doc["scalability"]["cells"]
    fits = redone["scalability"]["fits"]["base"], doc["scalability"]["fits"]["base"]
    assert fits[0]["lam"] == fits[1]["lam"]
    text = pgscope("report", str(run_dir))
    assert "variant base" in text.stdout and "model:" in text.stdout


def _start_run(results: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pgscope",
            "run",
            "scaling",
            "--clients",
            "1,2,3,4,5,6",
            "--repeats",
            "1",
            "--order",
            "sequential",
            *SHORT,
            "--scale",
            "1",
            "--results-dir",
            str(results),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_steps(proc: subprocess.Popen[str], count: int, timeout: float) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if sum(1 for ln in lines if ln.startswith("step ") and " tps " in ln) >= count:
            return lines
    raise AssertionError(f"did not see {count} finished steps: {lines}")


@pytest.mark.server
@pytest.mark.parametrize(
    ("sig", "code", "name"), [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")]
)
def test_signal_mid_run_keeps_finished_steps_and_leaves_nothing(
    tmp_path: Path, sig: signal.Signals, code: int, name: str
) -> None:
    before = server_processes()
    proc = _start_run(tmp_path)
    _wait_for_steps(proc, 2, timeout=120)
    wait_for_programs(before, {"pgbench"})  # step 3 (3 s long) under way
    elapse(1.5, "pgbench's first progress row of step 3 (one a second)")
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"pgscope did not exit within 10 s of {name}") from None
    assert time.monotonic() - sent < 10
    assert proc.returncode == code, err
    errors = [ln for ln in err.splitlines() if ln.startswith("pgscope: error")]
    assert len(errors) == 1 and "Traceback" not in err
    assert errors[0].startswith(f"pgscope: error: interrupted by {name}; kept 2 finished steps")
    [run_dir] = list(tmp_path.iterdir())
    db = duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)
    try:
        statuses = db.execute("SELECT step_id, status FROM steps ORDER BY step_id").fetchall()
        assert statuses == [(1, "ok"), (2, "ok"), (3, "interrupted")]
        assert db.execute("SELECT status FROM run").fetchall() == [("interrupted",)]
        assert db.execute("SELECT count(*) FROM timeline WHERE step_id = 3").fetchall()[0][0] >= 1
    finally:
        db.close()
    assert (run_dir / "summary.json").is_file(), "an interrupted run still gets its summary"
    wait_for_nothing_left(before)  # no postgres or pgbench may remain
