"""Local streaming standbys and synchronous replication on a real run."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from tests.cli import one_line_error, pgscope
from tests.suite import wait_for_nothing_left, wait_for_programs

SYNCREP = """
scale = 0
clients = [1, 2]
duration = 2
warmup = 0
repeats = 1
standbys = 2
init_sql = "schema.sql"
scripts = ["insert.sql"]
[settings]
shared_buffers = "128MB"
synchronous_standby_names = "FIRST 1 (s1, s2)"
[variants]
off = {synchronous_commit = "off"}
remote_write = {synchronous_commit = "remote_write"}
[collectors]
activity = {}
pgstats = {}
"""


@pytest.mark.server
def test_a_syncrep_run_with_two_standbys(tmp_path: Path) -> None:
    (tmp_path / "schema.sql").write_text(
        "create table test(id serial primary key, info text, crt_time timestamp);\n"
    )
    (tmp_path / "insert.sql").write_text("insert into test(info) values (null);\n")
    spec = tmp_path / "syncrep.toml"
    spec.write_text(SYNCREP)
    result = pgscope(
        "run",
        str(spec),
        "--json",
        "--results-dir",
        str(tmp_path / "r"),
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    run_dir = Path(doc["run_dir"])
    assert (run_dir / "standby-s1.log").is_file() and (run_dir / "standby-s2.log").is_file()
    db = duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)
    try:
        events = [
            d for (d,) in db.execute("SELECT detail FROM events WHERE kind = 'standbys'").fetchall()
        ]
        sync = db.execute(
            "SELECT object, max(value) FROM pgstats_counters WHERE source = "
            "'pg_stat_replication' AND counter = 'sync' GROUP BY 1 ORDER BY 1"
        ).fetchall()
        syncrep_waits = db.execute(
            "SELECT s.variant, count(*) FROM activity_samples a JOIN steps s ON a.ts_us "
            "BETWEEN s.started_us AND s.ended_us WHERE a.wait_event = 'SyncRep' "
            "GROUP BY 1"
        ).fetchall()
    finally:
        db.close()
    assert events == ["s1, s2 streaming"]
    assert sync == [("s1", 1.0), ("s2", 0.0)], "FIRST 1 (s1, s2): s1 sync, s2 potential"
    waits = dict(syncrep_waits)
    assert waits.get("remote_write", 0) > 0, "commits wait for the standby (IPC:SyncRep)"
    assert waits.get("off", 0) == 0, "synchronous_commit=off never waits for it"


def test_standbys_are_refused_on_a_users_server(tmp_path: Path) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text("standbys = 1\nworkload = 'select-only'\n")
    result = pgscope(
        "run",
        str(spec),
        "--dsn",
        "host=127.0.0.1 port=1 dbname=x",
        "--results-dir",
        str(tmp_path / "r"),
    )
    assert result.returncode == 6
    assert "standbys are started by pgscope" in one_line_error(result)


@pytest.mark.server
def test_ctrl_c_with_standbys_running_leaves_nothing(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    from tests.suite import pgscope_temp_dirs, server_processes

    (tmp_path / "schema.sql").write_text(
        "create table test(id serial primary key, info text, crt_time timestamp);\n"
    )
    (tmp_path / "insert.sql").write_text("insert into test(info) values (null);\n")
    spec = tmp_path / "syncrep.toml"
    spec.write_text(SYNCREP.replace("duration = 2", "duration = 30"))
    before_procs, before_dirs = server_processes(), pgscope_temp_dirs()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgscope", "run", str(spec), "--results-dir", str(tmp_path / "r")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until the first step is under way
        line = proc.stderr.readline()
        if "standbys" in line:
            break
    # The primary, its standby and the load all running: the Ctrl-C reaches every one.
    wait_for_programs(before_procs, {"pgbench", "postgres"})
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    wait_for_nothing_left(before_procs, before_dirs)  # no primary, standby or pgbench left
    [run_dir] = list((tmp_path / "r").iterdir())
    assert (run_dir / "standby-s1.log").is_file()
