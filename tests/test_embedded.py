"""The embedded target: a real throw-away cluster, its settings, and its teardown."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import psycopg
import pytest

from pgscope.errors import EnvironmentProblem, SpecError, TargetError
from pgscope.proc import RunAs, child_pids, server_account
from pgscope.target import embedded
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults, wait_for_exit
from pgscope.target.pgbin import PgBinaries, find_binaries
from tests.servers import SMALL_SERVER


def show(cluster: EmbeddedCluster, name: str) -> str:
    with cluster.connect() as conn:
        row = conn.execute(f"SHOW {name}").fetchone()
    assert row is not None
    return str(row[0])


def test_runs_unprivileged_on_its_socket_only(cluster: EmbeddedCluster) -> None:
    pid = cluster.postmaster_pid
    assert pid is not None
    owner = Path(f"/proc/{pid}").stat().st_uid
    assert owner != 0, "PostgreSQL must never run as root"
    assert owner == server_account(None).uid
    # No TCP (tests/test_attacks_cluster.py: no other account gets in).
    assert show(cluster, "listen_addresses") == ""
    assert (cluster.socket_dir / f".s.PGSQL.{cluster.port}").exists()
    with psycopg.connect(
        host=str(cluster.socket_dir), port=cluster.port, user="postgres", dbname="postgres"
    ) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert show(cluster, "compute_query_id") == "on"
    assert show(cluster, "shared_buffers") == "128MB"


def test_reload_or_restart_by_context(cluster: EmbeddedCluster) -> None:
    pid = cluster.postmaster_pid
    assert cluster.apply_settings({"work_mem": "12MB"}) is False  # context user: reload
    assert show(cluster, "work_mem") == "12MB" and cluster.postmaster_pid == pid
    assert cluster.apply_settings({"work_mem": "12MB"}) is False  # no change, no work
    assert cluster.apply_settings({"shared_buffers": "96MB"}) is True  # postmaster: restart
    assert show(cluster, "shared_buffers") == "96MB" and cluster.postmaster_pid != pid
    assert show(cluster, "work_mem") == "4MB", "settings of the previous variant are undone"
    assert cluster.apply_settings({}) is True  # shared_buffers back to the startup value
    assert show(cluster, "shared_buffers") == "128MB"


def test_validation_uses_the_servers_parser(cluster: EmbeddedCluster) -> None:
    with pytest.raises(
        SpecError,
        match="variant 'x': setting no_such_thing = '1': unrecognized configuration parameter",
    ):
        cluster.validate_settings({"no_such_thing": "1"}, "variant 'x'")
    with pytest.raises(SpecError, match='invalid value for parameter "work_mem"'):
        cluster.validate_settings({"work_mem": "lots"}, "variant 'y'")
    cluster.validate_settings({"work_mem": "64MB", "shared_buffers": "1GB"}, "variant 'z'")
    assert show(cluster, "work_mem") == "4MB", "validation leaves no setting behind"
    with cluster.connect() as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_file_settings WHERE sourcefile LIKE '%auto.conf'"
        ).fetchone() == (0,)


@pytest.mark.server
def test_teardown_after_postmaster_was_killed(pg: PgBinaries, tmp_path: Path) -> None:
    cluster = EmbeddedCluster(
        pg, server_account(None), tmp_path / "log", {**benchmark_defaults(4), **SMALL_SERVER}
    )
    cluster.start()
    pid = cluster.postmaster_pid
    root = cluster.root
    assert pid is not None and root is not None
    with cluster.connect() as conn:
        conn.execute("SELECT 1")
        children = child_pids(pid)
        assert children, "a running postmaster has auxiliary processes"
        os.kill(pid, signal.SIGKILL)
        cluster.teardown()
    assert not cluster.is_alive()
    assert wait_for_exit(pid, 5)
    for child in children:
        assert wait_for_exit(child, 10), f"backend {child} outlived its postmaster"
    assert not root.exists()
    cluster.teardown()  # idempotent


@pytest.mark.server
def test_start_failure_names_the_server_error(pg: PgBinaries, tmp_path: Path) -> None:
    cluster = EmbeddedCluster(
        pg, server_account(None), tmp_path / "log", {**SMALL_SERVER, "shared_buffers": "lots"}
    )
    with (
        pytest.raises(
            TargetError,
            match=r'failed to start: LOG: +invalid value for parameter "shared_buffers": '
            r'"lots" / FATAL',
        ),
        cluster,
    ):
        pass
    assert cluster.root is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to test the account switch")
def test_root_needs_an_unprivileged_account() -> None:
    with pytest.raises(EnvironmentProblem, match="user 'no-such-user' does not exist"):
        server_account("no-such-user")
    with pytest.raises(EnvironmentProblem, match="refuses to run as root"):
        server_account("root")
    assert isinstance(server_account(None), RunAs)


def test_missing_binaries_are_explained(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentProblem, match="postgres not found there"):
        find_binaries(tmp_path)
    with pytest.raises(EnvironmentProblem, match="no such directory"):
        find_binaries(tmp_path / "nope")


def allowed_cpus(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs 2 usable CPUs")
def test_pinning_reaches_existing_and_later_backends(cluster: EmbeddedCluster) -> None:
    every = allowed_cpus(os.getpid())
    first = min(os.sched_getaffinity(0))
    cluster.pin({first})
    pid = cluster.postmaster_pid
    assert pid is not None
    assert {allowed_cpus(p) for p in [pid, *child_pids(pid)]} == {str(first)}
    with cluster.connect() as conn:  # a backend forked after the pin inherits it
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None and allowed_cpus(int(row[0])) == str(first)
    cluster.pin(None)
    assert allowed_cpus(pid) == every


@pytest.mark.server
def test_clusters_are_copies_of_one_initdb_never_the_same_directory(
    pg: PgBinaries, tmp_path: Path
) -> None:
    account = server_account(None)
    first = EmbeddedCluster(
        pg, account, tmp_path / "1.log", {**benchmark_defaults(4), **SMALL_SERVER}
    )
    with first, first.sibling(tmp_path / "2.log") as second:
        assert first.initialised_by == second.initialised_by == "template"
        assert first.data_dir != second.data_dir
        for cluster in (first, second):
            mode = cluster.data_dir.stat().st_mode & 0o777
            assert mode == 0o700, oct(mode)
            owners = {p.lstat().st_uid for p in [cluster.data_dir, *cluster.data_dir.rglob("*")]}
            assert owners == {account.uid}, "the server's account owns every file"
        with first.connect() as conn:
            conn.execute("CREATE TABLE only_in_the_first (id int)")
        with second.connect() as conn:
            row = conn.execute("SELECT to_regclass('only_in_the_first')").fetchone()
            assert row == (None,), "a copy, not a shared directory"
    template = Path(os.environ[embedded.TEMPLATES_ENV]) / embedded.template_key(pg, account)
    assert (template / "data" / "PG_VERSION").is_file()
    assert not (template / "data" / "postmaster.pid").exists(), "a template never runs"


@pytest.mark.server
def test_a_process_without_a_shared_template_makes_its_own_and_removes_it(
    pg: PgBinaries, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(embedded.TEMPLATES_ENV)
    monkeypatch.setattr(embedded, "_templates", {})
    monkeypatch.setattr(embedded, "_process_base", None)
    work = Path(tempfile.mkdtemp(prefix="own-template-"))  # in TMPDIR, which the server reaches
    work.chmod(0o755)
    settings = {**benchmark_defaults(4), **SMALL_SERVER}
    one = EmbeddedCluster(pg, server_account(None), tmp_path / "1.log", settings, work)
    try:
        with one, one.sibling(tmp_path / "2.log") as two:
            assert one.initialised_by == two.initialised_by == "template"
            [base] = work.glob("pgscope-template-*")
            assert len(list(base.glob("initdb-*/data"))) == 1, "one initdb for both"
            assert show(two, "shared_buffers") == "128MB"
    finally:
        shutil.rmtree(work)  # the template too, as this process's exit would (atexit)


@pytest.mark.server
def test_where_no_template_can_be_made_the_cluster_runs_initdb(
    pg: PgBinaries, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setenv(embedded.TEMPLATES_ENV, str(blocked))
    monkeypatch.setattr(embedded, "_templates", {})
    settings = {**benchmark_defaults(4), **SMALL_SERVER}
    with EmbeddedCluster(pg, server_account(None), tmp_path / "log", settings) as cluster:
        assert cluster.initialised_by == "initdb"
        assert show(cluster, "shared_buffers") == "128MB"


def test_the_no_server_guard_refuses_to_start_a_cluster(
    pg: PgBinaries, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(embedded.NO_SERVER_ENV, "this test checks the guard")
    cluster = EmbeddedCluster(pg, server_account(None), tmp_path / "log")
    with pytest.raises(embedded.ServerForbidden, match="this test checks the guard"):
        cluster.start()
    assert cluster.root is None, "refused before any directory was made"
