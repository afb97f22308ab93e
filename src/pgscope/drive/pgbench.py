"""pgbench as the load driver: initialisation, one timed run per step, and its outputs.

One run of pgbench gives three things, all parsed here and nowhere else:
- per-second progress (`-P 1 --progress-timestamp`, on stderr), handed to a callback as each
  line arrives, so the timeline is stored live;
- the end-of-run summary (stdout);
- per-transaction logs (`-l`), from which latency percentiles are computed exactly (pgbench's
  own summary only has mean and stddev). Warm-up seconds are trimmed there.
"""

from __future__ import annotations

import math
import os
import re
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import duckdb
import psycopg

from pgscope.drive.loaduser import LoadUser
from pgscope.drive.readonly import guarded
from pgscope.duck import connect
from pgscope.errors import RefusedError, TargetError
from pgscope.files import open_for_writing
from pgscope.labels import READ_ONLY_OPTION
from pgscope.proc import spawn, stop_process
from pgscope.spec import Objective, ScriptRef
from pgscope.target.conn import ConnParams
from pgscope.target.pgbin import PgBinaries
from pgscope.target.server import current_role, missing_grants

# `progress: 1795259431.375 s, 2332.7 tps, lat 1.688 ms stddev 0.800, 0 failed`
# (the stddev is NaN when a second saw fewer than two transactions; "failed" is PG 15+).
_PROGRESS = re.compile(
    r"^progress: (?P<ts>\d+(?:\.\d+)?) s, (?P<tps>[\d.]+) tps, "
    r"lat (?P<lat>[\d.]+|NaN|nan) ms stddev (?P<sd>[\d.]+|NaN|nan)"
    r"(?:, (?:lag [\d.]+ ms, )?(?P<failed>\d+) failed)?"
)
# A client that pgbench aborted because the workload's own SQL raised an error (PG 15:
# `client 0 script 0 aborted in command 0 query 0: ERROR:  division by zero`). Aborts for any
# other reason (a lost connection, a FATAL) carry no `ERROR:` there.
_WORKLOAD_ABORT = re.compile(r"\baborted in command \d+\b[^:;]*[:;] ERROR:\s+(?P<message>.+)$")
_ABORT = re.compile(r"\bclient \d+\b.*\baborted\b")
# pgbench's closing line after any abort: not a cause of its own.
_RUN_ABORTED = "Run was aborted; the above results are incomplete"
# Grace beyond the requested duration before a silent pgbench is declared hung: connection
# set-up of many clients and the final log flush take time, but not minutes.
HANG_GRACE_S = 60.0


@dataclass(frozen=True)
class ProgressRow:
    ts_us: int  # end of the one-second interval, UTC epoch microseconds
    tps: float
    latency_ms: float | None
    latency_stddev_ms: float | None
    failed: int


def parse_progress(line: str) -> ProgressRow | None:
    match = _PROGRESS.match(line.strip())
    if match is None:
        return None

    def num(text: str) -> float | None:
        return None if text.lower() == "nan" else float(text)

    return ProgressRow(
        ts_us=round(float(match["ts"]) * 1_000_000),
        tps=float(match["tps"]),
        latency_ms=num(match["lat"]),
        latency_stddev_ms=num(match["sd"]),
        failed=int(match["failed"] or 0),
    )


def parse_summary(stdout: str) -> dict[str, float]:
    """The numbers from pgbench's final report that we keep (for cross-checking our own)."""
    patterns = {
        "xacts": r"number of transactions actually processed: (\d+)",
        "failed": r"number of failed transactions: (\d+)",
        "latency_avg_ms": r"latency average = ([\d.]+) ms",
        "latency_stddev_ms": r"latency stddev = ([\d.]+) ms",
        # Connected once per client: the time until every client was connected. Under -C
        # (a connection per transaction): the mean time per transaction spent connecting
        # and disconnecting; its latency (above, and in the log) leaves that time out.
        "connection_ms": r"initial connection time = ([\d.]+) ms",
        "connection_avg_ms": r"average connection time = ([\d.]+) ms",
        "tps": r"tps = ([\d.]+) \((?:without initial|including reconnection) ",
    }
    found = {}
    for key, pattern in patterns.items():
        match = re.search(pattern, stdout)
        if match:
            found[key] = float(match.group(1))
    return found


# The privileges each builtin script needs on pgbench's tables (an UPDATE's WHERE reads the
# row, so it needs SELECT as well); pgbench also counts pgbench_branches for the scale.
BUILTIN_PRIVILEGES: dict[str, dict[str, tuple[str, ...]]] = {
    "select-only": {"pgbench_accounts": ("SELECT",)},
    "simple-update": {"pgbench_accounts": ("SELECT", "UPDATE"), "pgbench_history": ("INSERT",)},
    "tpcb-like": {
        "pgbench_accounts": ("SELECT", "UPDATE"),
        "pgbench_tellers": ("SELECT", "UPDATE"),
        "pgbench_branches": ("SELECT", "UPDATE"),
        "pgbench_history": ("INSERT",),
    },
}


@dataclass(frozen=True)
class Workload:
    """What pgbench runs: a builtin and/or script files, with the query protocol."""

    builtin: str | None
    scripts: tuple[ScriptRef, ...]
    protocol: str
    defines: tuple[tuple[str, str], ...] = ()  # pgbench -D NAME=VALUE
    max_tries: int = 1  # pgbench --max-tries: tries of a serialization/deadlock failure
    connect_per_transaction: bool = False  # pgbench -C: a new connection per transaction
    # pgbench -R: transactions scheduled at this rate (tps, Poisson arrivals), whether or not
    # the last one returned (open loop); None: each client sends the next when the last
    # returns (closed loop).
    rate: float | None = None
    # pgbench --latency-limit (with a rate): a transaction already this late when its turn
    # comes is skipped, not sent; one that completes later than this is counted late.
    latency_limit_ms: float | None = None

    def readable_by(self, user: LoadUser) -> Workload:
        """The same workload reading copies of its scripts that `user`'s account can read."""
        scripts = tuple(
            replace(script, path=user.readable_copy(script.path, str(index)))
            for index, script in enumerate(self.scripts)
        )
        return replace(self, scripts=scripts)

    def args(self) -> list[str]:
        # --failures-detailed: a failed transaction's log line says serialization or deadlock.
        args = ["-M", self.protocol, f"--max-tries={self.max_tries}", "--failures-detailed"]
        if self.connect_per_transaction:
            args.append("--connect")
        if self.rate is not None:
            args.append(f"--rate={self.rate:.3f}")
            if self.latency_limit_ms is not None:
                args.append(f"--latency-limit={self.latency_limit_ms:.3f}")
        if self.builtin:
            args += ["-b", self.builtin]
        for script in self.scripts:
            args += ["-f", script.pgbench_arg()]
        for name, value in self.defines:
            args += ["-D", f"{name}={value}"]
        return args


@dataclass
class StepRun:
    """The result of one pgbench invocation."""

    returncode: int | None
    summary: dict[str, float]
    error: str | None  # first pgbench error line, or why we stopped it
    log_prefix: Path
    started_us: int
    ended_us: int
    progress_rows: int = 0
    stderr_tail: list[str] = field(default_factory=list)
    # The server's message (`division by zero`) when pgbench aborted clients because the
    # workload's own SQL raised an error, and for no other reason: a result, not a fault.
    workload_error: str | None = None
    user: LoadUser | None = None  # who wrote the transaction logs, in a folder of its own

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.error is None

    def connection_ms_per_xact(self, clients: int) -> float | None:
        """pgbench's connection time per transaction: under -C its own average; connected
        once, each client's wait for its connection spread over its transactions."""
        if "connection_avg_ms" in self.summary:
            return self.summary["connection_avg_ms"]
        ended = self.summary.get("xacts", 0.0) + self.summary.get("failed", 0.0)
        if "connection_ms" not in self.summary or not ended:
            return None
        return self.summary["connection_ms"] * clients / ended

    def log_files(self) -> list[Path]:
        """pgbench's per-transaction logs (PREFIX.PID, and PREFIX.PID.THREAD for -j > 1), out
        of the account's reach (LoadUser.take_logs): the ones to read."""
        return [] if self.user is None else self.user.take_logs(self.log_prefix)


def current_scale(conn: ConnParams) -> int | None:
    """The scale of the pgbench tables on `conn`'s server (pgbench's own rule: rows in
    branches), None where there are none; a role that may not count them is told the GRANT."""
    with conn.connect() as session:
        row = session.execute("SELECT to_regclass('pgbench_branches') IS NOT NULL").fetchone()
        if not row or not row[0]:
            return None
        try:
            count = session.execute("SELECT count(*) FROM pgbench_branches").fetchone()
        except psycopg.errors.InsufficientPrivilege:
            raise missing_grants(
                current_role(session),
                {"pgbench_branches": ["SELECT"]},
                "pgbench counts its rows for the scale",
            ) from None
    return int(count[0]) if count else None


def tables_needed(scale: int, existing: int | None) -> RefusedError:
    """The refusal to create pgbench's tables on a user's server without --allow-writes."""
    have = f"they are at scale {existing}" if existing else "they do not exist"
    return RefusedError(
        f"pgbench tables at scale {scale} are needed but {have}; initialising writes "
        f"to the server: pass --allow-writes to let pgscope create them"
    )


@dataclass(frozen=True)
class Pgbench:
    pg: PgBinaries
    conn: ConnParams
    read_only: bool  # enforce server-side with default_transaction_read_only
    user: LoadUser  # who runs pgbench (never root: scripts can run shell commands), and where

    def _env(self) -> dict[str, str]:
        env = self.user.libpq_env(self.conn)
        if self.read_only:
            # The server itself rejects any write a script attempts (drive/readonly.py).
            env["PGOPTIONS"] = READ_ONLY_OPTION
        return env

    def _conn_args(self) -> list[str]:
        # pgbench expands a connection string given as the database name. Read-only, the guard
        # goes in the string too, last: a DSN's own `options` would win over PGOPTIONS.
        # verify_read_only (drive/readonly.py) checks a session of this same string.
        return [(guarded(self.conn) if self.read_only else self.conn).conninfo()]

    def current_scale(self) -> int | None:
        """The scale of existing pgbench tables (pgbench's own rule: rows in branches)."""
        return current_scale(self.conn)

    def initialise(
        self, scale: int, *, allow_writes: bool, say: Callable[[str], None] | None = None
    ) -> bool:
        """Create pgbench tables at `scale` unless they already exist at that scale (`say`
        hears when it starts to).

        Returns True when it initialised. Server-side data generation ('G') is much faster
        than client-side for large scales.
        """
        existing = self.current_scale()
        if existing == scale:
            return False
        if not allow_writes:
            raise tables_needed(scale, existing)
        argv: list[str | os.PathLike[str]] = [
            self.pg.path("pgbench"),
            "-i",
            "-s",
            str(scale),
            "-I",
            "dtGvp",
            "-q",
            *self._conn_args(),
        ]
        if say is not None:
            say(f"initialising pgbench tables at scale {scale}")
        proc = spawn(
            argv,
            run_as=self.user.run_as,
            cwd=self.user.workdir,
            env=self.user.libpq_env(self.conn),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _, err = proc.communicate(timeout=max(600, scale * 10))
        except BaseException:
            stop_process(proc, signal.SIGINT, grace_s=5)
            raise
        if proc.returncode != 0:
            raise TargetError(f"pgbench -i -s {scale} failed: {_first_error(err)}")
        return True

    def start(
        self,
        workload: Workload,
        *,
        clients: int,
        threads: int,
        seconds: int,
        log_prefix: Path,
        cpus: set[int] | None = None,
    ) -> RunningPgbench:
        """Launch pgbench for `seconds` (on `cpus` if given); `follow()` reads it. Its stdout
        goes beside `log_prefix`; its transaction logs, written as the load's account, to the
        same-named place in that account's working directory."""
        log_prefix.parent.mkdir(parents=True, exist_ok=True)
        log_dir = self.user.step_folder(log_prefix.parent.name)
        argv: list[str | os.PathLike[str]] = [
            self.pg.path("pgbench"),
            "-n",
            *workload.readable_by(self.user).args(),
            "-c",
            str(clients),
            "-j",
            str(threads),
            "-T",
            str(seconds),
            "-P",
            "1",
            "--progress-timestamp",
            "-l",
            f"--log-prefix={log_prefix.name}",
            *self._conn_args(),
        ]
        stdout_path = log_prefix.parent / f"{log_prefix.name}.pgbench.out"
        stdout_file = open_for_writing(stdout_path)
        started_us = time.time_ns() // 1000
        try:
            proc = spawn(
                argv,
                run_as=self.user.run_as,
                cwd=log_dir,
                env=self._env(),
                stdout=stdout_file,
                stderr=subprocess.PIPE,
                text=True,
                cpus=cpus,
            )
        except BaseException:
            stdout_file.close()
            raise
        return RunningPgbench(
            proc,
            stdout_file,
            stdout_path,
            log_dir / log_prefix.name,
            started_us,
            seconds,
            read_only=self.read_only,
            user=self.user,
        )

    def run(
        self,
        workload: Workload,
        *,
        clients: int,
        threads: int,
        seconds: int,
        log_prefix: Path,
        on_progress: Callable[[ProgressRow], None],
        cpus: set[int] | None = None,
    ) -> StepRun:
        """Run pgbench for `seconds`, feeding each progress line to `on_progress` as it
        arrives. Interrupts (KeyboardInterrupt, Interrupted) stop pgbench and propagate."""
        running = self.start(
            workload,
            clients=clients,
            threads=threads,
            seconds=seconds,
            log_prefix=log_prefix,
            cpus=cpus,
        )
        [result] = follow([running], lambda _i, row: on_progress(row))
        return result


@dataclass
class RunningPgbench:
    """A launched pgbench whose output has not been read yet."""

    proc: subprocess.Popen[Any]
    stdout_file: Any
    stdout_path: Path
    log_prefix: Path
    started_us: int
    seconds: int
    rows: int = 0
    error: str | None = None
    tail: list[str] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)  # pgbench's lines on aborted clients
    read_only: bool = False  # pgscope's guard: a write it rejects is a refusal, not a result
    user: LoadUser | None = None

    def finish(self) -> StepRun:
        # Normal end: pgbench has exited. Interrupt or hang: stop it (SIGINT lets it print
        # what it can), then kill.
        stop_process(self.proc, signal.SIGINT, grace_s=5)
        self.stdout_file.close()
        summary = parse_summary(self.stdout_path.read_text())
        error = self.error
        if error is None and self.proc.returncode != 0:
            error = (
                _first_error("\n".join(self.tail)) or f"pgbench exited with {self.proc.returncode}"
            )
        return StepRun(
            self.proc.returncode,
            summary,
            error,
            self.log_prefix,
            self.started_us,
            time.time_ns() // 1000,
            self.rows,
            self.tail[-20:],
            workload_error(self.aborts, self.read_only) if self.error is None else None,
            self.user,
        )


def follow(
    runs: list[RunningPgbench], on_progress: Callable[[int, ProgressRow], None]
) -> list[StepRun]:
    """Read several pgbench processes at once until all exit, feeding progress lines as
    `on_progress(index, row)`. A process silent past its time plus HANG_GRACE_S is stopped.
    On an interrupt every process is stopped, then the interrupt propagates."""
    open_pipes = {}
    with selectors.DefaultSelector() as sel:
        for index, run in enumerate(runs):
            assert run.proc.stderr is not None
            sel.register(run.proc.stderr, selectors.EVENT_READ, index)
            open_pipes[index] = run
        deadline = time.monotonic() + max(r.seconds for r in runs) + HANG_GRACE_S
        try:
            while open_pipes:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    for run in open_pipes.values():
                        run.error = (
                            f"pgbench did not finish within "
                            f"{run.seconds + HANG_GRACE_S:.0f}s; stopped it"
                        )
                    break
                for key, _ in sel.select(timeout=min(remaining, 1.0)):
                    index = key.data
                    run = open_pipes[index]
                    line = run.proc.stderr.readline() if run.proc.stderr else ""
                    if not line:  # EOF: this pgbench exited
                        sel.unregister(key.fileobj)
                        run.proc.wait(timeout=30)
                        del open_pipes[index]
                        continue
                    row = parse_progress(line)
                    if row is not None:
                        on_progress(index, row)
                        run.rows += 1
                    else:
                        run.tail.append(line.rstrip())
                        del run.tail[:-50]
                        if _ABORT.search(line) and _RUN_ABORTED not in line:
                            run.aborts.append(line.strip())
                            del run.aborts[100:]  # one line per aborted client: enough to tell why
        finally:
            results = [run.finish() for run in runs]
    return results


def workload_error(aborts: list[str], read_only: bool = False) -> str | None:
    """The server's message when every aborted client was aborted by an ERROR its SQL raised
    (one line: the statement's LINE/DETAIL lines follow it on lines of their own); None when
    no client was aborted, or one was aborted for another reason (a lost connection), or,
    under pgscope's read-only guard, by the guard rejecting a write (a refusal)."""
    messages = [m["message"].strip() if (m := _WORKLOAD_ABORT.search(a)) else None for a in aborts]
    if not messages or any(m is None for m in messages):
        return None
    if read_only and any("read-only transaction" in (m or "") for m in messages):
        return None
    if any(_SERVER_FAULT.search(m or "") for m in messages):
        return None  # the server could not do what the SQL asked: a fault, not a result
    return messages[0]


# ERRORs a statement gets because the server or its host failed, not because of what the SQL
# says (pgbench reports the message without its SQLSTATE: classes 53, 57, 58 and XX by text).
_SERVER_FAULT = re.compile(
    r"No space left on device|disk quota|could not (extend|write to|fsync|read|open|create|seek "
    r"(in|to) block \d+ in)? ?file|could not (read|write) block"
    r"|Input/output error|out of memory|too many connections|the database system is"
    r"|terminating connection|lost synchronization",
    re.IGNORECASE,
)


def _first_error(stderr: str) -> str:
    for line in stderr.splitlines():
        line = line.strip()
        if "error" in line.lower() or "fatal" in line.lower():
            return line.removeprefix("pgbench: ")
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


# -------------------------------------------------------------------------------------------
# Per-transaction logs -> latency statistics


@dataclass(frozen=True)
class LatencyStats:
    xacts: int
    failed: int
    window_start_us: int
    window_end_us: int
    tps: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    mean_ms: float


@dataclass(frozen=True)
class Outcomes:
    """Transactions by how they ended: in the measured window where the step has one (from
    `warmup_s` after the first transaction ended, failed or not, to the last), else over the
    whole log. A failure is counted once, after its last try; `retried` transactions needed
    more than one try (pgbench --max-tries > 1), `retries` adds up their extra tries."""

    window_start_us: int | None
    window_end_us: int | None
    succeeded: int = 0
    serialization: int = 0
    deadlock: int = 0
    other: int = 0  # any other failure pgbench logged ("failed")
    retried: int = 0
    retries: int = 0

    @property
    def failed(self) -> int:
        return self.serialization + self.deadlock + self.other


@dataclass(frozen=True)
class SecondStats:
    second_us: int  # start of the second, UTC epoch microseconds
    xacts: int
    failed: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    # With a rate: the mean wait of the second's transactions for their turn (schedule lag)
    # and the transactions skipped that second (--latency-limit); None without a rate.
    lag_ms: float | None = None
    skipped: int | None = None


@dataclass(frozen=True)
class ObjectiveStats:
    """One objective over a step's measured window: the transactions that missed it (a
    latency above the threshold, or skipped for being too late to meet the limit) as a
    share of those scheduled (succeeded or skipped), and the objective's quantile."""

    name: str
    quantile: float
    threshold_ms: float
    above: int
    scheduled: int
    latency_ms: float | None  # the quantile; None: it falls among the skipped ones

    @property
    def above_share(self) -> float:
        return self.above / self.scheduled if self.scheduled else 0.0

    @property
    def met(self) -> bool:
        return self.scheduled > 0 and self.above_share <= 1 - self.quantile


@dataclass(frozen=True)
class ScheduleStats:
    """What an open-loop step (pgbench -R) adds, over its measured window: latency is counted
    from each transaction's scheduled start, so it includes the wait for a free client (the
    schedule lag); the service time is what is left, the latency a closed loop measures."""

    lag_mean_ms: float
    lag_p99_ms: float
    lag_max_ms: float
    service_p50_ms: float
    service_p99_ms: float
    skipped: int  # not sent: already later than --latency-limit when their turn came
    late: int | None  # completed later than --latency-limit (None: no limit)
    objectives: tuple[ObjectiveStats, ...] = ()
    # Transactions due in the window (by their schedule) that succeeded by its end: the rate
    # offered that was served. Completions in the window count too many where a backlog from
    # before it drains inside it, and too few where one from inside it drains after it.
    served: int = 0


# pgbench 15's per-transaction log: `client_id transaction_no time script_no time_epoch
# time_us [schedule_lag] [retries]`; schedule_lag only with --rate, retries only with
# --max-tries other than 1: null_padding reads a line without it as NULL. With --rate,
# `time` is counted from the transaction's scheduled start (schedule lag included), and a
# transaction skipped under --latency-limit has `skipped` in it.
def _log_columns(rated: bool) -> dict[str, str]:
    columns = {
        "client_id": "BIGINT",
        "xact_no": "BIGINT",
        "latency": "VARCHAR",
        "script_no": "BIGINT",
        "epoch_s": "BIGINT",
        "epoch_us": "BIGINT",
    }
    if rated:
        columns["lag"] = "BIGINT"
    columns["retries"] = "BIGINT"
    return columns


def _log_relation(db: duckdb.DuckDBPyConnection, files: list[Path], rated: bool = False) -> None:
    """Expose the logs as view `xact` (end_us, latency_us, failed, failure, retries, lag_us)
    and, with a rate, `skip` (end_us of each skipped transaction). A failed transaction's time
    column reads 'serialization' or 'deadlock' (--failures-detailed), or 'failed' for any
    other failure, hence VARCHAR + TRY_CAST; `failure` is NULL for a transaction that
    succeeded, else 'serialization', 'deadlock' or 'other'. A skipped transaction was never
    sent: not in `xact`. A line without its end time is one pgbench was cut off writing (a
    full disk, a kill): not a transaction, failed or not, so it is left out."""
    # Table functions in a view cannot take bound parameters: quote the literals instead.
    # No sniffing: it would refuse the 7 columns given for a log of 6 (no retries column).
    file_list = ", ".join(_sql_string(str(f)) for f in files)
    columns = ", ".join(
        f"{_sql_string(k)}: {_sql_string(v)}" for k, v in _log_columns(rated).items()
    )
    db.execute(
        f"CREATE OR REPLACE TEMP VIEW raw_xact AS SELECT * FROM read_csv([{file_list}], "
        f"delim=' ', header=false, columns={{{columns}}}, null_padding=true, "
        f"ignore_errors=true, auto_detect=false)"
    )
    lag = "lag" if rated else "CAST(NULL AS BIGINT)"
    whole = "epoch_s IS NOT NULL AND epoch_us IS NOT NULL"
    db.execute(
        "CREATE OR REPLACE TEMP VIEW xact AS SELECT epoch_s * 1000000 + epoch_us AS end_us, "
        "TRY_CAST(latency AS BIGINT) AS latency_us, "
        "TRY_CAST(latency AS BIGINT) IS NULL AS failed, "
        "CASE WHEN TRY_CAST(latency AS BIGINT) IS NOT NULL THEN NULL "
        "WHEN latency IN ('serialization', 'deadlock') THEN latency ELSE 'other' END AS failure, "
        f"coalesce(retries, 0) AS retries, client_id, script_no, {lag} AS lag_us FROM raw_xact "
        f"WHERE {whole} AND latency IS DISTINCT FROM 'skipped'"
    )
    db.execute(
        "CREATE OR REPLACE TEMP VIEW skip AS SELECT epoch_s * 1000000 + epoch_us AS end_us "
        f"FROM raw_xact WHERE {whole} AND latency = 'skipped'"
    )


def analyse_logs(
    files: list[Path], warmup_s: float, rated: bool = False
) -> tuple[LatencyStats | None, list[SecondStats], Outcomes]:
    """Exact latency percentiles over the measured window, per-second percentiles, and the
    transactions by outcome. `rated`: the logs are of a step driven at a rate (pgbench -R),
    whose lines carry the schedule lag.

    The window starts `warmup_s` after the first transaction completed and ends at the last;
    tps is the number of transactions that succeeded in it divided by its length. No
    statistics (None) where no transaction succeeded in the window: a step whose every
    transaction failed has counts, not a throughput or latencies.
    """
    files = [f for f in files if f.stat().st_size > 0]
    if not files:
        return None, [], Outcomes(None, None)
    db = connect()
    try:
        _log_relation(db, files, rated)
        bounds = db.execute("SELECT min(end_us), max(end_us) FROM xact").fetchone()
        if bounds is None or bounds[0] is None:
            return None, [], Outcomes(None, None)
        window_start = int(bounds[0] + warmup_s * 1_000_000)
        window_end = int(bounds[1])
        rated_columns = (
            "avg(lag_us) / 1000, coalesce(any_value(k.n), 0)"
            if rated
            else "CAST(NULL AS DOUBLE), CAST(NULL AS BIGINT)"
        )
        per_second = [
            SecondStats(*row)
            for row in db.execute(
                "SELECT x.sec, count(*), count(*) FILTER (WHERE failed), "
                "quantile_cont(latency_us, 0.5) / 1000, quantile_cont(latency_us, 0.95) / 1000, "
                f"quantile_cont(latency_us, 0.99) / 1000, max(latency_us) / 1000, {rated_columns} "
                "FROM (SELECT *, (end_us // 1000000) * 1000000 AS sec FROM xact) x "
                "LEFT JOIN (SELECT (end_us // 1000000) * 1000000 AS sec, count(*) AS n "
                "FROM skip GROUP BY 1) k ON k.sec = x.sec GROUP BY x.sec ORDER BY x.sec"
            ).fetchall()
        ]
        windowed = window_end > window_start
        outcomes = _outcomes(db, (window_start, window_end) if windowed else None)
        row = db.execute(
            "SELECT count(*), count(*) FILTER (WHERE failed), "
            "quantile_cont(latency_us, [0.5, 0.9, 0.95, 0.99, 0.999]), max(latency_us), "
            "avg(latency_us) FROM xact WHERE end_us > ? AND end_us <= ?",
            [window_start, window_end],
        ).fetchone()
        if row is None or not row[0] or row[2] is None or not windowed:
            return None, per_second, outcomes
        xacts, failed, quantiles, max_us, mean_us = row
        seconds = (window_end - window_start) / 1_000_000
        stats = LatencyStats(
            xacts=int(xacts),
            failed=int(failed),
            window_start_us=window_start,
            window_end_us=window_end,
            tps=(xacts - failed) / seconds,
            p50_ms=quantiles[0] / 1000,
            p90_ms=quantiles[1] / 1000,
            p95_ms=quantiles[2] / 1000,
            p99_ms=quantiles[3] / 1000,
            p999_ms=quantiles[4] / 1000,
            max_ms=max_us / 1000,
            mean_ms=mean_us / 1000,
        )
        return stats, per_second, outcomes
    finally:
        db.close()


def analyse_schedule(
    files: list[Path],
    window: tuple[int, int],
    latency_limit_ms: float | None = None,
    objectives: tuple[Objective, ...] = (),
) -> ScheduleStats | None:
    """An open-loop step's schedule over its measured window (`window`, as analyse_logs
    found it): the lag, the service time, skipped and late transactions, and each latency
    objective. None where no transaction succeeded in the window."""
    files = [f for f in files if f.stat().st_size > 0]
    if not files:
        return None
    start, end = window
    db = connect()
    try:
        _log_relation(db, files, rated=True)
        inside = "end_us > ? AND end_us <= ?"
        row = db.execute(
            "SELECT count(*), avg(lag_us), quantile_cont(lag_us, 0.99), max(lag_us), "
            "quantile_cont(latency_us - lag_us, [0.5, 0.99]), "
            "count(*) FILTER (WHERE latency_us > ?) "
            f"FROM xact WHERE NOT failed AND {inside}",
            [(latency_limit_ms or 0.0) * 1000, start, end],
        ).fetchone()
        due = db.execute(
            "SELECT count(*) FROM xact WHERE NOT failed AND end_us - latency_us > ? "
            "AND end_us - latency_us <= ?",
            [start, end],
        ).fetchone()
        skipped_row = db.execute(
            f"SELECT count(*) FROM skip WHERE {inside}", [start, end]
        ).fetchone()
        if row is None or not row[0] or row[1] is None:
            return None
        succeeded, lag_mean, lag_p99, lag_max, service, late = row
        skipped = int(skipped_row[0]) if skipped_row else 0
        found = []
        for objective in objectives:
            # Skipped transactions count as later than any latency: they never ran.
            above, latency = db.execute(
                "SELECT count(*) FILTER (WHERE v > ?), quantile_disc(v, ?) FROM ("
                f"SELECT CAST(latency_us AS DOUBLE) AS v FROM xact WHERE NOT failed AND {inside} "
                f"UNION ALL SELECT 'infinity'::DOUBLE FROM skip WHERE {inside})",
                [objective.threshold_ms * 1000, objective.quantile, start, end, start, end],
            ).fetchone() or (0, None)
            found.append(
                ObjectiveStats(
                    objective.name,
                    objective.quantile,
                    objective.threshold_ms,
                    int(above),
                    int(succeeded) + skipped,
                    None if latency is None or math.isinf(latency) else latency / 1000,
                )
            )
        return ScheduleStats(
            lag_mean_ms=lag_mean / 1000,
            lag_p99_ms=lag_p99 / 1000,
            lag_max_ms=lag_max / 1000,
            service_p50_ms=service[0] / 1000,
            service_p99_ms=service[1] / 1000,
            skipped=skipped,
            late=int(late) if latency_limit_ms is not None else None,
            objectives=tuple(found),
            served=int(due[0]) if due else 0,
        )
    finally:
        db.close()


def _outcomes(db: duckdb.DuckDBPyConnection, window: tuple[int, int] | None) -> Outcomes:
    where, params = ("WHERE end_us > ? AND end_us <= ?", list(window)) if window else ("", [])
    row = db.execute(
        "SELECT count(*) FILTER (WHERE failure IS NULL), "
        "count(*) FILTER (WHERE failure = 'serialization'), "
        "count(*) FILTER (WHERE failure = 'deadlock'), count(*) FILTER (WHERE failure = 'other'), "
        f"count(*) FILTER (WHERE retries > 0), coalesce(sum(retries), 0) FROM xact {where}",
        params,
    ).fetchone()
    counts = [int(v) for v in row] if row else [0] * 6
    return Outcomes(window[0] if window else None, window[1] if window else None, *counts)


def archive_logs(files: list[Path], target: Path, rated: bool = False) -> int:
    """Keep the raw per-transaction log as compressed Parquet (a fraction of the text size),
    then delete the text files. Returns the number of rows archived (skipped transactions
    of a rated step are kept as rows of their own, `skipped` true)."""
    files = [f for f in files if f.stat().st_size > 0]
    if not files:
        return 0
    # Closed loop: the columns as ever. A rated step's latency counts from the scheduled
    # start; its rows carry the lag, and its skipped transactions are rows of their own.
    columns = "client_id, script_no, end_us, latency_us, failed, failure, retries"
    relation = f"SELECT {columns} FROM xact"
    if rated:
        relation = (
            f"SELECT {columns}, lag_us, false AS skipped FROM xact UNION ALL "
            "SELECT client_id, script_no, epoch_s * 1000000 + epoch_us, NULL, false, NULL, "
            "coalesce(retries, 0), NULL, true FROM raw_xact WHERE latency = 'skipped' "
            "AND epoch_s IS NOT NULL AND epoch_us IS NOT NULL"
        )
    db = connect()
    try:
        _log_relation(db, files, rated)
        count = db.execute(f"SELECT count(*) FROM ({relation})").fetchone()
        db.execute(
            f"COPY ({relation} ORDER BY end_us) TO {_sql_string(str(target))} "
            f"(FORMAT parquet, COMPRESSION zstd)"
        )
    finally:
        db.close()
    for f in files:
        f.unlink()
    return int(count[0]) if count else 0


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
