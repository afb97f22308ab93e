"""The server's own processes are never the workload's active time (issue 30: a spread
checkpoint's pacing sleep, Timeout:CheckpointWriteDelay, read as 87% of a run's active time and
the top wait of observe's windows): a pgbench write load observed while the server runs spread
checkpoints, planted by a small max_wal_size."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pgscope.proc import server_account
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import PgBinaries
from tests.servers import SMALL_SERVER, observed_under_pgbench

pytestmark = [pytest.mark.server, pytest.mark.load]

# Checkpoints every few MB of WAL, each spread over 90% of the time to the next: the
# checkpointer sleeps in CheckpointWriteDelay between its writes most of the time.
SPREAD = {
    "max_wal_size": "32MB",
    "min_wal_size": "32MB",
    "checkpoint_completion_target": "0.9",
    "checkpoint_timeout": "30s",
}


@pytest.fixture
def checkpointing(pg: PgBinaries, tmp_path: Path) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(
        pg,
        server_account(None),
        tmp_path / "server.log",
        {**benchmark_defaults(16), **SMALL_SERVER, **SPREAD},
    ) as cluster:
        subprocess.run(
            [str(pg.path("pgbench")), "-i", "-s", "5", "-q", cluster.conn.conninfo()],
            check=True,
            capture_output=True,
        )
        yield cluster


def test_a_spread_checkpoint_is_what_the_server_did_not_the_workloads_time(
    pg: PgBinaries, checkpointing: EmbeddedCluster, tmp_path: Path
) -> None:
    result = observed_under_pgbench(
        checkpointing,
        [
            *(str(pg.path("pgbench")), "-n", "-c", "4", "-j", "2", "-T", "18"),
            checkpointing.conn.conninfo(),
        ],
        "SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'checkpointer' "
        "AND wait_event IS DISTINCT FROM 'CheckpointerMain'",
        "a checkpoint in progress",
        *("--duration", "10", "--window", "5", "--json", "--results-dir", str(tmp_path)),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    document: dict[str, Any] = json.loads(result.stdout)
    waits = document["waits"]
    # The cause was there: the checkpointer was at work, most of it asleep between writes.
    checkpointer = next(b for b in waits["background"] if b["backend_type"] == "checkpointer")
    assert checkpointer["busy"] > 0.3, waits["background"]
    assert checkpointer["waits"][0][0] == "Timeout:CheckpointWriteDelay", checkpointer
    # ... and none of it is the workload's active time, its AAS, or its windows' top wait.
    events = {(e["wait_event_type"], e["wait_event"]) for e in waits["overall"]["entries"]}
    assert ("Timeout", "CheckpointWriteDelay") not in events, events
    for cell in waits["by_clients"]:
        labels = {(e["wait_event_type"], e["wait_event"]) for e in cell["profile"]["entries"]}
        assert ("Timeout", "CheckpointWriteDelay") not in labels
    for window in document["observation"]["windows"]:
        assert window["top_wait"] != "Timeout:CheckpointWriteDelay", window
        assert window["checkpointing"] and window["checkpointing"] > 0.5, window
    assert "CheckpointWriteDelay" not in document["verdict"]
    run_dir = Path(document["run_dir"])
    db = duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)
    try:
        clients, instants = db.execute(
            "SELECT count(*) FILTER (WHERE backend_type = 'client backend' AND state = 'active' "
            "AND application_name = 'pgbench'), count(DISTINCT sample_no) FROM activity_samples"
        ).fetchone() or (0, 0)
    finally:
        db.close()
    # The active time and its AAS are pgbench's sessions', nothing else.
    assert waits["overall"]["active_rows"] == clients
    assert waits["overall"]["aas"] == pytest.approx(clients / instants)
    # The checkpoint is an event of the timeline, as long as it lasted.
    spans = document["timeline"]["series"]["spans"]
    assert spans and all(kind == "checkpoint" for _, _, kind, _ in spans), spans
    assert max(end - start for start, end, _, _ in spans) > 3.0, spans
    assert waits["checkpoints"], waits
