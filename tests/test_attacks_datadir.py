"""Issue 37, third round: what root reads from a data directory is the server's account's to
plant, and the run folders hold the server's text. Each attack a red team ran as root is run
again here the way it was run: `current_logfiles` naming a root-only file (root read it and
stored its ERROR line in the run) or a FIFO (`observe` hung); `postmaster.pid` naming a root
process (profiled), being a link (followed) or a FIFO (`profile` hung); a root-only script whose
text the server logged into a run folder anyone could read.

A data directory here is mostly a fake one: a folder of `nobody`'s with a PG_VERSION, things
planted in it, and, where a server must run, a copy of `sleep` named postgres running as
`nobody` in it (what /proc shows of a postmaster). The attacks on `observe`'s log reading run
against a real embedded cluster, its account planting in its own data directory.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest

from pgscope.collect.statistics.serverlog import open_named_log, open_stderr
from pgscope.errors import ExitCode, TargetError
from pgscope.files import NotReadable
from pgscope.target.embedded import EmbeddedCluster
from pgscope.target.local import LocalServer
from tests.cli import one_line_error, pgscope, start, wait_for_line

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the attacks are on what pgscope does as root"
)

NOBODY = pwd.getpwnam("nobody")
SECRET = b"ERROR:  root-secret-6f1d2a"


def within(seconds: float, call: Callable[[], object], unblock: Path | None = None) -> object:
    """`call()`'s result, or its exception, if it returns within `seconds`; a call still
    blocked then fails the test (after `unblock`, a FIFO, is opened for writing to free it)."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if unblock is not None:
            with contextlib.suppress(OSError):
                os.close(os.open(unblock, os.O_WRONLY | os.O_NONBLOCK))
        raise AssertionError(f"blocked for {seconds} s")
    return outcome[0]


@dataclass(frozen=True)
class Vault:
    """Root's 0600 files in a folder only root may enter: what the attacks aim at."""

    folder: Path

    def file(self, name: str, content: bytes) -> Path:
        path = self.folder / name
        path.write_bytes(content)
        path.chmod(0o600)
        return path


@pytest.fixture
def vault(tmp_path: Path) -> Vault:
    folder = tmp_path / "vault"
    folder.mkdir(mode=0o700)
    return Vault(folder)


@pytest.fixture
def place() -> Iterator[Path]:
    """A folder `nobody` may reach (the session's TMPDIR is; pytest's tmp_path is not)."""
    folder = Path(tempfile.mkdtemp(prefix="datadir-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def as_nobody(path: Path) -> Path:
    os.lchown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    return path


@pytest.fixture
def data_dir(place: Path) -> Path:
    """A data directory of nobody's: PG_VERSION, and nothing running yet."""
    folder = place / "data"
    folder.mkdir(mode=0o700)
    (folder / "PG_VERSION").write_text("15\n")
    as_nobody(folder / "PG_VERSION")
    return as_nobody(folder)


def pid_file(pid: int, data_dir: Path) -> str:
    """postmaster.pid as a postmaster writes it (pid, data dir, start, port, socket, ...)."""
    return f"{pid}\n{data_dir}\n1700000000\n5432\n/tmp\n127.0.0.1\n  5432001  1\nready   \n"


def plant_pid_file(data_dir: Path, text: str) -> Path:
    path = data_dir / "postmaster.pid"
    path.write_text(text)
    path.chmod(0o600)
    return as_nobody(path)


class FakePostmaster:
    """A process of nobody's, running a binary named `name` (a copy of sleep), in `cwd`."""

    def __init__(
        self, place: Path, cwd: Path, name: str = "postgres", stderr: int | None = None
    ) -> None:
        bindir = place / f"bin-{name}"
        bindir.mkdir(mode=0o755, exist_ok=True)
        binary = bindir / name
        if not binary.exists():
            shutil.copy(shutil.which("sleep") or "/bin/sleep", binary)
            binary.chmod(0o755)
        # argv[0] is not the binary's name: the suite refuses to start programs named
        # postgres outside `server` tests, and this is none.
        self.proc = subprocess.Popen(
            ["fake-postmaster", "600"],
            executable=binary,
            cwd=cwd,
            user=NOBODY.pw_uid,
            group=NOBODY.pw_gid,
            extra_groups=[],
            stderr=stderr,
        )
        self.pid = self.proc.pid

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def fakes() -> Iterator[list[FakePostmaster]]:
    started: list[FakePostmaster] = []
    yield started
    for fake in started:
        fake.stop()


@pytest.fixture
def root_child() -> Iterator[int]:
    """A process of root's, the test's own child."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc.pid
    proc.kill()
    proc.wait()


def refused(args: list[str], results: Path, *words: str) -> str:
    """`pgscope ARGS` ends at once (no hang) with exit 5 and one line saying `words`, and
    leaves no run folder."""
    result = pgscope(*args, "--results-dir", str(results), timeout=60)
    line = one_line_error(result)
    assert result.returncode == ExitCode.TARGET, result.stderr
    for word in words:
        assert word in line, line
    assert not results.exists() or not any(results.iterdir()), "a run folder was made"
    return line


# -- postmaster.pid ------------------------------------------------------------------------


@pytest.mark.parametrize("whose", ["init", "root child"])
@pytest.mark.parametrize("command", ["profile", "observe"])
def test_a_postmaster_pid_naming_a_root_process_is_not_taken_for_the_server(
    data_dir: Path, tmp_path: Path, root_child: int, whose: str, command: str
) -> None:
    pid = 1 if whose == "init" else root_child
    plant_pid_file(data_dir, pid_file(pid, data_dir))
    args = [command, "--data-dir", str(data_dir), "--duration", "1"]
    line = refused(args, tmp_path / "results", f"postmaster.pid names PID {pid}", "of root")
    assert "not taken for its server" in line


@pytest.mark.parametrize("command", ["profile", "observe"])
def test_a_postmaster_pid_that_is_a_link_is_not_followed(
    data_dir: Path, tmp_path: Path, vault: Vault, command: str
) -> None:
    target = vault.file("pid", pid_file(1, data_dir).encode())
    (data_dir / "postmaster.pid").symlink_to(target)
    as_nobody(data_dir / "postmaster.pid")
    args = [command, "--data-dir", str(data_dir), "--duration", "1"]
    refused(args, tmp_path / "results", "postmaster.pid not read", "symbolic link")


@pytest.mark.parametrize("command", ["profile", "observe"])
def test_a_postmaster_pid_that_is_a_fifo_is_refused_without_a_hang(
    data_dir: Path, tmp_path: Path, command: str
) -> None:
    os.mkfifo(data_dir / "postmaster.pid", 0o600)
    as_nobody(data_dir / "postmaster.pid")
    args = [command, "--data-dir", str(data_dir), "--duration", "1"]
    refused(args, tmp_path / "results", "postmaster.pid not read", "a FIFO")


def test_a_postmaster_pid_of_another_owner_is_not_read(data_dir: Path) -> None:
    path = plant_pid_file(data_dir, pid_file(1, data_dir))
    os.chown(path, 0, 0)  # root's, in nobody's folder: not the server's
    with pytest.raises(
        TargetError, match=r"postmaster\.pid not read: owned by root, not by nobody"
    ):
        LocalServer.from_data_dir(data_dir)


def test_a_pid_is_the_server_only_as_the_owners_postgres_in_its_data_directory(
    data_dir: Path, place: Path, fakes: list[FakePostmaster]
) -> None:
    # The control: a postgres binary of nobody's, working in the data directory, is taken.
    postmaster = FakePostmaster(place, data_dir)
    fakes.append(postmaster)
    plant_pid_file(data_dir, pid_file(postmaster.pid, data_dir))
    found = LocalServer.from_data_dir(data_dir)
    assert (found.pid, found.owner, found.port) == (postmaster.pid, NOBODY.pw_uid, 5432)
    # Its working directory elsewhere: another folder's process.
    elsewhere = FakePostmaster(place, place)
    fakes.append(elsewhere)
    plant_pid_file(data_dir, pid_file(elsewhere.pid, data_dir))
    with pytest.raises(TargetError, match="working directory is not this data directory"):
        LocalServer.from_data_dir(data_dir)
    # Another binary, in the data directory.
    other = FakePostmaster(place, data_dir, name="sleeper")
    fakes.append(other)
    plant_pid_file(data_dir, pid_file(other.pid, data_dir))
    with pytest.raises(TargetError, match="sleeper, not a postgres binary"):
        LocalServer.from_data_dir(data_dir)


def test_a_data_directory_of_roots_is_no_servers(data_dir: Path, root_child: int) -> None:
    os.chown(data_dir, 0, 0)
    plant_pid_file(data_dir, pid_file(root_child, data_dir))
    with pytest.raises(TargetError, match="owned by root"):
        LocalServer.from_data_dir(data_dir)


def test_profile_by_pid_reads_no_fifo_in_its_working_directory(
    data_dir: Path, place: Path, tmp_path: Path, fakes: list[FakePostmaster]
) -> None:
    postmaster = FakePostmaster(place, data_dir)
    fakes.append(postmaster)
    os.mkfifo(data_dir / "postmaster.pid", 0o600)
    as_nobody(data_dir / "postmaster.pid")
    result = pgscope(
        *("profile", "--pid", str(postmaster.pid), "--duration", "1"),
        *("--results-dir", str(tmp_path / "results")),
        timeout=60,
    )
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert "not a running PostgreSQL server process" in one_line_error(result)


# -- the server's log, as named (current_logfiles) or as its standard error ---------------------


def test_a_log_named_outside_the_data_directory_is_read_only_if_the_servers(
    data_dir: Path, place: Path, vault: Vault
) -> None:
    secret = vault.file("auth.log", SECRET + b"\n")
    with pytest.raises(NotReadable, match="owned by root, not by nobody"):
        open_named_log(data_dir, str(secret), NOBODY.pw_uid)
    # The server's own log directory, elsewhere (an absolute log_directory): read.
    logs = place / "logs"
    logs.mkdir()
    as_nobody(logs)
    log = logs / "postgresql.log"
    log.write_bytes(b"LOG:  ready\n")
    as_nobody(log)
    where, fd = open_named_log(data_dir, str(log), NOBODY.pw_uid)
    with os.fdopen(fd, "rb") as read:
        assert (where, read.read()) == (str(log), b"LOG:  ready\n")
    # Its name a link to root's file: not followed.
    link = logs / "current.log"
    link.symlink_to(secret)
    with pytest.raises(NotReadable, match="symbolic link"):
        open_named_log(data_dir, str(link), NOBODY.pw_uid)


@pytest.mark.parametrize("named", ["log/../../vault/auth.log", "log/linked/auth.log", "log/fifo"])
def test_a_log_named_in_the_data_directory_is_read_beneath_it(
    data_dir: Path, vault: Vault, named: str
) -> None:
    vault.file("auth.log", SECRET + b"\n")
    moved = shutil.move(vault.folder, data_dir.parent / "vault")  # where `..` climbs to
    log = data_dir / "log"
    log.mkdir()
    as_nobody(log)
    (log / "linked").symlink_to(moved)
    os.mkfifo(log / "fifo", 0o600)
    as_nobody(log / "fifo")
    outcome = within(10, lambda: open_named_log(data_dir, named, NOBODY.pw_uid), log / "fifo")
    assert isinstance(outcome, NotReadable), outcome


def test_a_log_named_as_a_fifo_outside_is_never_opened(data_dir: Path, place: Path) -> None:
    fifo = place / "fifo"
    os.mkfifo(fifo, 0o600)
    as_nobody(fifo)
    outcome = within(10, lambda: open_named_log(data_dir, str(fifo), NOBODY.pw_uid), fifo)
    assert isinstance(outcome, NotReadable) and "a FIFO" in str(outcome), outcome


def test_a_standard_error_is_read_only_as_a_file_the_server_writes(
    data_dir: Path, place: Path, vault: Vault, fakes: list[FakePostmaster]
) -> None:
    secret = vault.file("auth.log", SECRET + b"\n")

    def postmaster_with(stderr: int) -> int:
        fakes.append(FakePostmaster(place, data_dir, stderr=stderr))
        return fakes[-1].pid

    # A root-only file handed to it for reading: no log of its.
    with secret.open("rb") as reading:
        pid = postmaster_with(reading.fileno())
    with pytest.raises(NotReadable, match="not open for writing"):
        open_stderr(pid, NOBODY.pw_uid)
    # A pipe: never opened.
    pipe_r, pipe_w = os.pipe()
    pid = postmaster_with(pipe_w)
    os.close(pipe_w)
    outcome = within(10, lambda: open_stderr(pid, NOBODY.pw_uid))
    os.close(pipe_r)
    assert isinstance(outcome, NotReadable) and "a FIFO" in str(outcome), outcome
    # The log root started it with (pgscope's own clusters): read.
    log = vault.file("server.log", b"LOG:  ready\n")
    with log.open("ab") as writing:
        pid = postmaster_with(writing.fileno())
    where, fd = open_stderr(pid, NOBODY.pw_uid)
    os.close(fd)
    assert where == str(log)
    # The same, by a process of another account than the server's: not read.
    with pytest.raises(NotReadable, match="not the server's account's"):
        open_stderr(pid, NOBODY.pw_uid + 1)


def _plant_current_logfiles(cluster: EmbeddedCluster, text: str) -> None:
    """As the server's account would: current_logfiles is what pg_current_logfile() says."""
    path = cluster.data_dir / "current_logfiles"
    path.write_text(text)
    os.chown(path, cluster.run_as.uid, cluster.run_as.gid)


@pytest.mark.server
def test_observe_reads_no_root_file_that_current_logfiles_names(
    cluster: EmbeddedCluster, tmp_path: Path, vault: Vault
) -> None:
    secret = vault.file("auth.log", b"LOG:  nothing yet\n")
    _plant_current_logfiles(cluster, f"stderr {secret}\n")
    results = tmp_path / "results"
    proc = start(
        [
            *("observe", "--data-dir", str(cluster.data_dir)),
            *("--duration", "4", "--window", "2", "--results-dir", str(results)),
        ]
    )
    seen = wait_for_line(proc, r"serverlog: counting the errors in")
    with secret.open("ab") as log:  # a root daemon logs on: what root would now read
        log.write(SECRET + b" in a root-only log\n")
    _, err = proc.communicate(timeout=120)
    text = "".join(seen) + err
    assert proc.returncode == 0, text
    assert f"counting the errors in {secret}" not in text, text
    assert f"{secret} (the log current_logfiles names) is not read: owned by root" in text, text
    (run_dir,) = results.iterdir()
    with contextlib.closing(duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)) as db:
        examples = db.execute("SELECT example FROM server_errors").fetchall()
        events = db.execute("SELECT string_agg(detail, ' ') FROM events").fetchone()
    assert not any("root-secret" in str(row[0]) for row in examples), examples
    assert str(secret) not in str(events), events


@pytest.mark.server
def test_observe_does_not_hang_on_a_fifo_that_current_logfiles_names(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    logs = cluster.data_dir / "log"
    logs.mkdir()
    os.chown(logs, cluster.run_as.uid, cluster.run_as.gid)
    os.mkfifo(logs / "postgresql.log", 0o600)
    os.chown(logs / "postgresql.log", cluster.run_as.uid, cluster.run_as.gid)
    _plant_current_logfiles(cluster, "stderr log/postgresql.log\n")
    result = pgscope(
        *("observe", "--data-dir", str(cluster.data_dir), "--duration", "2", "--window", "2"),
        *("--results-dir", str(tmp_path / "results")),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "log/postgresql.log (the log current_logfiles names) is not read: a FIFO" in (
        result.stderr
    ), result.stderr[-3000:]


# -- run folders are their owner's alone ------------------------------------------------------


@pytest.mark.server
def test_a_run_folder_holding_the_servers_text_is_private(place: Path, vault: Vault) -> None:
    # A script of root's alone: the server complains about its text in its log.
    script = vault.file("private.sql", b"SELECT root_secret_column_6f1d2a FROM nowhere_6f1d2a;\n")
    results = place / "results"
    results.mkdir(mode=0o755)
    pgscope(
        *("run", "--script", str(script), "--scale", "0", "--clients", "1"),
        *("--repeats", "1", "--duration", "1", "--warmup", "0", "--no-collectors"),
        *("--results-dir", str(results)),
    )
    (run_dir,) = results.iterdir()
    log = run_dir / "server.log"
    assert b"root_secret_column_6f1d2a" in log.read_bytes(), "the attack's premise changed"
    found = os.lstat(run_dir)
    assert (found.st_uid, stat.S_IMODE(found.st_mode)) == (0, 0o700), oct(found.st_mode)
    assert stat.S_IMODE(os.lstat(run_dir / "run.duckdb").st_mode) == 0o600
    # Another account, which may enter the results folder, reads nothing of it.
    for path in (log, run_dir / "run.duckdb"):
        read = subprocess.run(
            ["cat", str(path)], user=NOBODY.pw_uid, group=NOBODY.pw_gid, extra_groups=[],
            capture_output=True,
        )  # fmt: skip
        assert read.returncode != 0 and b"root_secret" not in read.stdout, path
    listed = subprocess.run(
        ["ls", str(run_dir)], user=NOBODY.pw_uid, group=NOBODY.pw_gid, extra_groups=[],
        capture_output=True,
    )  # fmt: skip
    assert listed.returncode != 0, listed.stdout
