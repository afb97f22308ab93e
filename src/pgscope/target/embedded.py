"""Embedded target: a throw-away PostgreSQL cluster that pgscope owns from initdb to teardown.

The cluster lives in a fresh temporary directory (data directory and unix socket side by side),
runs as an unprivileged account when pgscope runs as root, and is always torn down: fast
shutdown, then immediate, then SIGKILL of its process group, then the directory is removed.
Variant settings go through ALTER SYSTEM, followed by a reload or a restart according to each
setting's `pg_settings.context`.

It admits only its owner: it listens on no TCP address at all, only on a unix socket (mode
0700) in a folder inside the cluster's own 0700 directory, which belongs to the server's
account; pgscope (root, or that account) and the load's programs (that account) reach it
there. Where it listens is given on the postmaster's command line, which outranks
postgresql.conf and ALTER SYSTEM alike, and pg_hba.conf rejects every TCP connection besides.
A spec cannot name these settings (spec.RESERVED_SETTINGS).

Every cluster gets its own data directory, copied from an initdb template: initdb runs once
per process (or once per directory named by PGSCOPE_INITDB_TEMPLATES, which a test session
sets so that its many clusters share one initdb), keyed by what decides initdb's output. A
template is never started; where it cannot be made or copied, the cluster runs initdb itself.
The template and its copies are the server's account's, and the copy is made by that account
(`cp` run as it): root never walks, copies into or changes the owner of anything in a tree
that account can write, where a swapped folder would lead it elsewhere.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgscope.errors import EnvironmentProblem, SpecError, TargetError
from pgscope.files import open_beneath, open_for_writing, remove_tree
from pgscope.host import memory_bytes
from pgscope.leftovers import claim
from pgscope.proc import RunAs, child_pids, kill_tree, spawn, wait_until
from pgscope.proc import run_as_user as run_child
from pgscope.target.conn import ConnParams
from pgscope.target.pgbin import PgBinaries

SUPERUSER = "postgres"
_LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d \S+ \S+ \[\d+\] ")  # our log_line_prefix
START_TIMEOUT_S = 60.0
# Recovery that PANICs this many times since the start will not get better by waiting.
CRASH_LOOP_PANICS = 3
STOP_GRACE_S = 30.0
# --no-sync: a throw-away cluster needs no durable initdb; it saves seconds per run.
INITDB_OPTIONS = (
    "-U",
    SUPERUSER,
    "--auth-local=trust",  # the socket only its owner reaches (see the module's docstring)
    "--auth-host=reject",  # no TCP connection is ever admitted, even if one were listened for
    "-E",
    "UTF8",
    "--locale=C",
    "--no-sync",
    "--no-instructions",
)
TEMPLATES_ENV = "PGSCOPE_INITDB_TEMPLATES"  # a directory of initdb templates to share
# Set (to the reason) by a test session that must start no server: starting one then fails.
NO_SERVER_ENV = "PGSCOPE_NO_SERVER"


class ServerForbidden(RuntimeError):
    """A cluster was about to start where PGSCOPE_NO_SERVER forbids it (a mis-marked test).
    Not a PgscopeError on purpose: it must not look like any error a test expects."""


def benchmark_defaults(max_clients: int) -> dict[str, str]:
    """Startup settings for a benchmark cluster. Every one is overridable by the spec.

    - shared_buffers: 25% of RAM (PostgreSQL's own guidance), at most 8 GB;
    - max_connections: room for the largest step plus pgscope's own sessions;
    - max_wal_size / checkpoint_timeout: large, so checkpoints come from the experiment
      (a recipe or a CHECKPOINT) rather than from WAL volume in the middle of a step;
    - compute_query_id: wait samples and statements can be joined on query_id;
    - track_io_timing, log_checkpoints: evidence at negligible cost.
    """
    shared_mb = max(128, min(8192, memory_bytes() // 4 // (1 << 20)))
    return {
        "shared_buffers": f"{shared_mb}MB",
        "max_connections": str(max(100, 2 * max_clients + 20)),
        "max_wal_size": "8GB",
        "checkpoint_timeout": "30min",
        "compute_query_id": "on",
        "track_io_timing": "on",
        "log_checkpoints": "on",
        # %Q: the query id of the session's top-level statement (plan capture names by it).
        "log_line_prefix": "%m [%p] %q%u@%d %Q ",
    }


def free_port() -> int:
    """A port number no one listens on: it names the cluster's socket file (.s.PGSQL.PORT);
    the cluster itself listens on no TCP port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _quote_conf(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


@dataclass
class EmbeddedCluster:
    """A throw-away cluster. Use as a context manager, or call start() and teardown()."""

    pg: PgBinaries
    run_as: RunAs
    log_path: Path
    startup_settings: dict[str, str] = field(default_factory=dict)
    work_dir: Path | None = None  # parent of the temporary directory (default: $TMPDIR)
    port: int = 0
    root: Path | None = None
    # A standby is an embedded cluster whose data directory is a base backup of a primary.
    primary: EmbeddedCluster | None = None
    standby_name: str = ""
    initialised_by: str = ""  # "template" (a copy of one) or "initdb", once started
    _proc: subprocess.Popen[Any] | None = None
    _applied: dict[str, str] = field(default_factory=dict)
    _log_file: Any = None
    _launched_at: int = 0  # the server log's size when the postmaster was last started

    # -- paths ----------------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        assert self.root is not None, "cluster not initialised"
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        assert self.root is not None, "cluster not initialised"
        return self.root / "socket"

    @property
    def conn(self) -> ConnParams:
        return ConnParams(
            {
                "host": str(self.socket_dir),
                "port": str(self.port),
                "user": SUPERUSER,
                "dbname": "postgres",
            }
        )

    @property
    def postmaster_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> EmbeddedCluster:
        try:
            self.start()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def start(self) -> None:
        forbidden = os.environ.get(NO_SERVER_ENV)
        if forbidden:
            raise ServerForbidden(f"{NO_SERVER_ENV} is set, no PostgreSQL may start: {forbidden}")
        self._create_root()
        if self.primary is None:
            if not self._copy_template():
                self._initdb()
        else:
            self._base_backup(self.primary)
        self._write_config()
        self._launch()

    def sibling(self, log_path: Path) -> EmbeddedCluster:
        """Another cluster like this one (not started): same binaries, account, settings."""
        return EmbeddedCluster(
            self.pg, self.run_as, log_path, dict(self.startup_settings), self.work_dir
        )

    def resume(self, attempts: int = 10) -> None:
        """Start a stopped (or crashed) cluster again on its data directory. After a crash the
        dead postmaster's backends may hold its shared memory for a moment, and the new
        postmaster refuses to start until they are gone: retry for a few seconds."""
        for attempt in range(attempts):
            if self.is_alive():
                return
            try:
                self._launch()
                return
            except TargetError:
                if attempt == attempts - 1:
                    raise
                time.sleep(1.0)

    @classmethod
    def standby_of(cls, primary: EmbeddedCluster, name: str) -> EmbeddedCluster:
        """A streaming standby of `primary` (not started), with its own slot and log."""
        log = primary.log_path.with_name(f"standby-{name}.log")
        return cls(
            primary.pg,
            primary.run_as,
            log,
            dict(primary.startup_settings),
            primary.work_dir,
            primary=primary,
            standby_name=name,
        )

    def _base_backup(self, primary: EmbeddedCluster) -> None:
        """pg_basebackup through a physical slot named after the standby. Not -R: it would
        write primary_conninfo to postgresql.auto.conf, where it overrides pgscope's own."""
        with primary.connect() as conn:
            conn.execute("SELECT pg_create_physical_replication_slot(%s)", (self.standby_name,))
        argv: list[str | os.PathLike[str]] = [
            self.pg.path("pg_basebackup"),
            "-D",
            self.data_dir,
            "-h",
            str(primary.socket_dir),
            "-p",
            str(primary.port),
            "-U",
            SUPERUSER,
            "--slot",
            self.standby_name,
            "--checkpoint=fast",
            "--wal-method=stream",
            "--no-sync",
        ]
        result = run_child(argv, run_as=self.run_as, timeout=600, cwd=self.root)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise TargetError(f"pg_basebackup for standby {self.standby_name} failed: {last}")
        # The data directory is the account's: a link in it is never followed as root, and
        # the file is a new one root made (a name already there is not opened).
        signal_fd = self._open_in_data(
            "standby.signal", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600
        )
        try:
            if self.run_as.switches_user:
                os.fchown(signal_fd, self.run_as.uid, self.run_as.gid)
        finally:
            os.close(signal_fd)

    def _open_in_data(self, name: str, flags: int, mode: int = 0o666) -> int:
        """A file of the data directory opened as root without following a link on the way:
        the directory and all in it are the server's account's (files.open_beneath)."""
        assert self.root is not None
        return open_beneath(self.root.parent, self.data_dir / name, flags, mode)

    def _create_root(self) -> None:
        parent = self.work_dir or Path(tempfile.gettempdir())
        try:
            self.root = Path(tempfile.mkdtemp(prefix="pgscope-", dir=parent))
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot create a cluster directory in {parent}: {exc.strerror}"
            ) from None
        claim(self.root)
        os.mkdir(self.root / "socket", 0o700)
        # Inner first: once the cluster's folder is the account's, the account could swap
        # `socket` for a link, which a chown of it would then follow. Neither follows one.
        if self.run_as.switches_user:
            for path in (self.root / "socket", self.root):
                os.chown(path, self.run_as.uid, self.run_as.gid, follow_symlinks=False)

    def _initdb(self) -> None:
        _run_initdb(self.pg, self.run_as, self.data_dir)
        self.initialised_by = "initdb"

    def _copy_template(self) -> bool:
        """The data directory as a copy of this process's (or session's) initdb template.
        False when there is none and none can be made, or the copy fails: then initdb."""
        template = _template(self.pg, self.run_as, self.work_dir or Path(tempfile.gettempdir()))
        if template is None:
            return False
        if not _copy_tree(template, self.data_dir, self.run_as):
            return False
        self.initialised_by = "template"
        return True

    def listener_settings(self) -> dict[str, str]:
        """Where the cluster listens and who may connect: pgscope's alone, given on the
        postmaster's command line, which no configuration file nor ALTER SYSTEM outranks.
        No TCP address; the socket in the cluster's private folder, for its owner only."""
        return {
            "listen_addresses": "",
            "port": str(self.port),
            "unix_socket_directories": str(self.socket_dir),
            "unix_socket_group": "",
            "unix_socket_permissions": "0700",
        }

    def _write_config(self) -> None:
        self.port = free_port()
        fixed = {"logging_collector": "off"}  # stderr goes to the run's server.log
        if self.primary is not None:
            fixed["primary_conninfo"] = (
                f"host={self.primary.socket_dir} port={self.primary.port} user={SUPERUSER} "
                f"application_name={self.standby_name}"
            )
            fixed["primary_slot_name"] = self.standby_name
            fixed["hot_standby"] = "on"
            # Reconnect quickly after the primary restarts between variants: synchronous
            # commits wait while no standby is connected (the default retry is 5 s).
            fixed["wal_retrieve_retry_interval"] = "200ms"
        lines = ["", "# --- written by pgscope ---"]
        for name, value in {**fixed, **self.startup_settings}.items():
            lines.append(f"{name} = {_quote_conf(value)}")
        conf_fd = self._open_in_data("postgresql.conf", os.O_WRONLY | os.O_APPEND)
        with os.fdopen(conf_fd, "a") as conf:
            self._check_accounts_file(conf_fd, "postgresql.conf")
            conf.write("\n".join(lines) + "\n")

    def _check_accounts_file(self, fd: int, name: str) -> None:
        """Root writes into a file of the data directory only when it is a regular file of
        the server's account with one name: not a hard link to a file of someone else's."""
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != self.run_as.uid or info.st_nlink != 1:
            raise TargetError(
                f"{self.data_dir / name} is not a regular file of {self.run_as.name} with "
                f"one name; the cluster is not started"
            )

    def _launch(self) -> None:
        if self._log_file is None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            # The server's text, the user's alone (0600) from the moment it exists; a link
            # planted in its place is not followed.
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
            self._log_file = os.fdopen(os.open(self.log_path, flags, 0o600), "ab")
        self._launched_at = self.log_path.stat().st_size
        # SIGINT on parent death = fast shutdown: a killed pgscope still stops its server.
        options = [f"--{name}={value}" for name, value in self.listener_settings().items()]
        self._proc = spawn(
            [self.pg.path("postgres"), "-D", self.data_dir, *options],
            run_as=self.run_as,
            cwd=self.root,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            death_signal=signal.SIGINT,
        )
        if not wait_until(self._ready_or_dead, START_TIMEOUT_S, 0.05):
            raise TargetError(
                f"PostgreSQL did not start within {START_TIMEOUT_S:.0f}s; see {self.log_path}"
            )
        if self._proc.poll() is not None or self._crash_looping():
            raise TargetError(
                f"PostgreSQL failed to start: {self.complaint()} (full log: {self.log_path})"
            )

    def _panics(self) -> int:
        """PANICs in the server log since the postmaster was last started."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._launched_at)
                return log.read().count(b"PANIC:")
        except OSError:
            return 0

    def _crash_looping(self) -> bool:
        """The postmaster lives, but its recovery PANICs again and again (a full disk, a
        file it cannot replace): it would never be ready."""
        return self._panics() >= CRASH_LOOP_PANICS

    def _ready_or_dead(self) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None or self._crash_looping():
            return True
        try:
            pid_fd = self._open_in_data("postmaster.pid", os.O_RDONLY | os.O_NONBLOCK)
            with os.fdopen(pid_fd, "rb") as pid_file:
                lines = pid_file.read(4096).decode(errors="replace").splitlines()
        except OSError:
            return False
        # Line 8 of postmaster.pid is the postmaster's status: "ready" once it accepts
        # connections, "standby" for a hot standby that does. Line 1 is its pid: after a crash
        # the dead postmaster's file still says "ready" until the new one replaces it.
        return (
            len(lines) >= 8
            and lines[0].strip() == str(self._proc.pid)
            and lines[7].strip() in ("ready", "standby")
        )

    def complaint(self) -> str:
        """The server's own words for why it stopped: its last PANIC, else the first complaint
        (e.g. the bad setting) and the final FATAL, without their timestamp prefixes."""
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no server log"
        markers = (
            "FATAL",
            "ERROR",
            "PANIC",
            "invalid value for parameter",
            "unrecognized configuration parameter",
            "could not",
        )
        important = [_LOG_PREFIX.sub("", ln) for ln in lines if any(m in ln for m in markers)]
        panics = [ln for ln in important if "PANIC" in ln]
        if panics:  # a crash: its cause, not a session's complaint before it
            return panics[-1]
        if not important:
            return _LOG_PREFIX.sub("", lines[-1]) if lines else "no server log"
        first, last = important[0], important[-1]
        return first if first == last else f"{first} / {last}"

    def exit_reason(self) -> str:
        """Why the server is not running: its exit status and its log's last complaint."""
        if self._proc is None:
            return "stopped by pgscope"
        code = self._proc.poll()
        if code is None:
            return "running"
        how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return f"{how}; {self.complaint()}"

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """Fast shutdown (SIGINT), escalating to immediate (SIGQUIT) and SIGKILL."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        if proc.poll() is None:
            # A server that PANICked may be recovering in a loop, which waits out a fast
            # shutdown's grace: it gets an immediate one (its WAL is replayed at next start).
            proc.send_signal(signal.SIGQUIT if self._panics() else signal.SIGINT)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGQUIT)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    kill_tree(proc.pid)
                    proc.wait(timeout=5)

    def pin(self, cpus: set[int] | None) -> None:
        """Run the server on `cpus` (None: every CPU pgscope may use): the postmaster and its
        current children; processes it starts later inherit the postmaster's affinity."""
        pid = self.postmaster_pid
        if pid is None:
            return
        target = cpus or os.sched_getaffinity(0)
        for victim in [pid, *child_pids(pid)]:
            with contextlib.suppress(ProcessLookupError):  # a backend that just exited
                os.sched_setaffinity(victim, target)

    def wait_streaming(self, names: list[str], timeout_s: float = 60.0) -> None:
        """Wait until every named standby streams from this primary."""

        def streaming() -> bool:
            with self.connect() as conn:
                rows = conn.execute(
                    "SELECT application_name FROM pg_stat_replication WHERE state = 'streaming'"
                ).fetchall()
            return set(names) <= {r[0] for r in rows}

        if not wait_until(streaming, timeout_s, 0.1):
            raise TargetError(
                f"standbys {', '.join(names)} did not start streaming within "
                f"{timeout_s:.0f}s; see the standby-*.log files"
            )

    def restart(self) -> None:
        self.stop()
        self._launch()

    def teardown(self) -> None:
        """Stop the server and remove its directory. Safe to call more than once."""
        try:
            self.stop()
        finally:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
            if self.root is not None and self.root.exists():
                remove_tree(self.root)
            self.root = None

    # -- settings ---------------------------------------------------------------------------

    def connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        return self.conn.connect()

    def validate_settings(self, settings: dict[str, str], where: str) -> None:
        """Check names and values with ALTER SYSTEM (the server's own parser), then undo."""
        with self.connect() as conn:
            try:
                for name, value in settings.items():
                    try:
                        conn.execute(_alter_system(name, value))
                    except psycopg.Error as exc:
                        reason = exc.diag.message_primary or str(exc)
                        raise SpecError(f"{where}: setting {name} = {value!r}: {reason}") from None
            finally:
                conn.execute("ALTER SYSTEM RESET ALL")

    def apply_settings(self, settings: dict[str, str]) -> bool:
        """Make exactly `settings` (on top of the startup ones) effective.

        Returns True when a restart was needed (a changed setting has context 'postmaster').
        """
        if settings == self._applied:
            return False
        changed = {
            n
            for n in settings.keys() | self._applied.keys()
            if settings.get(n) != self._applied.get(n)
        }
        with self.connect() as conn:
            conn.execute("ALTER SYSTEM RESET ALL")
            for name, value in settings.items():
                conn.execute(_alter_system(name, value))
            rows = conn.execute(
                "SELECT name FROM pg_settings WHERE name = ANY(%s) AND context = 'postmaster'",
                (sorted(changed),),
            ).fetchall()
            needs_restart = bool(rows)
            if not needs_restart:
                before = conn.execute("SELECT pg_conf_load_time()").fetchone()
                conn.execute("SELECT pg_reload_conf()")
        if needs_restart:
            self.restart()
        else:
            self._wait_reloaded(before[0] if before else None)
        self._applied = dict(settings)
        return needs_restart

    def _wait_reloaded(self, before: object) -> None:
        # pg_reload_conf() only signals the postmaster; a new session sees the new load time
        # once the postmaster has re-read the files, and inherits the new values from it.
        def reloaded() -> bool:
            with self.connect() as conn:
                row = conn.execute("SELECT pg_conf_load_time()").fetchone()
            return row is not None and row[0] != before

        if not wait_until(reloaded, 10.0, 0.02):
            raise TargetError("the server did not reload its configuration within 10s")


# -- initdb templates ------------------------------------------------------------------------


def _run_initdb(pg: PgBinaries, run_as: RunAs, data_dir: Path) -> None:
    argv: list[str | os.PathLike[str]] = [pg.path("initdb"), "-D", data_dir, *INITDB_OPTIONS]
    result = run_child(argv, run_as=run_as, timeout=300, cwd=data_dir.parent)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise EnvironmentProblem(f"initdb as {run_as.name} in {data_dir} failed: {last}")


_keys: dict[tuple[PgBinaries, int, int, str | None], str] = {}


def template_key(pg: PgBinaries, run_as: RunAs) -> str:
    """What decides initdb's output: the binaries (their version, and the files themselves,
    so that an upgrade in place is a new key), initdb's options, the owning account, and the
    time zone initdb writes into postgresql.conf."""
    memo = (pg, run_as.uid, run_as.gid, os.environ.get("TZ"))
    if memo not in _keys:
        _keys[memo] = _compute_key(pg, run_as)
    return _keys[memo]


def _compute_key(pg: PgBinaries, run_as: RunAs) -> str:
    files = []
    for name in ("initdb", "postgres"):
        st = pg.path(name).stat()
        files.append([str(pg.path(name)), st.st_size, st.st_mtime_ns])
    identity = [pg.version(), files, INITDB_OPTIONS, run_as.uid, run_as.gid, os.environ.get("TZ")]
    digest = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]
    return f"initdb-{digest}"


_templates: dict[str, Path] = {}  # key -> template data directory, made by this process
_process_base: Path | None = None  # where this process keeps its templates


def _template(pg: PgBinaries, run_as: RunAs, parent: Path) -> Path | None:
    """The template data directory for these binaries and account, made if need be: in
    PGSCOPE_INITDB_TEMPLATES when set, else in a directory of this process's own, removed
    when it exits. None when it cannot be made (the caller then runs initdb itself)."""
    try:
        key = template_key(pg, run_as)
        if key in _templates and (_templates[key] / "PG_VERSION").is_file():
            return _templates[key]
        shared = os.environ.get(TEMPLATES_ENV)
        base = Path(shared) if shared else _own_base(parent)
        made = _make_template(pg, run_as, base, key)
    except (OSError, EnvironmentProblem):
        return None
    _templates[key] = made
    return made


def _own_base(parent: Path) -> Path:
    global _process_base
    if _process_base is None or not _process_base.is_dir():
        _process_base = Path(tempfile.mkdtemp(prefix="pgscope-template-", dir=parent))
        claim(_process_base)
        # Root's: initdb, as the account, writes only in a folder of its own inside (the
        # account could otherwise swap that folder, or the lock, for a link root then
        # followed), and reaches it through this one.
        _process_base.chmod(0o711)
        atexit.register(shutil.rmtree, _process_base, True)
    return _process_base


def _make_template(pg: PgBinaries, run_as: RunAs, base: Path, key: str) -> Path:
    """base/KEY/data, made once: under a lock (other processes may share `base`), initdb into
    a scratch directory renamed into place only when complete. Only a template owned by the
    account is used: its copies must be the account's."""
    done = base / key / "data"
    if not (done / "PG_VERSION").is_file():
        base.mkdir(parents=True, exist_ok=True)
        with open_for_writing(base / f"{key}.lock", "ab") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (done / "PG_VERSION").is_file():
                scratch = Path(tempfile.mkdtemp(prefix=f"{key}.", suffix=".part", dir=base))
                try:
                    run_as.chown(scratch)
                    _run_initdb(pg, run_as, scratch / "data")
                    scratch.chmod(0o755)  # the account, or root, reads it to copy
                    scratch.rename(base / key)
                except BaseException:
                    shutil.rmtree(scratch, ignore_errors=True)
                    raise
    if done.stat().st_uid != run_as.uid:
        raise PermissionError(f"template {done} is not owned by {run_as.name}")
    return done


def _copy_tree(source: Path, target: Path, run_as: RunAs) -> bool:
    """Copy a data directory (with its modes: PostgreSQL insists on 0700 or 0750; links as
    links) into `target`, a new folder, as the account that owns both: the template is that
    account's, and so is the folder the copy goes in, so it could swap any folder of either for
    a link between two steps of a copy made by root (root's walk that gave the copy its owners
    once followed such a link and gave a root file to the account). Made by the account, the
    copy needs no change of owner, and a link followed is followed with the account's rights.
    False when the copy fails (what was copied is removed)."""
    argv: list[str | os.PathLike[str]] = ["cp", "-a", "--no-target-directory", "--", source, target]
    try:
        result = run_child(argv, run_as=run_as, timeout=300, cwd=target.parent)
    except (OSError, EnvironmentProblem, subprocess.TimeoutExpired):
        result = None
    if result is not None and result.returncode == 0:
        return True
    remove_tree(target)
    return False


def _alter_system(name: str, value: str) -> sql.Composed:
    # Extension settings are dotted (pg_wait_sampling.history_period): quote each part.
    ident = sql.SQL(".").join(sql.Identifier(part) for part in name.lower().split("."))
    return sql.SQL("ALTER SYSTEM SET {} = {}").format(ident, sql.Literal(value))


def wait_for_exit(pid: int, timeout_s: float) -> bool:
    """For tests and teardown checks: has process `pid` gone?"""

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    return wait_until(gone, timeout_s, 0.05)
