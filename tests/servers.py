"""PostgreSQL for tests: the binaries of each major version, a cluster per test or per module,
the account pgbench runs as, and a small file system to fill."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgscope.drive.loaduser import LoadUser, load_account
from pgscope.proc import server_account
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import PgBinaries, find_binaries

SMALL_SERVER = {"shared_buffers": "128MB", "max_wal_size": "1GB"}


@pytest.fixture(scope="session")
def pg() -> PgBinaries:
    return find_binaries()


# -- PostgreSQL versions ----------------------------------------------------------------------
# Debian's 15 (with USDT probes) is every test's server; `make setup` also installs 16, 17 and
# 18 (scripts/setup.sh: .tools/pg/<major>/bin). Tests that read views whose columns differ
# between versions, and the planted causes named per version, take `pg_version`: they run on
# each installed version, and say which is missing where one is.
PG_MAJORS = (15, 16, 17, 18)
NEWER_MAJORS = (16, 17, 18)  # beside 15, which every other test uses
TOOLS_PG = Path(__file__).parent.parent / ".tools" / "pg"


def pg_of_major(major: int) -> PgBinaries:
    """The binaries of one PostgreSQL major version, or a skip saying why there are none."""
    bindir = (
        Path(f"/usr/lib/postgresql/{major}/bin") if major == 15 else TOOLS_PG / str(major) / "bin"
    )
    if not (bindir / "postgres").is_file():
        pytest.skip(f"PostgreSQL {major} is not installed at {bindir} (make setup installs it)")
    found = find_binaries(bindir)
    assert found.major_version() == major, f"{bindir} holds PostgreSQL {found.version()}"
    return found


@pytest.fixture(params=PG_MAJORS, ids=lambda major: f"pg{major}")
def pg_version(request: pytest.FixtureRequest) -> PgBinaries:
    """Each PostgreSQL version in turn (15, 16, 17, 18)."""
    return pg_of_major(int(request.param))


@pytest.fixture(params=NEWER_MAJORS, ids=lambda major: f"pg{major}")
def pg_newer(request: pytest.FixtureRequest) -> PgBinaries:
    """16, 17 and 18 in turn, for tests whose 15 case is another test's."""
    return pg_of_major(int(request.param))


@contextlib.contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A small file system of `size` (tmpfs's syntax: "100m") at `mount`, unmounted (and the
    folder removed, if this made it) on the way out. Skips the test where not root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    made = not mount.exists()
    mount.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        if made:
            mount.rmdir()


@pytest.fixture(scope="session")
def load_user() -> Iterator[LoadUser]:
    """The account pgbench and psql run as (never root), with its working directory (in the
    session's TMPDIR, which that account can enter, like the clusters')."""
    with LoadUser.private(load_account(None), Path(tempfile.gettempdir())) as user:
        yield user


@pytest.fixture
def cluster(pg: PgBinaries, tmp_path: Path) -> Iterator[EmbeddedCluster]:
    """A fresh small embedded cluster for one test."""
    with EmbeddedCluster(
        pg,
        server_account(None),
        tmp_path / "server.log",
        {**benchmark_defaults(16), **SMALL_SERVER},
    ) as running:
        yield running


@pytest.fixture(scope="module")
def shared_cluster(
    pg: PgBinaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmbeddedCluster]:
    """One cluster for a module whose tests do not change its settings."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    with EmbeddedCluster(
        pg, server_account(None), log, {**benchmark_defaults(16), **SMALL_SERVER}
    ) as running:
        yield running


def wait_for_sessions(
    cluster: EmbeddedCluster, count: int, application: str = "pgbench", timeout: float = 60
) -> None:
    """Until `count` sessions of `application` are connected to `cluster` (a load under way)."""
    from tests.poll import wait_until

    def connected() -> bool:
        with cluster.connect() as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                [application],
            ).fetchone()
        return bool(row and row[0] >= count)

    wait_until(connected, f"{count} sessions of {application}", timeout, every=0.1)


def observed_beside(
    cluster: EmbeddedCluster,
    clients: list[threading.Thread],
    stop: threading.Event,
    application: str,
    *args: str,
) -> subprocess.CompletedProcess[str]:
    """`pgscope observe --data-dir` of `cluster` with `args`, once every one of `clients` (client
    threads that run until `stop`) is connected as `application`; the clients stopped after."""
    from tests.cli import pgscope

    for thread in clients:
        thread.start()
    try:
        wait_for_sessions(cluster, len(clients), application)
        return pgscope("observe", "--data-dir", str(cluster.data_dir), *args)
    finally:
        stop.set()
        for thread in clients:
            thread.join(timeout=10)


def observed_under_pgbench(
    cluster: EmbeddedCluster,
    pgbench: list[str],
    ready: str,
    what: str,
    *args: str,
) -> subprocess.CompletedProcess[str]:
    """`pgscope observe --data-dir` of `cluster` with `args` while `pgbench` (its command line)
    runs, once the query `ready` (one boolean) holds, `what` in words for a timeout; the load
    stopped after."""
    from tests.cli import pgscope
    from tests.poll import wait_until

    load = subprocess.Popen(pgbench, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with cluster.connect() as session:

            def holds() -> bool:
                row = session.execute(ready).fetchone()
                return bool(row and row[0])

            wait_until(holds, what)
        return pgscope("observe", "--data-dir", str(cluster.data_dir), *args)
    finally:
        load.terminate()
        load.wait()


def setting(cluster: EmbeddedCluster, name: str) -> str:
    """A setting as a new session sees it (after a reload, once the server has read it)."""
    with cluster.connect() as conn:
        row = conn.execute("SELECT current_setting(%s)", [name]).fetchone()
    assert row is not None
    return str(row[0])
