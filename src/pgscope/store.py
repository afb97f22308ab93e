"""The run store: one DuckDB file per run (`results/<run-id>/run.duckdb`), artifacts beside it.

It is the contract between collecting and analysing; docs/store.md documents every table.
Rows are committed as they arrive (DuckDB autocommits each statement), so a run killed after
three steps still has those three steps. Time is UTC epoch microseconds (BIGINT) everywhere.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from pgscope import tables
from pgscope.duck import STORAGE_VERSION, confine, connect, foreign_code, table_exists
from pgscope.errors import EnvironmentProblem, InputFileError
from pgscope.files import make_private_folder

__all__ = ["RunMeta", "RunStore", "ServerIdentity", "list_runs", "now_us", "table_exists"]

STORE_FILE = "run.duckdb"
# Room kept on the results disk for a session's last rows when the disk fills (its status, the
# window cut short): a file of this size in the run folder, removed to make that room.
RESERVE_FILE = ".reserve"
RESERVE_BYTES = 2 << 20

STEP_RESULT_COLUMNS = (
    "window_start_us",
    "window_end_us",
    "tps",
    "xacts",
    "failed",
    "pgbench_tps",
    "latency_mean_ms",
    "p50_ms",
    "p90_ms",
    "p95_ms",
    "p99_ms",
    "p999_ms",
    "max_ms",
    "xact_log",
    "succeeded",
    "failed_serialization",
    "failed_deadlock",
    "failed_other",
    "retried",
    "retries",
    "workload_error",
    "reconnects",
    "connection_ms",
    "lag_mean_ms",
    "lag_p99_ms",
    "lag_max_ms",
    "service_p50_ms",
    "service_p99_ms",
    "skipped",
    "late",
    "served",
)


def now_us() -> int:
    return time.time_ns() // 1000


@dataclass(frozen=True)
class RunMeta:
    run_id: str
    recipe: str
    spec_source: str
    spec_toml: str
    spec_json: str
    command_line: str
    pgscope_version: str
    target_kind: str  # "embedded" or "server"
    target_conninfo: str  # never contains a password
    host: dict[str, Any]


@dataclass(frozen=True)
class ServerIdentity:
    """The server a run measured, as a fleet tells servers apart (store version 7)."""

    system_identifier: int | None  # pg_control_system(); None where the role may not read it
    host: str  # as the connection named it; this machine's name for a socket
    port: int | None


class RunStore:
    """Writer and reader of one run's DuckDB file.

    One connection per process; collectors running in their own threads call `writer()` for a
    cursor of their own (DuckDB connections are not shared between threads).
    """

    def __init__(
        self,
        db: duckdb.DuckDBPyConnection,
        run_dir: Path,
        present: frozenset[str] | None = None,
    ) -> None:
        self.db = db
        self.run_dir = run_dir
        self._lock = threading.Lock()
        # Read: the declared tables the file holds (the others read as empty). Written: None,
        # the file is asked.
        self._present = present

    def writer(self) -> RunStore:
        """A handle for another thread: same file, its own cursor."""
        with self._lock:
            return RunStore(self.db.cursor(), self.run_dir, self._present)

    def create_tables(self, writer: str) -> None:
        """Create the tables `writer` (a collector's name, "run", "observe") writes, as
        pgscope.tables declares them."""
        self.db.execute("\n".join(t.ddl() for t in tables.written_by(writer)))

    def append(self, table: str, columns: Mapping[str, Sequence[Any]]) -> int:
        """Append rows given column-wise, in one statement.

        DuckDB's executemany costs ~1 ms a row; scanning a dict of NumPy arrays costs ~7 ms
        per 1000 rows, which is what a 50 Hz sampler needs. None becomes NULL.
        """
        unknown = set(columns) - set(tables.of(table).column_names)
        if unknown:
            raise ValueError(f"append to {table}: columns it does not declare: {sorted(unknown)}")
        lengths = {len(v) for v in columns.values()}
        if len(lengths) != 1:
            raise ValueError(f"append to {table}: columns differ in length: {lengths}")
        count = lengths.pop()
        if count == 0:
            return 0
        batch = {name: np.array(values, dtype=object) for name, values in columns.items()}
        view = f"_batch_{threading.get_ident()}"
        self.db.register(view, batch)
        try:
            names = ", ".join(columns)
            self.db.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM {view}")
        finally:
            self.db.unregister(view)
        return count

    # -- opening ----------------------------------------------------------------------------

    @classmethod
    def create(cls, run_dir: Path, meta: RunMeta) -> RunStore:
        try:
            # Private to whoever runs pgscope from the start: the store, server.log and the
            # transaction logs hold the server's text (statements, a script's own lines).
            make_private_folder(run_dir)
            db = connect(str(run_dir / STORE_FILE), storage_version=STORAGE_VERSION)
            os.chmod(run_dir / STORE_FILE, 0o600)
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot create run folder {run_dir}: {exc.strerror}"
            ) from None
        except duckdb.Error as exc:
            raise EnvironmentProblem(f"cannot create the run store in {run_dir}: {exc}") from None
        db.execute("\n".join(t.ddl() for t in tables.written_by("run")))
        db.execute("INSERT INTO schema_info VALUES (?)", [tables.STORE_VERSION])
        db.execute(
            "INSERT INTO run (run_id, recipe, spec_source, spec_toml, spec_json, command_line, "
            "pgscope_version, target_kind, target_conninfo, host_json, started_us, status) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running')",
            [
                meta.run_id,
                meta.recipe,
                meta.spec_source,
                meta.spec_toml,
                meta.spec_json,
                meta.command_line,
                meta.pgscope_version,
                meta.target_kind,
                meta.target_conninfo,
                json.dumps(meta.host),
                now_us(),
            ],
        )
        return cls(db, run_dir)

    @classmethod
    def open(cls, run_dir: Path, *, writable: Path | None = None) -> RunStore:
        """Open a finished (or interrupted) run read-only, confined to its own file
        (duck.confine; `writable`: a folder `COPY ... TO` may write in). A store that defines
        views or macros, or whose run.duckdb is a link, is not read: a store comes from
        whoever wrote the folder, and pgscope runs no SQL of theirs, nor reads a file a
        folder points it at. Every declared table reads as declared, whichever version wrote
        the store (`tables.shadow`)."""
        path = run_dir / STORE_FILE
        if path.is_symlink():
            raise InputFileError(
                f"{run_dir}: {STORE_FILE} is a symbolic link, not a run store of its own: not read"
            )
        if not path.is_file():
            raise InputFileError(f"{run_dir}: not a pgscope run folder (no {STORE_FILE})")
        try:
            db = connect(str(path), read_only=True)
        except duckdb.Error as exc:
            reason = str(exc).lower()
            if isinstance(exc, duckdb.IOException) and "lock" in reason:
                raise InputFileError(f"{run_dir}: the run is still in progress") from None
            if "extension" in reason:  # another database's file (SQLite, ...): never loaded
                raise InputFileError(
                    f"{run_dir}: {STORE_FILE} is not a pgscope run store (not a DuckDB file)"
                ) from None
            raise InputFileError(f"{run_dir}: cannot open the run store: {exc}") from None
        try:
            confine(db, None if writable is None else f"{writable}/")
            foreign = foreign_code(db)
        except BaseException:
            db.close()
            raise
        if foreign:
            db.close()
            raise InputFileError(
                f"{run_dir}: {STORE_FILE} is not a pgscope run store: it defines "
                f"{', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''} (pgscope "
                f"writes no views or macros, and runs none it did not write): not read"
            )
        present = tables.shadow(db)
        if not {"run", "schema_info"} <= present:
            db.close()
            raise InputFileError(
                f"{run_dir}: {STORE_FILE} is not a pgscope run store (it has no run table)"
            )
        return cls(db, run_dir, present)

    def close(self) -> None:
        self.db.close()

    # -- a full disk ------------------------------------------------------------------------

    def reserve(self) -> None:
        """Keep RESERVE_BYTES of the results disk for `last_writes`. OSError (ENOSPC) when
        even that much is not free; where the file system cannot reserve room (another
        error), the session goes on without."""
        try:
            fd = os.open(self.run_dir / RESERVE_FILE, os.O_CREAT | os.O_WRONLY, 0o600)
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            finally:
                os.close(fd)
        except OSError as exc:
            self.release_reserve()
            if exc.errno == errno.ENOSPC:
                raise

    def release_reserve(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.run_dir / RESERVE_FILE).unlink()

    def last_writes(self, writes: Callable[[RunStore], None]) -> bool:
        """After the disk filled: the reserve given back, then `writes` (a few small rows,
        written so that writing them twice does no harm). They go to the write-ahead log
        alone: a checkpoint needs room for every row not yet in the file, and each reader
        replays the log. A checkpoint that failed for want of room has invalidated the
        database: it is opened again (its log replayed) and the rows written there. False
        when even that failed."""
        self.release_reserve()
        for attempt in (1, 2):
            try:
                self.db.execute("SET wal_autocheckpoint = '1TB'")
                writes(self)
                self.db.execute("PRAGMA disable_checkpoint_on_shutdown")
                return True
            except duckdb.Error:
                if attempt == 2:
                    return False
                with contextlib.suppress(duckdb.Error):
                    self.db.close()
                try:
                    self.db = connect(str(self.run_dir / STORE_FILE))
                except duckdb.Error:
                    return False
        return False

    # -- writing ----------------------------------------------------------------------------

    def set_server(
        self, version: str, version_num: int, identity: ServerIdentity | None = None
    ) -> None:
        self.db.execute(
            "UPDATE run SET server_version = ?, server_version_num = ?", [version, version_num]
        )
        if identity is not None:
            self.db.execute(
                "UPDATE run SET system_identifier = ?, server_host = ?, server_port = ?",
                [identity.system_identifier, identity.host, identity.port],
            )

    def finish_run(self, status: str, reason: str | None = None) -> None:
        self.db.execute(
            "UPDATE run SET ended_us = ?, status = ?, status_reason = ?", [now_us(), status, reason]
        )

    def add_settings(self, variant: str, rows: Iterable[Sequence[Any]]) -> None:
        data = list(rows)
        columns: dict[str, Sequence[Any]] = {
            name: [row[i] for row in data]
            for i, name in enumerate(("name", "setting", "unit", "source"))
        }
        columns["variant"] = [variant] * len(data)
        columns["captured_us"] = [now_us()] * len(data)
        self.append("settings", columns)

    def add_event(
        self, kind: str, detail: str, step_id: int | None = None, ts_us: int | None = None
    ) -> None:
        self.db.execute(
            "INSERT INTO events VALUES (?, ?, ?, ?)", [ts_us or now_us(), step_id, kind, detail]
        )

    def begin_step(
        self,
        step_id: int,
        variant: str,
        clients: int,
        repeat: int,
        threads: int,
        duration_s: float,
        warmup_s: float,
        server_restarted: bool,
        at_us: int | None = None,
        *,
        rate: float | None = None,
        rate_share: float | None = None,
        latency_limit_ms: float | None = None,
    ) -> None:
        """A step begun, now or at `at_us` (an observation's window begins where the last
        one ended); `rate` (tps offered, pgbench -R) for an open-loop step, with the share of
        the peak it was given as and pgbench's --latency-limit."""
        self.db.execute(
            "INSERT INTO steps (step_id, variant, clients, repeat, threads, duration_s, warmup_s,"
            " started_us, status, server_restarted, rate, rate_share, latency_limit_ms) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'running', ?, ?, ?, ?)",
            [
                step_id,
                variant,
                clients,
                repeat,
                threads,
                duration_s,
                warmup_s,
                at_us or now_us(),
                server_restarted,
                rate,
                rate_share,
                latency_limit_ms,
            ],
        )

    def add_progress(
        self,
        step_id: int,
        ts_us: int,
        tps: float,
        latency_ms: float | None,
        stddev_ms: float | None,
        failed: int,
        instance: int = 1,
    ) -> None:
        self.db.execute(
            "INSERT INTO timeline VALUES (?, ?, ?, ?, ?, ?, ?)",
            [step_id, ts_us, tps, latency_ms, stddev_ms, failed, instance],
        )

    def add_instance_result(
        self,
        step_id: int,
        instance: int,
        clients: int,
        pgbench_tps: float | None,
        error: str | None,
    ) -> None:
        """With several instances side by side: each one's share of a step."""
        self.db.execute(
            "INSERT INTO step_instances VALUES (?, ?, ?, ?, ?)",
            [step_id, instance, clients, pgbench_tps, error],
        )

    def add_latency_seconds(self, step_id: int, rows: Iterable[Sequence[Any]]) -> None:
        data = list(rows)
        if not data:
            return
        names = (
            "second_us",
            "xacts",
            "failed",
            "p50_ms",
            "p95_ms",
            "p99_ms",
            "max_ms",
            "lag_ms",
            "skipped",
        )
        columns: dict[str, Sequence[Any]] = {"step_id": [step_id] * len(data)}
        columns.update({name: [row[i] for row in data] for i, name in enumerate(names)})
        self.append("latency_seconds", columns)

    def add_step_objectives(self, step_id: int, rows: Iterable[Sequence[Any]]) -> None:
        """Each latency objective over an open-loop step's window: (objective, quantile,
        threshold_ms, above, scheduled, latency_ms)."""
        data = list(rows)
        names = ("objective", "quantile", "threshold_ms", "above", "scheduled", "latency_ms")
        columns: dict[str, Sequence[Any]] = {"step_id": [step_id] * len(data)}
        columns.update({name: [row[i] for row in data] for i, name in enumerate(names)})
        self.append("step_objectives", columns)

    def set_collector(
        self, name: str, available: bool, reason: str | None, options: dict[str, Any]
    ) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO collectors (name, available, reason, options_json, status) "
            "VALUES (?, ?, ?, ?, ?)",
            [name, available, reason, json.dumps(options), "ready" if available else "off"],
        )

    def collector_started(self, name: str) -> None:
        self.db.execute(
            "UPDATE collectors SET started_us = ?, status = 'running' WHERE name = ?",
            [now_us(), name],
        )

    def collector_stopped(self, name: str, status: str, error: str | None = None) -> None:
        self.db.execute(
            "UPDATE collectors SET stopped_us = ?, status = ?, error = ? WHERE name = ?",
            [now_us(), status, error, name],
        )

    def add_gap(self, name: str, start_us: int, end_us: int, reason: str) -> None:
        """A span in which a collector recorded nothing (it died, lagged, or was restarted)."""
        self.db.execute(
            "INSERT INTO collector_gaps VALUES (?, ?, ?, ?)", [name, start_us, end_us, reason]
        )

    def finish_step(
        self,
        step_id: int,
        status: str,
        error: str | None,
        results: dict[str, Any],
        at_us: int | None = None,
    ) -> None:
        """A step ended, now or at `at_us`."""
        unknown = set(results) - set(STEP_RESULT_COLUMNS)
        assert not unknown, f"not step result columns: {unknown}"
        columns = ["ended_us", "status", "error", *results]
        assignments = ", ".join(f"{c} = ?" for c in columns)
        self.db.execute(
            f"UPDATE steps SET {assignments} WHERE step_id = ?",
            [at_us or now_us(), status, error, *results.values(), step_id],
        )

    # -- reading ----------------------------------------------------------------------------

    def query(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        cursor = self.db.execute(sql, params or [])
        names = [d[0] for d in cursor.description or []]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def has_table(self, name: str) -> bool:
        """Whether the store holds the table (a collector that never ran made none)."""
        if self._present is not None:
            return name in self._present
        return table_exists(self.db, name)

    def run_row(self) -> dict[str, Any]:
        rows = self.query("SELECT * FROM run")
        if not rows:
            raise InputFileError(f"{self.run_dir}: the run store has no run record")
        return rows[0]

    def steps(self) -> list[dict[str, Any]]:
        return self.query("SELECT * FROM steps ORDER BY step_id")

    def summary(self) -> dict[str, Any]:
        """What `pgscope runs` lists of the run, as the store has it: its name, status, steps,
        start, server, target, effective spec, client counts and best cell's throughput."""
        run = self.run_row()
        counts = self.query(
            "SELECT count(*) AS n, count(*) FILTER (WHERE status = 'ok') AS ok, "
            "list(DISTINCT clients ORDER BY clients) AS clients FROM steps"
        )[0]
        # The best cell: the highest mean over a (variant, clients) cell's ok steps, of the
        # sweep (an open-loop step's tps is of a rate it was offered).
        best = self.query(
            "SELECT max(tps) AS tps FROM (SELECT avg(tps) AS tps FROM steps "
            "WHERE status = 'ok' AND tps > 0 AND rate IS NULL GROUP BY variant, clients)"
        )[0]["tps"]
        status = run["status"] if run["status"] != "running" else "interrupted"
        try:
            spec = json.loads(run["spec_json"] or "{}")
        except json.JSONDecodeError:
            spec = {}
        return {
            "recipe": run["recipe"],
            "status": status,
            "status_reason": run["status_reason"],
            "steps": counts["n"],
            "steps_ok": counts["ok"],
            "started_us": run["started_us"],
            "server_version": run["server_version"],
            "target_kind": run["target_kind"],
            "target_conninfo": run["target_conninfo"],
            "spec": spec if isinstance(spec, dict) else {},
            "clients": list(counts["clients"] or []),
            "best_tps": best,
        }


def list_runs(results_dir: Path) -> list[dict[str, Any]]:
    """One summary row per run folder under `results_dir`, newest first."""
    rows: list[dict[str, Any]] = []
    if not results_dir.is_dir():
        return rows
    for run_dir in sorted(results_dir.iterdir(), reverse=True):
        if not (run_dir / STORE_FILE).is_file():
            continue
        row: dict[str, Any] = {
            "run_id": run_dir.name,
            "run_dir": str(run_dir),
            "recipe": "",
            "status": "unreadable",
            "steps": 0,
            "steps_ok": 0,
        }
        try:
            store = RunStore.open(run_dir)
        except InputFileError as exc:
            row["status"] = "running" if "in progress" in str(exc) else "unreadable"
            rows.append(row)
            continue
        try:
            row.update(store.summary())
        finally:
            store.close()
        rows.append(row)
    return rows
