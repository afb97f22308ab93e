"""Issue 37: a hostile repository, and a push role that pushes more than runs. Each attack
run again here as it was run, against a real repository (a PostgreSQL server started here),
and shown to do no harm.

- `pull` trusted the run id the repository returned: a repository answering with an
  absolute id (or one with `..`) made pull create that folder and write run.duckdb and
  summary.json there. A repository is data: its ids become paths only once they are run ids.
- The push role made partitions at any bound (`add_partition('activity_samples', 9e18)`),
  and registered a run id another server's run already had, shadowing it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgscope.errors import ExitCode
from pgscope.proc import server_account
from pgscope.repository.schema import REPOSITORY_VERSION
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import PgBinaries
from tests.cli import one_line_error, pgscope
from tests.servers import SMALL_SERVER
from tests.stores import measured_run, repeated_run
from tests.test_repository import PUSHER, READER, Repository, dsn

pytestmark = pytest.mark.server

HOUR_US = 3600 * 1_000_000


@pytest.fixture(scope="module")
def repository(pg: PgBinaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Repository]:
    """A repository made by `repository init` as its server's superuser, with a login role
    that pushes and one that reads."""
    log = tmp_path_factory.mktemp("repository") / "server.log"
    settings = {**benchmark_defaults(8), **SMALL_SERVER}
    with EmbeddedCluster(pg, server_account(None), log, settings) as cluster:
        repo = Repository(cluster)
        made = pgscope("repository", "init", "--to", repo.owner)
        assert made.returncode == 0, made.stderr
        with cluster.connect() as conn:
            conn.execute(f"CREATE ROLE {PUSHER} LOGIN IN ROLE pgscope_push")
            conn.execute(f"CREATE ROLE {READER} LOGIN IN ROLE pgscope_read")
        yield repo


def _database(repository: Repository, name: str) -> tuple[str, str, str]:
    """A repository of its own in database `name`: its owner's, pusher's and reader's DSNs."""
    with repository.cluster.connect() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    owner = dsn(repository.cluster, dbname=name)
    made = pgscope("repository", "init", "--to", owner)
    assert made.returncode == 0, made.stderr
    return owner, dsn(repository.cluster, PUSHER, name), dsn(repository.cluster, READER, name)


@pytest.mark.parametrize("returned", ["absolute", "../escaped", "a/../../escaped"])
def test_pull_writes_nowhere_but_a_new_folder_in_the_results_folder(
    repository: Repository, tmp_path: Path, returned: str
) -> None:
    """The repository's owner makes it answer any run id asked for with another, one that
    reaches outside the results folder: a `=` of its own, first on the database's search
    path. `pull` refuses it in one line and writes nothing anywhere (it created the folder
    the id named, and wrote run.duckdb and summary.json in it)."""
    owner, push, read = _database(repository, "hostile")
    run_dir = measured_run(
        tmp_path / "runs" / "20261128-010000-scaling-ab01", [(1, 10.0), (2, 19.0)]
    )
    pushed = pgscope("push", str(run_dir), "--to", push)
    assert pushed.returncode == 0, pushed.stderr
    results = tmp_path / "deep" / "results"
    results.mkdir(parents=True)
    target = tmp_path / "elsewhere" if returned == "absolute" else results / returned
    bad_id = str(target) if returned == "absolute" else returned
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute("UPDATE pgscope.runs SET run_id = %s", [bad_id])
        conn.execute("CREATE SCHEMA evil")
        conn.execute(
            "CREATE FUNCTION evil.always(text, text) RETURNS boolean LANGUAGE sql IMMUTABLE "
            "AS 'SELECT true'"
        )
        conn.execute(
            "CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.always)"
        )
        conn.execute("GRANT USAGE ON SCHEMA evil TO PUBLIC")
        conn.execute("ALTER DATABASE hostile SET search_path = evil, pg_catalog, public")
    with psycopg.connect(read, autocommit=True) as conn:  # the trick works: any id is that one
        assert conn.execute(
            "SELECT run_id FROM pgscope.runs WHERE run_id = %s", [run_dir.name]
        ).fetchall() == [(bad_id,)]
    pulled = pgscope("pull", run_dir.name, "--from", read, "--results-dir", str(results))
    assert pulled.returncode == ExitCode.REFUSED, pulled.stderr
    assert "refused" in one_line_error(pulled)
    resolved = Path(target).resolve()
    assert not resolved.exists(), f"pull made {resolved}"
    assert list(results.iterdir()) == [], "nothing in the results folder either"
    assert not (tmp_path / "deep" / "escaped").exists() and not (tmp_path / "escaped").exists()


def test_an_id_asked_for_that_is_not_a_run_id_is_a_usage_error(
    repository: Repository, tmp_path: Path
) -> None:
    for name in ("..", ".hidden", "a\x01b"):
        pulled = pgscope("pull", name, "--from", repository.read, "--results-dir", str(tmp_path))
        assert pulled.returncode == ExitCode.USAGE, (name, pulled.stderr)
        assert "is not a run id" in one_line_error(pulled)
    assert list(tmp_path.iterdir()) == []


def _partitions(repository: Repository) -> set[str]:
    return {
        str(r[0])
        for r in repository.query(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'pgscope.activity_samples'::regclass"
        )
    }


def test_the_push_role_makes_partitions_only_for_times_a_run_can_have(
    repository: Repository,
) -> None:
    before = _partitions(repository)
    now_us = int(time.time() * 1e6)
    refused = {
        "SELECT pgscope.add_partition('activity_samples', 9000000000000000000)": "not a time",
        "SELECT pgscope.add_partition('activity_samples', 0)": "not a time",
        "SELECT pgscope.add_partition('activity_samples', -1)": "not a time",
        "SELECT pgscope.add_partition('activity_samples', NULL)": "not a time",
        f"SELECT pgscope.add_partition('activity_samples', {now_us + 400 * 86_400 * 10**6})": (
            "not a time"
        ),
    }
    with psycopg.connect(repository.push, autocommit=True) as pusher:
        for statement, expected in refused.items():
            with pytest.raises(psycopg.Error, match=expected):
                pusher.execute(statement)  # type: ignore[arg-type]
        assert _partitions(repository) == before, "no partition made"
        # A run of an hour ago, or of 2001: its month is made (or was).
        for when in (now_us - HOUR_US, 1_000_000_000_000_000):
            pusher.execute("SELECT pgscope.add_partition('activity_samples', %s)", [when])
    month = time.strftime("%Y_%m", time.gmtime(now_us / 1e6 - 3600))
    assert f"activity_samples_{month}" in _partitions(repository)
    assert "activity_samples_2001_09" in _partitions(repository)


def test_a_store_with_times_outside_is_pushed_into_the_default_partition(
    repository: Repository, tmp_path: Path
) -> None:
    """A received store whose series rows are at 9e18 µs and in 1970, beside rows of an
    hour ago: its push makes the partition of this hour's month only (not one for 9e18, nor
    every month between 1970 and then), and every row arrives, those two in the default
    partition."""
    import duckdb

    from pgscope.analyze.load import load_analysis
    from pgscope.render.json_doc import run_document
    from tests.stores import busy_observation

    started = int(time.time() * 1e6) - HOUR_US
    run_dir = busy_observation(tmp_path / "20261128-020000-observe-far0", started, 10, 2, 10)
    # Its analysis first, as its folder would have it: what the push sends beside the rows.
    (run_dir / "summary.json").write_text(json.dumps(run_document(load_analysis(run_dir))))
    with duckdb.connect(str(run_dir / "run.duckdb")) as db:
        db.execute("UPDATE activity_samples SET ts_us = 9000000000000000000 WHERE sample_no = 1")
        db.execute("UPDATE activity_samples SET ts_us = 5 WHERE sample_no = 2")
    before = _partitions(repository)
    pushed = pgscope("push", str(run_dir), "--to", repository.push, "--json")
    assert pushed.returncode == 0, pushed.stderr
    month = time.strftime("%Y_%m", time.gmtime(started / 1e6))
    assert _partitions(repository) - before <= {f"activity_samples_{month}"}
    [(far,)] = repository.query(
        "SELECT count(*) FROM pgscope.activity_samples_default s JOIN pgscope.runs r "
        "USING (server_id, run_key) WHERE r.run_id = %s",
        [run_dir.name],
    )
    assert far == 2 * 2, "the rows at 9e18 and in 1970, each of 2 sessions"
    [(rows,)] = repository.query(
        "SELECT count(*) FROM pgscope.activity_samples s JOIN pgscope.runs r "
        "USING (server_id, run_key) WHERE r.run_id = %s",
        [run_dir.name],
    )
    assert rows == 10 * 10 * 2


def test_a_run_id_is_one_servers(repository: Repository, tmp_path: Path) -> None:
    """A run pushed from server db1; a run of the same id from db2 (a push role registering
    an id it saw listed) is refused in one line; the first stays the one listed and pulled."""
    name = "20261128-030000-scaling-5ad0"
    first = repeated_run(tmp_path / "a" / name, [(1, 1, 10.0), (2, 1, 19.0)], "host=db1")
    shadow = repeated_run(tmp_path / "b" / name, [(1, 1, 99.0), (2, 1, 99.0)], "host=db2")
    assert pgscope("push", str(first), "--to", repository.push).returncode == 0
    refused = pgscope("push", str(shadow), "--to", repository.push)
    assert refused.returncode == ExitCode.TARGET, refused.stderr
    assert "another server's" in one_line_error(refused)
    listed = pgscope("runs", "--from", repository.read, "--json", "--limit", "0")
    mine = [r for r in json.loads(listed.stdout) if r["run_id"] == name]
    assert [r["server"]["host"] for r in mine] == ["db1"]
    pulled = pgscope("pull", name, "--from", repository.read, "--results-dir", str(tmp_path / "p"))
    assert pulled.returncode == 0, pulled.stderr
    with psycopg.connect(repository.push, autocommit=True) as pusher:
        for bad in ("/tmp/abs", "../x", "a/b", "", "..", "a\nb"):
            with pytest.raises(psycopg.Error, match="is not a run id"):
                pusher.execute("SELECT * FROM pgscope.open_run(1, NULL, 'db3', 5432, %s)", [bad])
    assert not repository.query("SELECT 1 FROM pgscope.servers WHERE host = 'db3'")


def test_an_older_repository_gets_the_checks_when_its_owner_upgrades_it(
    repository: Repository, tmp_path: Path
) -> None:
    """A repository of version 1, whose functions check nothing: pushes are refused until
    `repository init` upgrades it, and then its push role's functions check."""
    from pgscope import tables

    owner, push, _ = _database(repository, "older")
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute(
            "CREATE OR REPLACE FUNCTION pgscope.add_partition(p_table text, p_us bigint) "
            "RETURNS boolean LANGUAGE sql SECURITY DEFINER AS 'SELECT true'"
        )
        conn.execute("DELETE FROM pgscope.schema_version")
        conn.execute(
            "INSERT INTO pgscope.schema_version VALUES (1, %s, 'older')", [tables.STORE_VERSION]
        )
    run_dir = measured_run(tmp_path / "20261128-040000-scaling-01d0", [(1, 10.0), (2, 19.0)])
    older = pgscope("push", str(run_dir), "--to", push)
    assert older.returncode == ExitCode.REFUSED
    assert "older than this pgscope's" in one_line_error(older)
    upgraded = pgscope("repository", "init", "--to", owner)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "upgraded from version 1" in upgraded.stdout
    assert f"version {REPOSITORY_VERSION}," in upgraded.stdout
    with (
        psycopg.connect(push, autocommit=True) as pusher,
        pytest.raises(psycopg.Error, match="not a time"),
    ):
        pusher.execute("SELECT pgscope.add_partition('activity_samples', 9000000000000000000)")
    assert pgscope("push", str(run_dir), "--to", push).returncode == 0
