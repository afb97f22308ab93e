"""pgscope's own sessions on a server it watches: they keep their statements out of the
workload's counts where their role may, and try nothing their role may not (a refused SET is
an ERROR in the server's log, which would be counted among the workload's failures)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pgscope.proc import server_account
from pgscope.target.conn import ConnParams
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import PgBinaries
from tests.servers import SMALL_SERVER

pytestmark = pytest.mark.server

PRELOADED = {"shared_preload_libraries": "pg_stat_statements,auto_explain"}


@pytest.fixture
def watched(pg: PgBinaries, tmp_path: Path) -> Iterator[EmbeddedCluster]:
    settings = {**benchmark_defaults(4), **SMALL_SERVER, **PRELOADED}
    with EmbeddedCluster(pg, server_account(None), tmp_path / "server.log", settings) as c:
        with c.connect() as admin:
            admin.execute("CREATE ROLE mon LOGIN IN ROLE pg_monitor")
            admin.execute("CREATE ROLE granted LOGIN IN ROLE pg_monitor")
            admin.execute("GRANT SET ON PARAMETER pg_stat_statements.track TO granted")
        yield c


def _as(cluster: EmbeddedCluster, user: str) -> ConnParams:
    return ConnParams({**cluster.conn.params, "user": user})


def test_a_monitoring_role_sets_only_what_it_may(watched: EmbeddedCluster) -> None:
    before = watched.log_path.stat().st_size
    for _ in range(3):
        with _as(watched, "mon").connect() as session:
            shown = session.execute("SHOW pg_stat_statements.track").fetchone()
            assert shown == ("top",), "not its to change"
    with _as(watched, "granted").connect() as session:
        shown = session.execute("SHOW pg_stat_statements.track").fetchone()
        assert shown == ("none",), "granted SET on it: its statements stay out"
    with watched.conn.connect() as session:  # the superuser's: every one set
        for name, value in (("pg_stat_statements.track", "none"), ("track_functions", "none")):
            assert session.execute(f"SHOW {name}").fetchone() == (value,)
        rate = session.execute("SHOW auto_explain.sample_rate").fetchone()
        assert rate is not None and float(rate[0]) == 0
    with watched.log_path.open("rb") as log:
        log.seek(before)
        written = log.read().decode(errors="replace")
    assert "permission denied" not in written and "ERROR" not in written, written[-2000:]
