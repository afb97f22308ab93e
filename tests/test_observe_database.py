"""`observe --data-dir` reads the statements and tables of the database the load runs in
(issue 30: it connected to `postgres` and advised CREATE EXTENSION pg_stat_statements there,
while the workload ran in `sbtest`), and names it. The extension is installed in the load's
database only, as a DBA installs it where the application runs."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pgscope.proc import server_account
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import PgBinaries
from tests.cli import pgscope
from tests.servers import SMALL_SERVER, observed_under_pgbench

pytestmark = [pytest.mark.server, pytest.mark.load]


@pytest.fixture
def app_cluster(pg: PgBinaries, tmp_path: Path) -> Iterator[EmbeddedCluster]:
    settings = {**benchmark_defaults(16), **SMALL_SERVER}
    settings["shared_preload_libraries"] = "pg_stat_statements"
    with EmbeddedCluster(pg, server_account(None), tmp_path / "server.log", settings) as c:
        with c.connect() as session:
            session.execute("CREATE DATABASE app")
        app = replace(c.conn, params={**c.conn.params, "dbname": "app"})
        with app.connect() as session:
            session.execute("CREATE EXTENSION pg_stat_statements")
        subprocess.run(
            [str(pg.path("pgbench")), "-i", "-s", "1", "-q", app.conninfo()],
            check=True,
            capture_output=True,
        )
        yield c


def test_observe_reads_the_statements_of_the_database_the_load_runs_in(
    pg: PgBinaries, app_cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    app = app_cluster.conn.conninfo().replace("dbname=postgres", "dbname=app")
    assert "dbname=app" in app
    result = observed_under_pgbench(
        app_cluster,
        [str(pg.path("pgbench")), "-n", "-c", "2", "-T", "14", app],
        "SELECT count(*) = 2 FROM pg_stat_activity WHERE application_name = 'pgbench' "
        "AND datname = 'app'",
        "pgbench's clients in database app",
        *("--duration", "6", "--window", "3", "--json", "--results-dir", str(tmp_path)),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "CREATE EXTENSION" not in result.stderr, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    observation = document["observation"]
    assert observation["statements_read_in"] == ["app"], observation["statements_read_in"]
    assert observation["databases"][0][0] == "app" and observation["databases"][0][1] > 0.9
    layer = next(x for x in observation["layers"] if x["name"] == "statements and tables")
    assert layer["status"] == "seen", layer
    assert "database app" in layer["detail"], layer
    # The load's own statements and tables, read where they ran.
    texts = " ".join(document["statements"]["texts"].values())
    assert "UPDATE pgbench_accounts" in texts, texts[:500]
    assert {"pgbench_accounts", "pgbench_branches"} <= {
        t["relname"] for t in document["statements"]["tables"]
    }
    assert document["statements"]["statements_read"] is True
    # The summary names it too.
    summary = pgscope("report", document["run_dir"])
    assert "database app" in summary.stdout, summary.stdout
