"""A central repository, for real: a PostgreSQL server started here holds the runs of two
other servers, pushed by a role that may only insert, read back by one that may only read.

The observed servers log every statement and every connection (log_statement=all,
log_connections=on): a push, a listing or a report from the repository never reaches them.
"""

from __future__ import annotations

import itertools
import json
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest

from pgscope import leftovers, tables
from pgscope.errors import ExitCode
from pgscope.proc import server_account
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import PgBinaries
from tests.cli import one_line_error, pgscope, start, wait_for_line
from tests.poll import wait_until
from tests.servers import SMALL_SERVER
from tests.stores import busy_observation, measured_run, observation_begun
from tests.suite import SESSION_TMP

pytestmark = pytest.mark.server

SHORT = ["--duration", "1", "--warmup", "0", "--repeats", "1"]
PUSHER, READER = "collector", "analyst"
DAY_US = 86_400 * 1_000_000


def dsn(cluster: EmbeddedCluster, user: str = "postgres", dbname: str = "postgres") -> str:
    return f"host={cluster.socket_dir} port={cluster.port} user={user} dbname={dbname}"


@dataclass
class Repository:
    cluster: EmbeddedCluster

    @property
    def owner(self) -> str:
        return dsn(self.cluster)

    @property
    def push(self) -> str:
        return dsn(self.cluster, PUSHER)

    @property
    def read(self) -> str:
        return dsn(self.cluster, READER)

    def query(self, statement: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        with self.cluster.connect() as conn:
            return conn.execute(statement, params).fetchall()  # type: ignore[arg-type]

    def counts(self) -> dict[str, int]:
        """Rows per table of the schema (partitions counted in their parent)."""
        from pgscope.repository.schema import OWN_TABLES, store_tables

        names = [*OWN_TABLES, *(t.name for t in store_tables())]
        with self.cluster.connect() as conn:
            return {
                n: int(conn.execute(f'SELECT count(*) FROM pgscope."{n}"').fetchone()[0])  # type: ignore[index]
                for n in names
            }


@dataclass
class Observed:
    cluster: EmbeddedCluster
    run_dir: Path
    log: Path


@pytest.fixture(scope="module")
def repository(pg: PgBinaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Repository]:
    """The central repository: a server of its own, made by `repository init` as its
    superuser, with a login role that pushes and one that reads."""
    log = tmp_path_factory.mktemp("repository") / "server.log"
    settings = {**benchmark_defaults(8), **SMALL_SERVER}
    with EmbeddedCluster(pg, server_account(None), log, settings) as cluster:
        repo = Repository(cluster)
        made = pgscope("repository", "init", "--to", repo.owner)
        assert made.returncode == 0, made.stderr
        assert "repository created" in made.stdout
        with cluster.connect() as conn:
            conn.execute(f"CREATE ROLE {PUSHER} LOGIN IN ROLE pgscope_push")
            conn.execute(f"CREATE ROLE {READER} LOGIN IN ROLE pgscope_read")
        yield repo


@pytest.fixture(scope="module")
def fleet(pg: PgBinaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Observed]]:
    """Two servers, each measured by a short read-only run (`run --dsn`), logging every
    statement and connection from then on."""
    root = tmp_path_factory.mktemp("fleet")
    settings = {**benchmark_defaults(4), **SMALL_SERVER}
    with (
        EmbeddedCluster(pg, server_account(None), root / "a.log", settings) as a,
        EmbeddedCluster(pg, server_account(None), root / "b.log", settings) as b,
    ):
        observed = []
        for name, cluster in (("a", a), ("b", b)):
            subprocess.run(
                [pg.path("pgbench"), "-i", "-s", "1", "-q", cluster.conn.conninfo()],
                check=True, capture_output=True,
            )  # fmt: skip
            result = pgscope(
                "run", "--dsn", dsn(cluster), "--workload", "select-only", "--scale", "1",
                "--clients", "1,2", *SHORT, "--results-dir", str(root / name), "--json",
            )  # fmt: skip
            assert result.returncode == 0, result.stderr[-2000:]
            run_dir = Path(json.loads(result.stdout)["run_dir"])
            cluster.apply_settings({"log_statement": "all", "log_connections": "on"})
            observed.append(Observed(cluster, run_dir, cluster.log_path))
        yield observed


def _logged_since(observed: Observed, offset: int) -> list[str]:
    """What the observed server logged of statements and connections since `offset`."""
    text = observed.log.read_bytes()[offset:].decode(errors="replace")
    return [
        line
        for line in text.splitlines()
        if "statement:" in line or "connection received" in line or "connection authorized" in line
    ]


def test_two_servers_pushed_listed_and_reported_as_from_their_folders(
    repository: Repository, fleet: list[Observed], tmp_path: Path
) -> None:
    """Each server's run pushed by the insert-only role (its connection string from a file);
    `runs --from` lists both with their verdicts and servers; `report` and `compare` from the
    repository print what they print from the folders, byte for byte; and none of it sent the
    observed servers a statement, or even connected to them."""
    identities = []
    for o in fleet:
        with o.cluster.connect() as conn:
            identities.append(
                conn.execute(
                    "SELECT system_identifier::text, current_setting('port')::int "
                    "FROM pg_control_system()"
                ).fetchone()
            )
    offsets = [o.log.stat().st_size for o in fleet]
    to_file = tmp_path / "repository"
    to_file.write_text(repository.push + "\n")
    pushed = pgscope("push", *(str(o.run_dir) for o in fleet), "--to-file", str(to_file), "--json")
    assert pushed.returncode == 0, pushed.stderr
    done = json.loads(pushed.stdout)
    assert [d["state"] for d in done] == ["pushed", "pushed"]
    assert all(d["rows"] > 0 for d in done)
    assert [(d["server"]["system_identifier"], d["server"]["port"]) for d in done] == identities

    listed = pgscope("runs", "--from", repository.read, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["run_id"]: r for r in json.loads(listed.stdout)}
    assert set(rows) == {o.run_dir.name for o in fleet}
    local = {
        r["run_id"]: r
        for o in fleet
        for r in json.loads(
            pgscope("runs", "--results-dir", str(o.run_dir.parent), "--json").stdout
        )
    }
    for run_id, row in rows.items():
        summary = json.loads((Path(local[run_id]["run_dir"]) / "summary.json").read_text())
        assert row["verdict"] == summary["verdict"] and row["verdict"]
        assert row["pushed"] == "complete"
        shared = {k: v for k, v in row.items() if k not in ("server", "pushed", "pushed_at")}
        assert shared == local[run_id], "listed as `runs` lists the folder"
    assert len({r["server"]["server_id"] for r in rows.values()}) == 2
    text = pgscope("runs", "--from", repository.read).stdout.splitlines()
    assert text[0].split()[:3] == ["date", "(UTC)", "server"] and len(text) == 3

    for o in fleet:
        run_id = o.run_dir.name
        for fmt in ("text", "json"):
            from_folder = pgscope("report", str(o.run_dir), "--format", fmt)
            from_repo = pgscope("report", run_id, "--from", repository.read, "--format", fmt)
            assert from_repo.returncode == 0, from_repo.stderr
            assert from_repo.stdout == from_folder.stdout, fmt
        html_folder = pgscope("report", str(o.run_dir), "--format", "html")
        assert html_folder.returncode == 0, html_folder.stderr
        out = tmp_path / f"{run_id}.html"
        html_repo = pgscope(
            "report", run_id, "--from", repository.read, "--format", "html", "--out", str(out)
        )
        assert html_repo.returncode == 0, html_repo.stderr
        assert out.read_bytes() == (o.run_dir / "report.html").read_bytes()

    a, b = (o.run_dir for o in fleet)
    folders = pgscope("compare", str(a), str(b))
    stored = pgscope("compare", a.name, b.name, "--from", repository.read)
    mixed = pgscope("compare", a.name, str(b), "--from", repository.read)
    assert folders.returncode == 0, folders.stderr
    assert stored.stdout == folders.stdout == mixed.stdout
    assert json.loads(
        pgscope("compare", a.name, b.name, "--from", repository.read, "--json").stdout
    ) == json.loads(pgscope("compare", str(a), str(b), "--json").stdout)
    for o, offset in zip(fleet, offsets, strict=True):
        assert _logged_since(o, offset) == [], "the observed server heard from the repository"


def test_pushing_twice_changes_nothing(repository: Repository, fleet: list[Observed]) -> None:
    first = pgscope("push", str(fleet[0].run_dir), "--to", repository.push)
    assert first.returncode == 0, first.stderr
    before = repository.counts()
    again = pgscope("push", str(fleet[0].run_dir), "--to", repository.push, "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)[0]["state"] == "already"
    assert repository.counts() == before


def _store_counts(run_dir: Path) -> dict[str, int]:
    db = duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)
    try:
        held = {r[0] for r in db.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        return {
            t: int(db.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0])  # type: ignore[index]
            for t in tables.declared()
            if t in held
        }
    finally:
        db.close()


def _run_counts(repository: Repository, run_id: str) -> dict[str, int]:
    from pgscope.repository.schema import store_tables

    [(key,)] = repository.query("SELECT run_key FROM pgscope.runs WHERE run_id = %s", [run_id])
    return {
        t.name: int(
            repository.query(f'SELECT count(*) FROM pgscope."{t.name}" WHERE run_key = %s', [key])[
                0
            ][0]
        )
        for t in store_tables()
    }


def test_a_killed_push_leaves_nothing_and_the_next_one_completes_it(
    repository: Repository, tmp_path: Path
) -> None:
    """SIGKILL while the samples are being copied: the run is not in the repository, not a row
    of it; pushed again, it is there whole, every table as many rows as the store."""
    run_dir = busy_observation(
        tmp_path / "20260101-000000-observe-dead", int(time.time() * 1e6) - 3600 * 10**6,
        seconds=120, sessions=40, hz=50,
    )  # fmt: skip
    before = repository.counts()
    proc = start(["push", str(run_dir), "--to", repository.push])
    wait_for_line(proc, r"activity_samples, 240,000 rows", timeout=120)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    # The server ends the push's session when it sees its client gone: wait for that.
    wait_until(
        lambda: (
            not repository.query(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = 'pgscope push'"
            )
        ),
        "the killed push's session ended",
        timeout=30,
    )
    assert repository.counts() == before, "a killed push left rows behind"
    assert not repository.query("SELECT 1 FROM pgscope.runs WHERE run_id = %s", [run_dir.name])
    left = [f for f in leftovers.find([SESSION_TMP]) if f.path.name.startswith("pgscope-push-")]
    assert len(left) == 1 and left[0].owner_pid == proc.pid, "its FIFOs' folder, marked"

    again = pgscope("push", str(run_dir), "--to", repository.push, "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)[0]["state"] == "pushed"
    stored = _run_counts(repository, run_dir.name)
    assert {t: n for t, n in stored.items() if n} == {
        t: n for t, n in _store_counts(run_dir).items() if n
    }
    assert stored["activity_samples"] == 240_000
    assert not left[0].path.exists(), "the next push removed the killed one's folder"


def test_the_push_role_inserts_and_reads_nothing_else(
    repository: Repository, fleet: list[Observed]
) -> None:
    """pgscope_push: INSERT into the store's tables and the functions; no SELECT, UPDATE,
    DELETE or DDL in the repository, nothing at all in another schema; the functions refuse
    a complete run's rows. pgscope_read: SELECT only."""
    pushed = pgscope("push", str(fleet[1].run_dir), "--to", repository.push)
    assert pushed.returncode == 0, pushed.stderr
    [(server_id, run_key)] = repository.query(
        "SELECT server_id, run_key FROM pgscope.runs WHERE run_id = %s", [fleet[1].run_dir.name]
    )
    with repository.cluster.connect() as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS app")
        conn.execute("CREATE TABLE IF NOT EXISTS app.accounts (id int, secret text)")
        conn.execute("INSERT INTO app.accounts VALUES (1, 'hunter2')")
    refused = {
        "SELECT * FROM app.accounts": "permission denied",
        "INSERT INTO app.accounts VALUES (2, 'x')": "permission denied",
        "CREATE TABLE app.mine (x int)": "permission denied",
        "CREATE TABLE public.mine (x int)": "permission denied",
        "CREATE SCHEMA mine": "permission denied",
        "SELECT * FROM pgscope.activity_samples": "permission denied",
        "SELECT * FROM pgscope.runs": "permission denied",
        "SELECT * FROM pgscope.documents": "permission denied",
        "UPDATE pgscope.runs SET verdict = 'x'": "permission denied",
        "DELETE FROM pgscope.steps": "permission denied",
        "TRUNCATE pgscope.steps": "permission denied",
        "DROP TABLE pgscope.steps": "must be owner",
        "CREATE TABLE pgscope.mine (x int)": "permission denied",
        f"SELECT pgscope.clear_rows({server_id}, {run_key}, 'steps')": "is not being pushed",
        f"SELECT pgscope.clear_rows({server_id}, {run_key}, 'pg_authid')": "not a table pushed",
        "SELECT pgscope.add_partition('runs', 0)": "is not a time series",
        f"SELECT pgscope.close_push({server_id}, {run_key}, '{{}}', '{{}}', NULL, 1, 0, true)": (
            "is not being pushed"
        ),
        f"SELECT pgscope.rename_waits({server_id}, {run_key}, '{{}}', '{{}}', '{{}}')": (
            "is not being pushed"
        ),
    }
    with psycopg.connect(repository.push, autocommit=True) as pusher:
        for statement, expected in refused.items():
            with pytest.raises(psycopg.Error, match=expected):
                pusher.execute(statement)  # type: ignore[arg-type]
        pusher.execute("SELECT version FROM pgscope.schema_version")  # its one read
    with psycopg.connect(repository.read, autocommit=True) as reader:
        assert reader.execute("SELECT count(*) FROM pgscope.runs").fetchone()[0] >= 1  # type: ignore[index]
        reader.execute("SELECT count(*) FROM pgscope.activity_samples_default")
        for statement in ("INSERT INTO pgscope.steps (server_id, run_key, step_id, variant, "
                          "clients, repeat, status) VALUES (1, 1, 1, 'x', 1, 1, 'ok')",
                          f"SELECT pgscope.clear_rows({server_id}, {run_key}, 'steps')",
                          "SELECT * FROM app.accounts"):  # fmt: skip
            with pytest.raises(psycopg.Error, match="permission denied"):
                reader.execute(statement)  # type: ignore[arg-type]
    assert (
        repository.query("SELECT count(*) FROM pgscope.steps WHERE run_key = %s", [run_key])[0][0]
        == 2
    ), "the complete run kept its steps"


def test_old_runs_are_pruned_whole_and_their_months_dropped(
    repository: Repository, tmp_path: Path
) -> None:
    """A run of a year ago and one of today: pruning what is older than 30 days removes the
    old one from every table and drops its month's partitions; today's stays whole. The push
    role may not prune."""
    year_ago = int(time.time() * 1e6) - 365 * DAY_US
    old = busy_observation(tmp_path / "20250101-000000-observe-old0", year_ago, 60, 4, 10)
    new = busy_observation(
        tmp_path / "20260101-000000-observe-new0", int(time.time() * 1e6) - 3600 * 10**6, 60, 4, 10
    )
    for run_dir in (old, new):
        assert pgscope("push", str(run_dir), "--to", repository.push).returncode == 0
    month = time.strftime("%Y_%m", time.gmtime(year_ago / 1e6))
    assert repository.query("SELECT to_regclass(%s)", [f"pgscope.activity_samples_{month}"])[0][0]

    refused = pgscope("repository", "prune", "--to", repository.push, "--older-than", "30d")
    assert refused.returncode == ExitCode.TARGET
    assert "prune as the role that owns it" in one_line_error(refused)

    dry = pgscope("repository", "prune", "--to", repository.owner, "--older-than", "30d",
                  "--dry-run", "--json")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)
    assert old.name in planned["runs"] and new.name not in planned["runs"]
    assert f"activity_samples_{month}" in planned["partitions"]
    assert _run_counts(repository, old.name)["activity_samples"] == 60 * 10 * 4, "dry run"

    done = pgscope("repository", "prune", "--to", repository.owner, "--older-than", "30d",
                   "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["runs"] == planned["runs"]
    assert not repository.query("SELECT to_regclass(%s)", [f"pgscope.activity_samples_{month}"])[0][
        0
    ]
    assert not repository.query("SELECT 1 FROM pgscope.runs WHERE run_id = %s", [old.name])
    for table in ("steps", "windows", "run", "events", "pgstats_counters"):
        assert not repository.query(
            f"SELECT 1 FROM pgscope.{table} t JOIN pgscope.runs r USING (run_key) "
            f"WHERE r.run_id = %s",
            [old.name],
        ), table
    assert _run_counts(repository, new.name)["activity_samples"] == 60 * 10 * 4


def test_a_run_pulled_back_is_its_store_row_for_row(repository: Repository, tmp_path: Path) -> None:
    """Every table of a run, out of the repository into a new run folder, equals the store
    pushed, row for row: strings with quotes, commas, new lines, empty or NULL; doubles at
    their last digit, infinite or not a number; 64-bit query ids."""
    run_dir = measured_run(
        tmp_path / "r" / "20260102-000000-scaling-odd0", [(1, 10.5), (2, 1e-300)]
    )
    db = duckdb.connect(str(run_dir / "run.duckdb"))
    db.execute(
        "INSERT INTO events VALUES (1, 1, 'odd', 'a \"quoted\", comma\nnew line'), "
        "(2, NULL, '', NULL), (3, 2, 'x', '\\N'), (4, 2, 'y', ','), (5, 2, '\\.', 'cr\rlf\r\n')"
    )
    db.execute(tables.of("host_cpu").ddl())
    db.execute("INSERT INTO host_cpu VALUES (1700000000000000, 1.0, 2, 'inf'::DOUBLE, "
               "'-inf'::DOUBLE, 'nan'::DOUBLE, -0.0, 0.1, 1.7976931348623157e308, 5e-324, "
               "NULL, 0.30000000000000004)")  # fmt: skip
    db.execute(tables.of("activity_queries").ddl())
    db.execute("INSERT INTO activity_queries VALUES (-9223372036854775808, 'SELECT ''a''', 1), "
               "(9223372036854775807, '', NULL)")  # fmt: skip
    db.close()
    assert pgscope("push", str(run_dir), "--to", repository.push).returncode == 0
    pulled = pgscope("pull", run_dir.name, "--from", repository.read,
                     "--results-dir", str(tmp_path / "pulled"), "--json")  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr
    copy = Path(json.loads(pulled.stdout)["run_dir"])
    assert json.loads((copy / "summary.json").read_text())["run_id"] == run_dir.name
    assert stat.S_IMODE(copy.stat().st_mode) == 0o700, "its statement texts are the user's"
    with duckdb.connect() as db:
        db.execute(f"ATTACH '{run_dir / 'run.duckdb'}' AS a (READ_ONLY)")
        db.execute(f"ATTACH '{copy / 'run.duckdb'}' AS b (READ_ONLY)")
        tables_of = {
            alias: {r[0] for r in db.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = ?", [alias]
            ).fetchall()}
            for alias in ("a", "b")
        }  # fmt: skip
        assert tables_of["a"] == tables_of["b"]
        for t in sorted(tables_of["a"]):
            columns = ", ".join(
                f"CAST(\"{c}\" AS VARCHAR)" for (c,) in db.execute(
                    "SELECT column_name FROM duckdb_columns() WHERE database_name = 'a' "
                    "AND table_name = ? ORDER BY column_index", [t]
                ).fetchall()
            )  # fmt: skip
            for x, y in (("a", "b"), ("b", "a")):
                differ = db.execute(
                    f'SELECT count(*) FROM (SELECT {columns} FROM {x}."{t}" EXCEPT ALL '
                    f'SELECT {columns} FROM {y}."{t}")'
                ).fetchone()
                assert differ == (0,), (t, x, y)


def test_runs_are_filtered_by_server_date_and_verdict(
    repository: Repository, fleet: list[Observed]
) -> None:
    for o in fleet:
        assert pgscope("push", str(o.run_dir), "--to", repository.push).returncode == 0

    def listed(*args: str) -> set[str]:
        result = pgscope("runs", "--from", repository.read, "--limit", "0", "--json", *args)
        assert result.returncode == 0, result.stderr
        return {r["run_id"] for r in json.loads(result.stdout)}

    a, b = (o.run_dir.name for o in fleet)
    port_a = fleet[0].cluster.port
    everything = listed()
    assert {a, b} <= everything
    by_port = listed("--server", f"{pgscope_host(repository, a)}:{port_a}")
    assert a in by_port and b not in by_port
    [(sysid,)] = repository.query(
        "SELECT s.system_identifier::text FROM pgscope.servers s JOIN pgscope.runs r "
        "USING (server_id) WHERE r.run_id = %s",
        [a],
    )
    assert a in listed("--server", sysid)
    assert listed("--since", "2000-01-01") >= {a, b}
    assert not listed("--until", "2000-01-01")
    assert not listed("--since", "2999-01-01")
    verdict = json.loads((fleet[0].run_dir / "summary.json").read_text())["verdict"]
    assert a in listed("--verdict", verdict.split()[0].lower())
    assert not listed("--verdict", "no verdict has these words")
    assert len(listed("--limit", "1")) == 1


def pgscope_host(repository: Repository, run_id: str) -> str:
    [(host,)] = repository.query(
        "SELECT s.host FROM pgscope.servers s JOIN pgscope.runs r USING (server_id) "
        "WHERE r.run_id = %s",
        [run_id],
    )
    return str(host)


def test_a_repository_of_another_version_is_refused_or_upgraded(
    repository: Repository, fleet: list[Observed]
) -> None:
    """Newer than this pgscope: refused, one line, to push and to read. Older: refused to
    push until its owner runs `repository init`, which upgrades it in place."""
    with repository.cluster.connect() as conn:
        conn.execute("DROP DATABASE IF EXISTS other")
        conn.execute("CREATE DATABASE other")
    other = dsn(repository.cluster, dbname="other")
    assert pgscope("repository", "init", "--to", other).returncode == 0
    with psycopg.connect(other, autocommit=True) as conn:
        conn.execute("INSERT INTO pgscope.schema_version VALUES (99, 99, '9.9')")
    for args in (["push", str(fleet[0].run_dir), "--to", other], ["runs", "--from", other],
                 ["repository", "init", "--to", other]):  # fmt: skip
        result = pgscope(*args)
        assert result.returncode == ExitCode.REFUSED, (args, result.stderr)
        assert "newer than this pgscope" in one_line_error(result)
    with psycopg.connect(other, autocommit=True) as conn:
        conn.execute("DELETE FROM pgscope.schema_version")
        conn.execute("INSERT INTO pgscope.schema_version VALUES (1, 6, 'older')")
        conn.execute("ALTER TABLE pgscope.run DROP COLUMN system_identifier")
    older = pgscope("push", str(fleet[0].run_dir), "--to", other)
    assert older.returncode == ExitCode.REFUSED
    assert "older than this pgscope's" in one_line_error(older)
    assert pgscope("runs", "--from", other).returncode == 0, "an older one is read"
    upgraded = pgscope("repository", "init", "--to", other)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "upgraded from version 1 (store 6)" in upgraded.stdout
    pushed = pgscope("push", str(fleet[0].run_dir), "--to", other, "--json")
    assert pushed.returncode == 0, pushed.stderr
    with psycopg.connect(other, autocommit=True) as conn:
        assert conn.execute("SELECT count(system_identifier) FROM pgscope.run").fetchone() == (1,)


def _steps(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in rows)


STEP_COLUMNS = "step_id, status, clients, started_us, ended_us, window_start_us, window_end_us, tps"


def test_observe_pushes_each_window_as_it_closes_and_loses_none_while_the_repository_is_away(
    repository: Repository, cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    """`observe --push`: windows reach the repository while it observes; the repository
    stopped for 20 s in the middle, the observation goes on, and once it is back every window
    arrives, in order (an instalment takes those that waited, together), then the last with
    the analysis: the repository holds the run as its folder does."""
    results = tmp_path / "r"
    proc = start(
        ["observe", "--dsn", dsn(cluster), "--duration", "40", "--window", "2",
         "--push", repository.push, "--results-dir", str(results), "--json"]
    )  # fmt: skip
    try:
        wait_until(lambda: results.is_dir() and any(results.iterdir()), "the run folder")
        [run_dir] = list(results.iterdir())

        def closed_centrally() -> list[int]:
            return [
                int(r[0])
                for r in repository.query(
                    "SELECT s.step_id FROM pgscope.steps s JOIN pgscope.runs r "
                    "USING (server_id, run_key) WHERE r.run_id = %s AND s.status <> 'running' "
                    "ORDER BY 1",
                    [run_dir.name],
                )
            ]

        def two_closed() -> list[int] | None:
            closed = closed_centrally()
            return closed if len(closed) >= 2 else None

        before = wait_until(two_closed, "two windows in the repository while it observes")
        assert len(before) >= 2 and proc.poll() is None, "windows arrive while it observes"
        assert repository.query(
            "SELECT state, status FROM pgscope.runs WHERE run_id = %s", [run_dir.name]
        ) == [("open", "running")]
        so_far = pgscope("report", run_dir.name, "--from", repository.read, "--json")
        assert so_far.returncode == 0, so_far.stderr
        assert "still arriving (no analysis stored yet)" in so_far.stderr
        assert len(json.loads(so_far.stdout)["steps"]) >= len(before), "analysed as it arrives"
        repository.cluster.stop()
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=20)  # 20 s without a repository; the observation goes on
    finally:
        repository.cluster.resume()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "the repository is out of reach" in err and "the repository is back: windows" in err
    assert "pushed to the repository" in err

    local = duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)
    try:
        windows = _steps(local.execute(f"SELECT {STEP_COLUMNS} FROM steps").fetchall())
    finally:
        local.close()
    central = _steps(
        repository.query(
            f"SELECT {', '.join('s.' + c.strip() for c in STEP_COLUMNS.split(','))} "
            "FROM pgscope.steps s JOIN pgscope.runs r USING (server_id, run_key) "
            "WHERE r.run_id = %s",
            [run_dir.name],
        )
    )
    assert central == windows and len(windows) >= 15, "every window, with its figures"
    assert [w[0] for w in windows] == list(range(1, len(windows) + 1))
    log = repository.query(
        "SELECT p.through_step, p.final FROM pgscope.push_log p JOIN pgscope.runs r "
        "USING (server_id, run_key) WHERE r.run_id = %s ORDER BY p.pushed_at",
        [run_dir.name],
    )
    through = [t for t, _ in log]
    assert through == sorted(through), "in order"
    assert [f for _, f in log] == [False] * (len(log) - 1) + [True]
    assert through[-1] == len(windows)
    jumps = [b - a for a, b in itertools.pairwise(through)]
    assert max(jumps) >= 5, f"the windows that waited arrived together: {through}"
    assert repository.query(
        "SELECT r.state, d.document->>'run_id' FROM pgscope.runs r JOIN pgscope.documents d "
        "USING (server_id, run_key) WHERE r.run_id = %s",
        [run_dir.name],
    ) == [("complete", run_dir.name)]
    stored = _run_counts(repository, run_dir.name)
    assert {t: n for t, n in stored.items() if n} == {
        t: n for t, n in _store_counts(run_dir).items() if n
    }


def test_instalments_send_only_what_is_new_and_rename_waits_learnt_late(
    repository: Repository, tmp_path: Path
) -> None:
    """An observation's instalments, by hand: the first sends what the store has; the next
    only the rows after it (none twice) and the tables whose rows change whole; a wait the
    memory sampler wrote by number and named later (its `wait-names` event) is renamed in
    the rows sent before; the last, with the analysis, completes the run, and then nothing
    more is taken."""
    from pgscope.repository.connection import connect
    from pgscope.repository.push import push, scratch
    from pgscope.target.conn import ConnParams
    from pgscope.windows import VARIANT

    t0 = int(time.time() * 1e6) - 600 * 10**6
    run_dir = tmp_path / "20260103-000000-observe-inst"
    store = observation_begun(run_dir, t0, "inst")

    def samples(first: int, count: int, event: str) -> None:
        numbers = range(first, first + count)
        store.append(
            "activity_samples",
            {
                "ts_us": [t0 + n * 20_000 for n in numbers],
                "sample_no": list(numbers),
                "pid": [100] * count,
                "backend_type": ["client backend"] * count,
                "state": ["active"] * count,
                "wait_event_type": ["LWLock"] * count,
                "wait_event": [event] * count,
            },
        )

    def central(sql: str) -> list[tuple[Any, ...]]:
        """`sql`'s rows of this run (its WHERE `run`)."""
        run = "run_key = (SELECT run_key FROM pgscope.runs WHERE run_id = %s)"
        return repository.query(sql.replace("WHERE run", f"WHERE {run}"), [run_dir.name])

    session, _ = connect(ConnParams.from_dsn(repository.push), writing=True)
    reader = store.writer()
    try:
        samples(0, 100, "#77")
        store.begin_step(1, VARIANT, 0, 1, 0, 10.0, 0.0, False, t0)
        with scratch() as fifos:
            first = push(session, reader, scratch=fifos, document=None, final=False)
        assert first.state == "sent" and first.through_step is None
        assert central("SELECT count(*) FROM pgscope.activity_samples WHERE run") == [(100,)]
        assert central("SELECT status FROM pgscope.steps WHERE run") == [("running",)]
        # Another collector's role may neither take this open run over nor clear its rows.
        [(key,)] = central("SELECT run_key FROM pgscope.runs WHERE run")
        sid = first.server.server_id
        with repository.cluster.connect() as conn:
            conn.execute("DROP ROLE IF EXISTS other_collector")
            conn.execute("CREATE ROLE other_collector LOGIN IN ROLE pgscope_push")
        with psycopg.connect(dsn(repository.cluster, "other_collector"), autocommit=True) as other:
            with pytest.raises(psycopg.Error, match="is being pushed by another role"):
                other.execute(
                    "SELECT * FROM pgscope.open_run(%s, NULL, 'inst', NULL, %s)",
                    [sid, run_dir.name],
                )
            with pytest.raises(psycopg.Error, match="is not being pushed"):
                other.execute("SELECT pgscope.clear_rows(%s, %s, 'steps')", [sid, key])

        samples(100, 50, "WALWrite")
        store.finish_step(1, "ok", None, {"tps": 5.0}, t0 + 10**7)
        store.begin_step(2, VARIANT, 0, 1, 0, 10.0, 0.0, False, t0 + 10**7)
        # As the memory sampler names, at its end, the waits it wrote by number.
        store.db.execute("UPDATE activity_samples SET wait_event = 'WALWrite' WHERE pid = 100")
        store.add_event("wait-names", json.dumps([["LWLock", "#77", "WALWrite"]]))
        with scratch() as fifos:
            second = push(session, reader, scratch=fifos, document=None, final=False)
        assert second.through_step == 1
        assert central(
            "SELECT wait_event, count(*) FROM pgscope.activity_samples WHERE run GROUP BY 1"
        ) == [("WALWrite", 150)], "no sample twice, and the early ones renamed"
        assert sorted(central("SELECT step_id, status FROM pgscope.steps WHERE run")) == [
            (1, "ok"),
            (2, "running"),
        ]
        assert repository.query(
            "SELECT state, status FROM pgscope.runs WHERE run_id = %s", [run_dir.name]
        ) == [("open", "running")]

        store.finish_step(2, "ok", None, {"tps": 6.0}, t0 + 2 * 10**7)
        store.finish_run("complete")
        document = {"run_id": run_dir.name, "run_dir": str(run_dir), "verdict": "Fine.",
                    "findings": [{"id": "wal-write"}]}  # fmt: skip
        with scratch() as fifos:
            last = push(session, reader, scratch=fifos, document=document, final=True)
            again = push(session, reader, scratch=fifos, document=document, final=True)
        assert (last.state, last.through_step, again.state) == ("pushed", 2, "already")
        assert repository.query(
            "SELECT state, status, verdict, finding_ids FROM pgscope.runs WHERE run_id = %s",
            [run_dir.name],
        ) == [("complete", "complete", "Fine.", ["wal-write"])]
        assert central("SELECT count(*) FROM pgscope.activity_samples WHERE run") == [(150,)]
    finally:
        reader.close()
        store.close()
        session.close()
    assert _run_counts(repository, run_dir.name)["steps"] == 2


def test_two_pushes_of_one_run_at_once_send_it_once(repository: Repository, tmp_path: Path) -> None:
    run_dir = busy_observation(
        tmp_path / "20260104-000000-observe-twin", int(time.time() * 1e6) - 3600 * 10**6,
        seconds=60, sessions=40, hz=50,
    )  # fmt: skip
    both = [start(["push", str(run_dir), "--to", repository.push, "--json"]) for _ in range(2)]
    states = []
    for proc in both:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        states.append(json.loads(out)[0]["state"])
    assert sorted(states) == ["already", "pushed"]
    stored = _run_counts(repository, run_dir.name)
    assert {t: n for t, n in stored.items() if n} == {
        t: n for t, n in _store_counts(run_dir).items() if n
    }
