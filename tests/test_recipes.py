"""Smoke runs of the field-case recipes: each bundled recipe, shrunk with flags to seconds,
must produce the data it exists for (not merely exit 0), and its diagnosis must name the
cause the field case found. One run per recipe serves both checks.

Run with PGSCOPE_RECORD_FACTS=1 to record each run's facts as the fixtures of
tests/test_diagnose.py (tests/data/facts/<recipe>.json)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pgscope.analyze.profile import differential, load_profile, recordings, steps_of
from pgscope.render.flame import diff_flame_html
from pgscope.store import RunStore
from tests.cli import pgscope
from tests.plant import slow_writes, slow_writes_unavailable
from tests.runs import diagnosis, run_doc

pytestmark = [pytest.mark.server, pytest.mark.load]
SHRINK = ["--quick", "--warmup", "1", "--repeats", "1"]


def run_recipe(results: Path, recipe: str, *flags: str) -> dict[str, Any]:
    return run_doc(
        pgscope(
            "run",
            recipe,
            *SHRINK,
            *flags,
            "--json",
            "--results-dir",
            str(results),
            timeout=600,
        )
    )


def evidence(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each variant's facts at its peak cell, by name (the evidence table is a view of them)."""
    return {
        s["variant"]: {name: fact["value"] for name, fact in s["facts"].items()}
        for s in doc["facts"]
        if s["variant"] is not None and s["peak"]
    }


def store_rows(doc: dict[str, Any], sql: str) -> list[tuple[Any, ...]]:
    db = duckdb.connect(str(Path(doc["run_dir"]) / "run.duckdb"), read_only=True)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


# -- logging --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def logging_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # Three repeats: the cost against "none" is judged against the spread of repeats (with
    # two, Welch's t factor is ~12 and a 60% cost can still be "within noise").
    return run_recipe(
        tmp_path_factory.mktemp("logging"),
        "logging",
        *("--duration", "2", "--repeats", "3", "--clients", "2", "--scale", "1"),
    )


def test_logging_writes_logs_in_proportion_to_what_it_logs(logging_run: dict[str, Any]) -> None:
    by_variant = evidence(logging_run)
    assert set(by_variant) == {"none", "all", "all-duration"}
    log_rate = {v: e["log.bytes_per_s"] for v, e in by_variant.items()}
    assert log_rate["none"] is not None and log_rate["none"] < 20_000, log_rate
    assert log_rate["all"] > 200_000, "every statement logged: ~100 bytes per statement"
    assert log_rate["all-duration"] > log_rate["all"] * 0.8, "and a duration line on top"
    compared = {c["variant"]: c for c in logging_run["variants"]["comparisons"]}
    assert set(compared) == {"all", "all-duration"}
    assert all(c["baseline"] == "none" for c in compared.values())


@pytest.mark.tracing
@pytest.mark.skipif(os.geteuid() != 0, reason="the CPU profile (perf) needs root")
def test_the_logging_recipe_names_statement_logging(logging_run: dict[str, Any]) -> None:
    diag = diagnosis(logging_run, "logging", "statement-logging-volume")
    assert "statement-logging-volume" in {f["id"] for f in diag["findings"]}, diag["findings"][:2]
    cost = next(f for f in diag["findings"] if f["id"] == "statement-logging")
    assert cost["variant"] is None and cost["confidence"] == "high", cost


# The logging path in the backend and in this kernel, leaf to caller.
LOGGING_PATH = {
    "errfinish",
    "EmitErrorReport",
    "send_message_to_server_log",
    "write_pipe_chunks",
    "write",
    "__libc_write",
    "pipe_write_[k]",
    "anon_pipe_write_[k]",  # pipe_write since Linux 6.14
    "__GI___libc_write",  # libc6-dbg names the wrapper so
    "vfs_write_[k]",
    "ksys_write_[k]",
    "__x64_sys_write_[k]",
}


@pytest.mark.tracing
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("perf") is None,
    reason="perf profiles need root and perf (apt-get install linux-perf)",
)
def test_log_statement_all_grows_the_logging_path(logging_run: dict[str, Any]) -> None:
    """Issue 5, item 1: two profiles, and a differential in which the logging path
    (errfinish -> EmitErrorReport -> write_pipe_chunks -> write -> pipe_write) is among the
    top growths."""
    store = RunStore.open(Path(logging_run["run_dir"]))
    try:
        cpu = [r for r in recordings(store) if r.kind == "cpu"]
        assert {r.variant for r in cpu if r.total > 0} == {"none", "all", "all-duration"}
        quiet = load_profile(store, "cpu", steps_of(store, "none"), label="none")
        logged = load_profile(store, "cpu", steps_of(store, "all"), label="all")
    finally:
        store.close()
    # 3 steps of ~3 s of two busy backends at 99 Hz on 2 CPUs: hundreds of samples each.
    assert quiet.total > 200 and logged.total > 200, (quiet.total, logged.total)
    backends = logged.only(roles=["backend"])
    assert backends.total > 0.5 * logged.total

    diff = differential(quiet, logged, limit=12)
    top = [d.name for d in diff.grew]
    assert LOGGING_PATH & set(top), f"no logging frame among the top growths: {top}"
    errfinish = next(
        d for d in differential(quiet, logged, limit=10_000).grew if d.name == "errfinish"
    )
    assert errfinish.total_a < 0.01 < errfinish.total_b, errfinish
    # The syslogger (reading the pipe) works only when statements are logged.
    logger_share = logged.only(roles=["logger"]).total / logged.total
    assert logger_share > quiet.only(roles=["logger"]).total / quiet.total

    page = diff_flame_html(quiet, logged, diff, "log_statement none -> all")
    assert "errfinish" in page and '"differential":true' in page


# -- syncrep --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def syncrep_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_recipe(
        tmp_path_factory.mktemp("syncrep"),
        "syncrep",
        *("--duration", "3", "--clients", "2", "--collectors", "activity,pgstats,host"),
    )


def test_syncrep_waits_for_the_standby_only_when_told_to(syncrep_run: dict[str, Any]) -> None:
    by_variant = evidence(syncrep_run)
    assert set(by_variant) == {"off", "local", "remote_write", "on", "remote_apply", "batched"}
    for variant in ("remote_write", "on", "remote_apply", "batched"):
        assert by_variant[variant]["wait.syncrep"] > 0.05, (variant, by_variant[variant])
    for variant in ("off", "local"):
        assert by_variant[variant]["wait.syncrep"] == 0, (variant, by_variant[variant])
    assert by_variant["batched"]["rows_per_commit"] == pytest.approx(10, rel=0.1)
    assert by_variant["on"]["rows_per_commit"] == pytest.approx(1, rel=0.1)
    standbys = store_rows(syncrep_run, "SELECT detail FROM events WHERE kind = 'standbys'")
    assert standbys == [("s1, s2 streaming",)]


def test_the_syncrep_recipe_names_the_standby_wait(syncrep_run: dict[str, Any]) -> None:
    # Which finding leads is proven on the recorded fact sheet (tests/test_diagnose.py).
    found = {f["id"] for f in diagnosis(syncrep_run, "syncrep", "syncrep-waits")["findings"]}
    assert "syncrep-waits" in found, found


# -- checkpoint -----------------------------------------------------------------------------

CHECKPOINT_ROWS = 150_000  # ~1,800 heap and index pages: each gets one full-page image
SLOW_DISK = 16 * 2**20  # bytes/s


@pytest.fixture(scope="module")
def checkpoint_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The recipe's design (a CHECKPOINT before each step, the timed one 30 s later), on a
    small table, on a disk throttled to 16 MB/s where this host allows it. The throttle is the
    field case's condition, a WAL device that full-page images saturate: this VM's disk
    absorbs them with a dip of ~10%, within what a seconds-long test can tell from noise."""
    tmp = tmp_path_factory.mktemp("checkpoint")
    schema = tmp / "small.sql"
    schema.write_text(
        "create table tbl(id int primary key, info text, crt_time timestamp);\n"
        "insert into tbl select g, md5(g::text), now() "
        f"from generate_series(1, {CHECKPOINT_ROWS}) g;\n"
    )
    # The clusters land in this session's TMPDIR (conftest), on the disk the throttle names.
    work = Path(tempfile.gettempdir())
    why_not = slow_writes_unavailable(work)
    planted = contextlib.nullcontext() if why_not else slow_writes(work, SLOW_DISK)
    with planted:
        doc = run_recipe(
            tmp / "r",
            "checkpoint",
            *("--clients", "2", "--warmup", "3", "--duration", "33"),
            *("--init-sql", str(schema), "--set", f"pgscope.define.rows={CHECKPOINT_ROWS}"),
            # usdt where it can run: the checkpoint's phases (write, sync) are evidence too.
            *("--collectors", "activity,pgstats,host,usdt,waldevice"),
        )
    doc["planted"] = why_not is None
    doc["why_not_planted"] = why_not
    return doc


def test_checkpoint_shows_full_page_images_only_with_full_page_writes(
    checkpoint_run: dict[str, Any],
) -> None:
    dips = {d["variant"]: d for d in checkpoint_run["timeline"]["dips"]}
    assert set(dips) == {"fpw-on", "fpw-off"}, checkpoint_run["timeline"]["dips"]
    assert all(d["action"] == "checkpoint (time)" for d in dips.values()), dips
    assert dips["fpw-off"]["fpi_per_s_after"] == 0, "no full-page images without them"
    on = dips["fpw-on"]
    assert on["fpi_per_s_after"] > 3 * max(on["fpi_per_s_before"], 1.0), (
        "a checkpoint makes the next change to each page write a full-page image"
    )
    # Each full-page image adds a page (minus its hole) to the WAL: the extra WAL per
    # transaction must account for at least 2 kB per image, whatever the tps was.
    by_variant = evidence(checkpoint_run)
    extra = by_variant["fpw-on"]["wal.bytes_per_xact"] - by_variant["fpw-off"]["wal.bytes_per_xact"]
    assert extra > 2000 * by_variant["fpw-on"]["wal.fpi_per_xact"] > 0, by_variant


def test_the_checkpoint_recipe_names_full_page_images(checkpoint_run: dict[str, Any]) -> None:
    if not checkpoint_run["planted"]:
        pytest.skip(f"no slow disk to plant: {checkpoint_run['why_not_planted']}")
    dips = {d["variant"]: d for d in checkpoint_run["timeline"]["dips"]}
    assert dips["fpw-on"]["excess_pct"] > 30, dips["fpw-on"]
    assert dips["fpw-off"]["excess_pct"] < 10, "the spread checkpoint's own writes are no dip"
    diag = diagnosis(checkpoint_run, "checkpoint", "checkpoint-fpi")
    assert "checkpoint-fpi" in {f["id"] for f in diag["findings"]}, json.dumps(diag["findings"])


# -- cpus -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpus_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the cpus recipe needs 2 usable CPUs")
    return run_recipe(
        tmp_path_factory.mktemp("cpus"),
        "cpus",
        *("--duration", "3", "--clients", "4", "--scale", "1"),
        *("--collectors", "activity,pgstats,host"),
    )


def test_cpus_sweeps_cores_and_instances(cpus_run: dict[str, Any]) -> None:
    variants = {s["variant"] for s in cpus_run["steps"]}
    cores = len(os.sched_getaffinity(0))
    assert variants == {"instances-2"} | {f"cpus-{k}" for k in range(1, min(cores, 8) + 1)} | {
        f"cpus-{cores}"
    }
    compared = {c["variant"] for c in cpus_run["variants"]["comparisons"]}
    assert compared == variants - {"cpus-1"}, "everything is compared with one core"
    pins = store_rows(cpus_run, "SELECT count(*) FROM events WHERE kind = 'pin'")[0][0]
    split = store_rows(cpus_run, "SELECT count(DISTINCT instance) FROM step_instances")
    assert pins >= 2 and split == [(2,)]


def test_the_cpus_recipe_names_cpu_saturation(cpus_run: dict[str, Any]) -> None:
    """With every CPU, select-only saturates them (the server and pgbench share them). The
    run's top finding may instead explain the 1-CPU variant, which is slower: with the server
    on one CPU and pgbench on the other, each waits for the other's wake-ups and neither CPU
    is saturated on this VM (client-bound), or the server's one CPU is (CPU-bound); which one
    depends on the host's wake-up latency. So the check is per variant."""
    diag = diagnosis(cpus_run, "cpus", "cpu-saturation")
    every_cpu = f"cpus-{len(os.sched_getaffinity(0))}"
    first = next(f for f in diag["findings"] if f["variant"] == every_cpu)
    assert first["id"] == "cpu-saturation" and first["confidence"] == "high", first
