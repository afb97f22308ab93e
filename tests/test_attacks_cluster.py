"""Attacks on the embedded cluster (issue 37), run again the way a red team ran them.

- Another local account reached the cluster: it listened on 127.0.0.1 with `trust`, and
  `su nobody -c "psql 'host=127.0.0.1 port=P user=postgres' -c 'COPY ... TO PROGRAM ...'"` ran
  a program as the postgres account. Now it listens on no TCP address, only on a 0700 socket in
  a folder of its account's inside the cluster's own 0700 folder, and rejects TCP besides.
- A spec's `[settings]` (or `--set`) overrode pgscope's `listen_addresses` and
  `unix_socket_permissions` (it listened on ::1 too, socket 0777). Now such a setting is
  refused, in one line naming it and where it came from; and where the cluster listens is on
  the postmaster's command line, which ALTER SYSTEM does not outrank.
- Root copied the initdb template into a new cluster and then walked the copy to give it its
  owners: a process of the postgres account swapped a folder of the copy for a link between
  the two, and root's lchown walk handed a root 0600 file to postgres. Now the copy is made by
  the account itself, and root changes the owner of nothing inside the account's trees.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pgscope.errors import SpecError, TargetError
from pgscope.proc import RunAs, server_account
from pgscope.spec import PRELOADABLE, RESERVED_SETTINGS, load_spec
from pgscope.target import embedded
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import PgBinaries
from tests.cli import one_line_error, pgscope
from tests.servers import SMALL_SERVER

ROOT_ONLY = pytest.mark.skipif(
    os.geteuid() != 0, reason="acting as another account (nobody, postgres) needs root"
)
SECRET = b"root's own bytes\n"


def spec_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "attack.toml"
    path.write_text(f'workload = "select-only"\nclients = [1]\n{body}')
    return path


# -- a spec cannot choose where the cluster listens, who connects, what it runs or loads ----


def test_a_spec_setting_listen_addresses_is_refused(tmp_path: Path) -> None:
    path = spec_file(tmp_path, '[settings]\nlisten_addresses = "*"\n')
    with pytest.raises(SpecError) as caught:
        load_spec(str(path))
    message = str(caught.value)
    assert message.startswith(f"{path}: field settings: ")
    assert "listen_addresses is set by pgscope alone" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "name",
    [
        "listen_addresses",
        "LISTEN_ADDRESSES",  # the server compares names without case
        "port",
        "unix_socket_directories",
        "unix_socket_permissions",
        "unix_socket_group",
        "hba_file",
        "ident_file",
        "ssl",
        "ssl_passphrase_command",
        "archive_command",
        "restore_command",
        "archive_library",
        "dynamic_library_path",
        "jit_provider",
        "log_directory",
        "primary_conninfo",
    ],
)
def test_a_variant_naming_a_setting_of_pgscope_is_refused(tmp_path: Path, name: str) -> None:
    path = spec_file(tmp_path, f'[variants]\nopen = {{{name} = "x"}}\n')
    with pytest.raises(SpecError, match=rf"field variants: variant 'open': {name} is set by"):
        load_spec(str(path))


def test_set_naming_a_setting_of_pgscope_is_refused_as_set() -> None:
    with pytest.raises(SpecError) as caught:
        load_spec("scaling", extra_settings={"unix_socket_permissions": "0777"})
    assert str(caught.value).startswith("--set unix_socket_permissions=0777: ")
    # Ordinary settings still pass.
    loaded = load_spec("scaling", extra_settings={"work_mem": "64MB"})
    assert loaded.spec.settings["work_mem"] == "64MB"


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        ("pg_stat_statements", None),
        ('pg_stat_statements, "auto_explain",pg_wait_sampling', None),
        ("", None),
        ("/tmp/evil", "/tmp/evil"),
        ("$libdir/pg_stat_statements", "$libdir/pg_stat_statements"),
        ("auto_explain, plpython3u", "plpython3u"),
    ],
)
def test_only_the_libraries_pgscope_loads_may_be_preloaded(
    tmp_path: Path, value: str, refused: str | None
) -> None:
    escaped = value.replace('"', '\\"')
    for name in ("shared_preload_libraries", "session_preload_libraries"):
        path = spec_file(tmp_path, f'[settings]\n{name} = "{escaped}"\n')
        if refused is None:
            assert load_spec(str(path)).spec.settings[name] == value
        else:
            with pytest.raises(SpecError, match=re.escape(f"{name}: {refused!r} is not a library")):
                load_spec(str(path))
    assert {"pg_stat_statements", "auto_explain", "pg_wait_sampling"} == PRELOADABLE


def test_no_bundled_recipe_names_a_setting_of_pgscope() -> None:
    from pgscope.spec import recipe_names

    for name in recipe_names():
        spec = load_spec(name).spec
        named = {n.lower() for v in spec.variants for n in spec.variant(v)}
        assert not named & set(RESERVED_SETTINGS), name


def test_the_cli_refuses_it_in_one_line(tmp_path: Path) -> None:
    path = spec_file(tmp_path, "[settings]\nunix_socket_permissions = 511\n")
    result = pgscope("run", str(path), "--plan")
    assert result.returncode == 3
    assert "unix_socket_permissions is set by pgscope alone" in one_line_error(result)
    result = pgscope("run", "scaling", "--set", "listen_addresses=0.0.0.0", "--plan")
    assert result.returncode == 3
    assert one_line_error(result).startswith(
        "pgscope: error: --set listen_addresses=0.0.0.0: listen_addresses is set by pgscope"
    )


# -- another local account cannot connect --------------------------------------------------


def tcp_refused(port: int) -> None:
    """No one, root included, connects by TCP to the cluster's port, on IPv4 or IPv6."""
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.settimeout(5)
            with pytest.raises(OSError):  # refused (or no IPv6 at all)
                probe.connect((address, port))


def psql_as(
    pg: PgBinaries, user: str, conninfo: str, sql: str = "SELECT 'in'"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(pg.path("psql")), "-X", "-At", "-d", conninfo, "-c", sql],
        user=user,
        extra_groups=[],
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "HOME": "/", "PGCONNECT_TIMEOUT": "5"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def show(cluster: EmbeddedCluster, name: str) -> tuple[str, str]:
    with cluster.connect() as conn:
        row = conn.execute("SELECT setting, source FROM pg_settings WHERE name = %s", [name])
        found = row.fetchone()
    assert found is not None
    return str(found[0]), str(found[1])


def test_the_cluster_listens_on_no_tcp_address(cluster: EmbeddedCluster) -> None:
    assert show(cluster, "listen_addresses") == ("", "command line")
    assert show(cluster, "unix_socket_permissions")[0] == "0700"
    tcp_refused(cluster.port)
    with cluster.connect() as conn:  # pgscope's own connection, through the socket
        assert conn.execute("SELECT 1").fetchone() == (1,)
        methods = conn.execute(
            "SELECT DISTINCT auth_method FROM pg_hba_file_rules WHERE type LIKE 'host%'"
        ).fetchall()
    assert methods == [("reject",)], "TCP is rejected even if the cluster listened for it"
    sock = cluster.socket_dir / f".s.PGSQL.{cluster.port}"
    assert stat.S_IMODE(sock.lstat().st_mode) == 0o700
    for folder in (cluster.socket_dir, cluster.socket_dir.parent):
        info = folder.lstat()
        assert stat.S_IMODE(info.st_mode) == 0o700, folder
        assert info.st_uid == server_account(None).uid, folder
    # The server's log holds its text (statements, errors): the user's alone.
    assert stat.S_IMODE(cluster.log_path.lstat().st_mode) == 0o600


@ROOT_ONLY
def test_nobody_cannot_connect_by_tcp_nor_by_the_socket(
    cluster: EmbeddedCluster, pg: PgBinaries, tmp_path: Path
) -> None:
    shared = Path(tempfile.mkdtemp(prefix="attack-witness-"))  # in TMPDIR, which all reach
    shared.chmod(0o1777)  # where the program, had it run as the account, would write
    witness = shared / "witness"
    attack = f"COPY (SELECT 1) TO PROGRAM 'id > {witness}'"
    try:
        attack_as_nobody(cluster, pg, attack, witness)
    finally:
        shutil.rmtree(shared)


def attack_as_nobody(cluster: EmbeddedCluster, pg: PgBinaries, attack: str, witness: Path) -> None:
    for host in ("127.0.0.1", "::1", "localhost"):
        result = psql_as(pg, "nobody", f"host={host} port={cluster.port} user=postgres", attack)
        assert result.returncode != 0, f"nobody connected through {host}: {result.stdout}"
        assert "refused" in result.stderr or "could not connect" in result.stderr, result.stderr
    by_socket = f"host={cluster.socket_dir} port={cluster.port} user=postgres dbname=postgres"
    result = psql_as(pg, "nobody", by_socket, attack)
    assert result.returncode != 0 and "Permission denied" in result.stderr, result.stderr
    assert not witness.exists(), "a program ran as the server's account"
    # The cluster's own account (which runs pgbench and psql) still gets in, by the socket.
    account = server_account(None)
    result = psql_as(pg, account.name, by_socket)
    assert (result.returncode, result.stdout.strip()) == (0, "in"), result.stderr


def test_alter_system_does_not_open_the_cluster(cluster: EmbeddedCluster) -> None:
    """A script runs as the cluster's superuser and may ALTER SYSTEM: where the cluster listens
    is on the postmaster's command line, which no configuration file outranks."""
    opened = {"listen_addresses": "127.0.0.1,::1", "unix_socket_permissions": "0777"}
    pid = cluster.postmaster_pid
    assert cluster.apply_settings(opened) is True  # a restart, with them in auto.conf
    assert cluster.postmaster_pid != pid
    assert show(cluster, "listen_addresses") == ("", "command line")
    assert show(cluster, "unix_socket_permissions") == ("0700", "command line")
    tcp_refused(cluster.port)
    sock = cluster.socket_dir / f".s.PGSQL.{cluster.port}"
    assert stat.S_IMODE(sock.lstat().st_mode) == 0o700


# -- root changes nothing inside the account's trees ---------------------------------------


@contextlib.contextmanager
def vault() -> Iterator[Path]:
    """A root file in a folder only root may enter: it must keep its bytes, owner and mode."""
    folder = Path(tempfile.mkdtemp(prefix="vault-"))
    try:
        folder.chmod(0o700)
        secret = folder / "secret"
        secret.write_bytes(SECRET)
        secret.chmod(0o600)
        yield folder
    finally:
        shutil.rmtree(folder)


def assert_untouched(secret: Path) -> None:
    info = secret.lstat()
    assert (info.st_uid, info.st_gid) == (0, 0), "root's file was handed to another account"
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert secret.read_bytes() == SECRET


@contextlib.contextmanager
def fresh_template(pg: PgBinaries, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A template of this test's own (the session's is shared by every test), made as a run
    makes it: root's folder, the account's initdb inside."""
    base = Path(tempfile.mkdtemp(prefix="attack-templates-"))
    try:
        base.chmod(0o711)
        monkeypatch.setenv(embedded.TEMPLATES_ENV, str(base))
        monkeypatch.setattr(embedded, "_templates", {})
        made = embedded._template(pg, server_account(None), base)
        assert made is not None and made.stat().st_uid == server_account(None).uid
        yield made
    finally:
        shutil.rmtree(base)


def chown_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, bool]]:
    """Every change of owner this process makes from now: (call, path, follows a link)."""
    calls: list[tuple[str, str, bool]] = []

    def recording(name: str, real: Callable[..., None]) -> Callable[..., None]:
        def call(path: Any, *args: Any, follow_symlinks: bool = True, **kw: Any) -> None:
            if isinstance(path, int):
                where, follows = os.readlink(f"/proc/self/fd/{path}"), False
            else:
                where, follows = os.fspath(path), follow_symlinks and name != "lchown"
            calls.append((name, where, follows))
            if name == "chown":
                real(path, *args, follow_symlinks=follow_symlinks, **kw)
            else:
                real(path, *args, **kw)

        return call

    for name in ("chown", "lchown", "fchown"):
        monkeypatch.setattr(os, name, recording(name, getattr(os, name)))
    return calls


@ROOT_ONLY
@pytest.mark.server
def test_a_folder_swapped_in_the_copy_does_not_give_root_files_away(
    pg: PgBinaries, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = server_account(None)
    with fresh_template(pg, monkeypatch) as template, vault() as folder:
        attack_from_the_template(pg, account, template, folder, tmp_path, monkeypatch)


def attack_from_the_template(
    pg: PgBinaries,
    account: RunAs,
    template: Path,
    folder: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The account plants a file in the template (its own), and a link to root's file.
    planted = template / "pg_twophase" / "secret"
    planted.write_bytes(b"the account's\n")
    os.chown(planted, account.uid, account.gid)
    os.symlink(folder / "secret", template / "pg_stat_tmp" / "link")
    os.lchown(template / "pg_stat_tmp" / "link", account.uid, account.gid)

    # Between the copy and whatever root does next, the account swaps the copy's
    # pg_twophase for a link to root's folder (deterministically: when the copy is done).
    real_copytree = shutil.copytree

    def copy_then_swap(source: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
        done = real_copytree(source, target, *args, **kwargs)
        if Path(source) == template:  # the whole copy, not one of its folders
            swapped = Path(target) / "pg_twophase"
            shutil.rmtree(swapped)
            os.symlink(folder, swapped)
        return done

    monkeypatch.setattr(shutil, "copytree", copy_then_swap)
    calls = chown_calls(monkeypatch)
    cluster = EmbeddedCluster(
        pg, account, tmp_path / "log", {**benchmark_defaults(4), **SMALL_SERVER}
    )
    try:
        with contextlib.suppress(TargetError):  # the old code's cluster did not start
            cluster.start()
        root = cluster.root
        assert root is not None
        assert_untouched(folder / "secret")
        assert cluster.initialised_by == "template", "the cluster is a copy of the template"
        assert cluster.is_alive()
        # The copy is the account's, made by it: root changed no owner inside the data
        # directory, followed no link to change one, and handed its folder over last.
        inside = [c for c in calls if c[1].startswith(str(cluster.data_dir))]
        assert not inside, inside[:5]
        assert not [c for c in calls if c[2]], calls
        assert calls and calls[-1][1] == str(root), calls
        owners = {p.lstat().st_uid for p in [cluster.data_dir, *cluster.data_dir.rglob("*")]}
        assert owners == {account.uid}
        copied = cluster.data_dir / "pg_stat_tmp" / "link"
        assert copied.is_symlink(), "a link in the template is copied as a link"
    finally:
        cluster.teardown()
    assert_untouched(folder / "secret")
