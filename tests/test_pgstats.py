"""Statistics snapshots and timed step actions, on a real run with a CHECKPOINT mid-step, on
every PostgreSQL version: 17 moved the checkpoint counters to pg_stat_checkpointer, 18 the
WAL's writes and fsyncs to pg_stat_io, and each step's totals must mean the same anyway."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from pgscope.analyze import pgstats
from pgscope.target.pgbin import PgBinaries
from tests.cli import one_line_error, pgscope

SPEC = """
workload = "tpcb-like"
scale = 2
clients = [2]
duration = 4
warmup = 2
repeats = 2
actions = [{at = 4, sql = "CHECKPOINT"}]
[settings]
shared_buffers = "128MB"
[collectors]
pgstats = {}
"""


@pytest.mark.server
def test_counters_per_step_and_a_checkpoint_action(tmp_path: Path, pg_version: PgBinaries) -> None:
    spec = tmp_path / "ckpt.toml"
    spec.write_text(SPEC)
    result = pgscope(
        "run",
        str(spec),
        *("--pg-bin", str(pg_version.bindir)),
        *("--json", "--results-dir", str(tmp_path / "r")),
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    major = pg_version.major_version()
    assert f"PostgreSQL {major}." in doc["target"]["server_version"]
    counters = {c["step_id"]: c for c in doc["counters"]}
    assert sorted(counters) == [1, 2]
    for step in counters.values():
        assert step["checkpoints"] == 1, "the action's CHECKPOINT, not the one before the step"
        # The immediate CHECKPOINT ends within the step: its buffers and its times are counted.
        assert step["checkpoint_buffers"] > 0 and step["checkpoint_write_ms"] is not None
        assert step["wal_fpi"] > 0 and step["wal_records"] > step["xacts"]
        # tpcb-like writes 5 records a transaction, plus full-page images after a checkpoint
        assert 300 < step["wal_bytes_per_xact"] < 100_000
        # Each commit of 2 clients flushes the WAL (synchronous_commit on): fsyncs are in
        # the order of commits (several commits share one; the WAL writer adds some).
        assert step["xacts"] / 20 < step["wal_syncs"] < 2 * step["xacts"], step
        assert step["wal_writes"] >= step["wal_syncs"] / 2, step
        assert step["buffers_backend"] is not None
    db = duckdb.connect(str(Path(doc["run_dir"]) / "run.duckdb"), read_only=True)
    try:
        sources = {
            row[0] for row in db.execute("SELECT DISTINCT source FROM pgstats_counters").fetchall()
        }
        actions = db.execute(
            "SELECT step_id, ts_us, detail FROM events WHERE kind = 'action' ORDER BY step_id"
        ).fetchall()
        starts = dict(db.execute("SELECT step_id, started_us FROM steps").fetchall())
        wal_rate = pgstats.rates(db, "pg_stat_wal", "wal_bytes")
        commits = pgstats.rates(db, "pg_stat_database", "xact_commit", "postgres")
    finally:
        db.close()
    # Where each version keeps them (and the views it does not have are not queried).
    assert ("pg_stat_checkpointer" in sources) == (major >= 17), sources
    assert ("pg_stat_io" in sources) == (major >= 16), sources
    assert [a[0] for a in actions] == [1, 2]
    for step_id, ts_us, detail in actions:
        assert detail.startswith("CHECKPOINT at +4 s: took")
        assert 3.5e6 < ts_us - starts[step_id] < 5.5e6, "the action runs at its time"
    assert max(rate for _, rate in wal_rate) > 100_000, "WAL bytes per second under load"
    assert max(rate for _, rate in commits) > 50


def test_actions_are_refused_on_a_users_server_without_allow_writes(tmp_path: Path) -> None:
    spec = tmp_path / "act.toml"
    read_only = SPEC.replace("tpcb-like", "select-only").replace(
        '[settings]\nshared_buffers = "128MB"\n', ""
    )
    spec.write_text(read_only)
    result = pgscope(
        "run",
        str(spec),
        "--dsn",
        "host=127.0.0.1 port=1 dbname=x",
        "--results-dir",
        str(tmp_path / "r"),
    )
    assert result.returncode == 6
    assert "actions run arbitrary SQL" in one_line_error(result)
