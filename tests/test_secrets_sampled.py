"""A password a running statement names never reaches the store through the wait samplers:
neither the statement texts both samplers keep by query id, nor the text the SQL sampler keeps
of a statement without one (issue 37: `ALTER ROLE ... PASSWORD` texts were stored)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgscope.target.embedded import EmbeddedCluster
from tests.cli import pgscope
from tests.poll import wait_until

pytestmark = pytest.mark.server

SECRET = "hunter2-sampled"
# Two sessions sleep with the secret in their text: one with a query id, one without.
WITH_ID = f"SELECT pg_sleep(30) /* password '{SECRET}' */"
WITHOUT_ID = f"SELECT pg_sleep(30) /* ALTER ROLE x PASSWORD '{SECRET}' */"


@contextlib.contextmanager
def sleeping(cluster: EmbeddedCluster) -> Iterator[None]:
    sessions = [cluster.conn.connect(application_name="planted") for _ in range(2)]
    sessions[1].execute("SET compute_query_id = off")

    def run(session: psycopg.Connection[tuple[object, ...]], text: str) -> None:
        with contextlib.suppress(psycopg.Error):  # cancelled at the end
            session.execute(text)  # type: ignore[arg-type]

    threads = [
        threading.Thread(target=run, args=(s, t), daemon=True)
        for s, t in zip(sessions, (WITH_ID, WITHOUT_ID), strict=True)
    ]
    for thread in threads:
        thread.start()
    try:
        with cluster.connect() as look:
            wait_until(
                lambda: (
                    look.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(30)%' "
                        "AND state = 'active' AND pid <> pg_backend_pid()"
                    ).fetchone()
                    == (2,)
                ),
                "both sessions asleep",
            )
        yield
    finally:
        for session in sessions:
            session.cancel_safe()
        for thread in threads:
            thread.join(timeout=10)
        for session in sessions:
            session.close()


@pytest.mark.parametrize("sampler", ["sql", "memory"])
def test_a_password_in_a_running_statement_is_not_stored(
    cluster: EmbeddedCluster, tmp_path: Path, sampler: str
) -> None:
    with sleeping(cluster):
        result = pgscope(
            *("observe", "--data-dir", str(cluster.data_dir), "--duration", "2"),
            *("--window", "2", "--sampler", sampler, "--json"),
            *("--results-dir", str(tmp_path / "r")),
        )
    assert result.returncode == 0, result.stderr[-3000:]
    assert SECRET not in result.stdout
    # Everything pgscope wrote (the cluster's own log, beside it, is the server's).
    files = [p for p in (tmp_path / "r").rglob("*") if p.is_file()]
    assert any(p.name == "run.duckdb" for p in files)
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path
    # What was kept of them, masked: the statements are still named.
    assert "pg_sleep" in result.stdout
