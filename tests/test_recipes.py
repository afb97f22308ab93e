"""Smoke runs of the field-case recipes: each bundled recipe, shrunk with flags to seconds,
must produce the data it exists for (not merely exit 0)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tests.conftest import pgscope

SHRINK = ["--quick", "--duration", "2", "--warmup", "1", "--repeats", "1"]


def run_recipe(tmp_path: Path, recipe: str, *flags: str) -> dict[str, Any]:
    result = pgscope(
        "run", recipe, *SHRINK, *flags, "--json", "--results-dir", str(tmp_path / "r"), timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    doc: dict[str, Any] = json.loads(result.stdout)
    assert all(s["status"] == "ok" for s in doc["steps"]), doc["steps"]
    return doc


def evidence(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["variant"]: e for e in doc["evidence"]}


def test_logging_writes_logs_in_proportion_to_what_it_logs(tmp_path: Path) -> None:
    doc = run_recipe(
        tmp_path, "logging", "--clients", "2", "--scale", "1", "--collectors", "pgstats"
    )
    by_variant = evidence(doc)
    assert set(by_variant) == {"none", "all", "all-duration"}
    log_rate = {v: e["log_bytes_per_s"] for v, e in by_variant.items()}
    assert log_rate["none"] is not None and log_rate["none"] < 20_000, log_rate
    assert log_rate["all"] > 200_000, "every statement logged: ~100 bytes per statement"
    assert log_rate["all-duration"] > log_rate["all"] * 0.8, "and a duration line on top"
    compared = {c["variant"]: c for c in doc["comparisons"]}
    assert set(compared) == {"all", "all-duration"}
    assert all(c["baseline"] == "none" for c in compared.values())


def test_syncrep_waits_for_the_standby_only_when_told_to(tmp_path: Path) -> None:
    doc = run_recipe(tmp_path, "syncrep", "--clients", "2", "--collectors", "activity,pgstats")
    by_variant = evidence(doc)
    assert set(by_variant) == {"off", "local", "remote_write", "on", "remote_apply", "batched"}
    for variant in ("remote_write", "on", "remote_apply", "batched"):
        assert by_variant[variant]["syncrep_share"] > 0.05, (variant, by_variant[variant])
    for variant in ("off", "local"):
        assert by_variant[variant]["syncrep_share"] == 0, (variant, by_variant[variant])
    assert by_variant["batched"]["rows_per_commit"] == pytest.approx(10, rel=0.1)
    assert by_variant["on"]["rows_per_commit"] == pytest.approx(1, rel=0.1)
    db = duckdb.connect(str(Path(doc["run_dir"]) / "run.duckdb"), read_only=True)
    try:
        standbys = db.execute("SELECT detail FROM events WHERE kind = 'standbys'").fetchall()
    finally:
        db.close()
    assert standbys == [("s1, s2 streaming",)]


def test_checkpoint_shows_full_page_images_only_with_full_page_writes(tmp_path: Path) -> None:
    # A small table (~800 pages): the full-page images after the runner's own CHECKPOINT
    # before each step are over within seconds, so the action's at 8 s stand out against a
    # quiet "before" (the recipe itself waits 30 s for its timed checkpoint).
    schema = tmp_path / "small.sql"
    schema.write_text(
        "create table tbl(id int primary key, info text, crt_time timestamp);\n"
        "insert into tbl select g, md5(g::text), now() "
        "from generate_series(1, 100000) g;\n"
    )
    doc = run_recipe(
        tmp_path,
        "checkpoint",
        "--clients",
        "2",
        "--duration",
        "12",
        "--warmup",
        "1",
        "--action",
        "8:CHECKPOINT",
        "--init-sql",
        str(schema),
        "--set",
        "pgscope.define.rows=100000",
        "--collectors",
        "pgstats",
    )
    dips = {d["variant"]: d for d in doc["dips"]}
    assert set(dips) == {"fpw-on", "fpw-off"}, doc["dips"]
    assert dips["fpw-off"]["fpi_per_s_after"] == 0, "no full-page images without them"
    assert dips["fpw-on"]["fpi_per_s_after"] > dips["fpw-on"]["fpi_per_s_before"], (
        "a checkpoint makes the next change to each page write a full-page image"
    )
    by_variant = evidence(doc)
    assert (
        by_variant["fpw-on"]["wal_bytes_per_xact"] > 3 * by_variant["fpw-off"]["wal_bytes_per_xact"]
    )


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the cpus recipe needs 2 CPUs")
def test_cpus_sweeps_cores_and_instances(tmp_path: Path) -> None:
    doc = run_recipe(tmp_path, "cpus", "--clients", "2", "--scale", "1", "--collectors", "pgstats")
    variants = {s["variant"] for s in doc["steps"]}
    cores = len(os.sched_getaffinity(0))
    assert variants == {"instances-2"} | {f"cpus-{k}" for k in range(1, min(cores, 8) + 1)} | {
        f"cpus-{cores}"
    }
    compared = {c["variant"] for c in doc["comparisons"]}
    assert compared == variants - {"cpus-1"}, "everything is compared with one core"
    db = duckdb.connect(str(Path(doc["run_dir"]) / "run.duckdb"), read_only=True)
    try:
        pins = db.execute("SELECT count(*) FROM events WHERE kind = 'pin'").fetchall()[0][0]
        split = db.execute("SELECT count(DISTINCT instance) FROM step_instances").fetchall()
    finally:
        db.close()
    assert pins >= 2 and split == [(2,)]
