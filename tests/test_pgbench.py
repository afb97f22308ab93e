"""The pgbench driver: output parsing, and a real run whose logs we analyse."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from pgscope.drive.loaduser import LoadUser
from pgscope.drive.pgbench import (
    Pgbench,
    ProgressRow,
    StepRun,
    Workload,
    analyse_logs,
    archive_logs,
    parse_progress,
    parse_summary,
)
from pgscope.errors import RefusedError
from pgscope.target.embedded import EmbeddedCluster
from pgscope.target.pgbin import PgBinaries


def test_parse_progress_lines() -> None:
    row = parse_progress(
        "progress: 1795259431.375 s, 2332.7 tps, lat 1.688 ms stddev 0.800, 0 failed"
    )
    assert row == ProgressRow(1795259431375000, 2332.7, 1.688, 0.8, 0)
    idle = parse_progress("progress: 1795259431.000 s, 0.0 tps, lat NaN ms stddev NaN, 3 failed")
    assert idle is not None and idle.latency_ms is None and idle.failed == 3
    assert parse_progress("pgbench: error: connection to server failed") is None


def test_parse_summary() -> None:
    text = (
        "number of transactions actually processed: 7260\n"
        "number of failed transactions: 0 (0.000%)\nlatency average = 1.637 ms\n"
        "latency stddev = 0.712 ms\ninitial connection time = 10.198 ms\n"
        "tps = 2425.534261 (without initial connection time)\n"
    )
    assert parse_summary(text) == {
        "xacts": 7260,
        "failed": 0,
        "latency_avg_ms": 1.637,
        "latency_stddev_ms": 0.712,
        "connection_ms": 10.198,
        "tps": 2425.534261,
    }


def test_parse_summary_under_connect() -> None:
    """pgbench -C (PostgreSQL 15's wording): the connection time is an average per
    transaction, and tps counts it in."""
    text = (
        "number of transactions actually processed: 1371\n"
        "number of failed transactions: 0 (0.000%)\nlatency average = 6.531 ms\n"
        "latency stddev = 2.771 ms\naverage connection time = 5.130 ms\n"
        "tps = 342.376809 (including reconnection times)\n"
    )
    summary = parse_summary(text)
    assert summary["connection_avg_ms"] == 5.130 and "connection_ms" not in summary
    assert summary["tps"] == 342.376809
    run = StepRun(0, summary, None, Path("x"), 0, 1)
    assert run.connection_ms_per_xact(4) == 5.130


def test_one_connection_per_client_is_spread_over_its_transactions() -> None:
    summary = {"xacts": 7990.0, "failed": 10.0, "connection_ms": 10.0}
    run = StepRun(0, summary, None, Path("x"), 0, 1)
    assert run.connection_ms_per_xact(4) == pytest.approx(10.0 * 4 / 8000)
    assert StepRun(0, {}, None, Path("x"), 0, 1).connection_ms_per_xact(4) is None


@pytest.fixture(scope="module")
def bench(shared_cluster: EmbeddedCluster, pg: PgBinaries, load_user: LoadUser) -> Pgbench:
    driver = Pgbench(pg, shared_cluster.conn, read_only=False, user=load_user)
    assert driver.initialise(1, allow_writes=True) is True
    assert driver.initialise(1, allow_writes=True) is False, "same scale: skipped"
    assert driver.current_scale() == 1
    return driver


def test_a_log_cut_off_mid_line_counts_only_whole_transactions(tmp_path: Path) -> None:
    """A full disk (or a kill) stops pgbench mid-line: the stub is no transaction, neither
    failed nor one without a second (seen in CI: a NULL second broke the report)."""
    base = 1795476517
    lines = [f"0 {i} {1000 + i} 0 {base + i // 4} {(i % 4) * 250000}" for i in range(12)]
    lines.append("0 12 failed 0 " + str(base + 3) + " 1")  # a real failure stays one
    log = tmp_path / "xact.1"
    log.write_text("\n".join(lines) + "\n0 13 1013 0 17954")  # cut inside the end time
    stats, seconds, _ = analyse_logs([log], warmup_s=0.0)
    assert [s.second_us for s in seconds] == [(base + k) * 1_000_000 for k in range(4)]
    assert sum(s.xacts for s in seconds) == 13
    assert sum(s.failed for s in seconds) == 1
    assert stats is not None and stats.failed == 1


def test_a_real_run_gives_live_progress_and_exact_percentiles(
    bench: Pgbench, tmp_path: Path
) -> None:
    rows: list[ProgressRow] = []
    run = bench.run(
        Workload("tpcb-like", (), "prepared"),
        clients=2,
        threads=2,
        seconds=3,
        log_prefix=tmp_path / "xact",
        on_progress=rows.append,
    )
    assert run.ok, run.error
    assert 2 <= len(rows) <= 4 and all(r.tps > 0 for r in rows)
    assert rows == sorted(rows, key=lambda r: r.ts_us)
    assert run.started_us < rows[0].ts_us <= run.ended_us
    files = run.log_files()
    assert len(files) == 2, "one log per pgbench thread"
    stats, seconds, outcomes = analyse_logs(files, warmup_s=1.0)
    assert stats is not None
    assert outcomes.succeeded == stats.xacts and outcomes.failed == 0 == outcomes.retried
    assert 0 < stats.p50_ms <= stats.p90_ms <= stats.p95_ms <= stats.p99_ms <= stats.max_ms
    # The window excludes the first second; tps over it agrees with pgbench's own figure.
    assert stats.window_end_us - stats.window_start_us < 2.2e6
    assert stats.tps == pytest.approx(run.summary["tps"], rel=0.25)
    assert sum(s.xacts for s in seconds) == run.summary["xacts"]
    archived = archive_logs(files, tmp_path / "x.parquet")
    assert archived == run.summary["xacts"], "every transaction is kept"
    assert not any(f.exists() for f in files)
    count = duckdb.sql(f"SELECT count(*) FROM '{tmp_path / 'x.parquet'}'").fetchall()
    assert count == [(archived,)]


def test_read_only_is_enforced_by_the_server(
    bench: Pgbench, pg: PgBinaries, tmp_path: Path
) -> None:
    from pgscope.spec import ScriptRef

    script = tmp_path / "w.sql"
    script.write_text("UPDATE pgbench_branches SET bbalance = bbalance + 1 WHERE bid = 1;\n")
    read_only = Pgbench(pg, bench.conn, read_only=True, user=bench.user)
    run = read_only.run(
        Workload(None, (ScriptRef(script),), "simple"),
        clients=1,
        threads=1,
        seconds=1,
        log_prefix=tmp_path / "ro",
        on_progress=lambda r: None,
    )
    assert not run.ok
    assert "read-only transaction" in (run.error or "")
    assert run.workload_error is None, "pgscope's guard refused it: not the workload's result"
    with pytest.raises(RefusedError, match="--allow-writes"):
        read_only.initialise(2, allow_writes=False)
