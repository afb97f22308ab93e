"""Cumulative statistics views, snapshotted once a second: WAL, checkpoints and buffers,
database counters, replication, I/O.

What it records: every numeric column of `pg_stat_wal`, `pg_stat_bgwriter`,
`pg_stat_checkpointer` (PostgreSQL 17+), `pg_stat_database` (per database) and
`pg_stat_replication` (per standby; lags in ms), and two sums of `pg_stat_io` (16+): the
writes and fsyncs of shared buffers by every process but the checkpointer and the background
writer (object `backends`: what `pg_stat_bgwriter.buffers_backend` counted before 17), and
the WAL's own writes and fsyncs (object `wal`, 18+: what `pg_stat_wal.wal_write` and
`wal_sync` counted before 18). Rows are (source, object, counter, value) as the server names
them, so a view's columns may differ between PostgreSQL versions without a schema change; the
analysis maps each version's names to one meaning (`analyze/pgstats.py`). Rates are
differences between snapshots: WAL bytes and full-page images per second around a
checkpoint, checkpoints requested vs timed, buffers written by backends, commits per second.
And the server's next transaction id (`pg_current_snapshot`'s xmax, which assigns none
itself): how many ids every session was given between two snapshots, which even a
read-only load can take (`SELECT txid_current()` assigns one).
Besides the periodic snapshots, one is taken just before each step's load and one just
after, so a step's totals are exact rather than blurred by the snapshot interval; between two
windows of an observation, one snapshot is both the end of one and the start of the next.

What it costs: one query a second (well under 1 ms of server CPU). Needs `pg_monitor` on a
server pgscope does not own (for pg_stat_replication's details).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import psycopg
from pydantic import BaseModel, ConfigDict, Field

from pgscope.collect.base import Availability, CollectorContext, CollectorEnv, StepInfo
from pgscope.collect.polling import PollingCollector
from pgscope.store import RunStore, now_us

# Each row: (source, object, json of the row). Numeric values are kept; the rest dropped.
_COMMON_SQL = """
SELECT 'pg_stat_wal', NULL, row_to_json(w)::text FROM pg_stat_wal w
UNION ALL
SELECT 'pg_stat_bgwriter', NULL, row_to_json(b)::text FROM pg_stat_bgwriter b
UNION ALL
SELECT 'pg_stat_database', d.datname, row_to_json(d)::text FROM pg_stat_database d
WHERE d.datname IS NOT NULL
UNION ALL
SELECT 'pg_stat_replication', r.application_name, json_build_object(
    'sent_lsn', r.sent_lsn - '0/0'::pg_lsn, 'write_lsn', r.write_lsn - '0/0'::pg_lsn,
    'flush_lsn', r.flush_lsn - '0/0'::pg_lsn, 'replay_lsn', r.replay_lsn - '0/0'::pg_lsn,
    'write_lag_ms', extract(epoch FROM r.write_lag) * 1000,
    'flush_lag_ms', extract(epoch FROM r.flush_lag) * 1000,
    'replay_lag_ms', extract(epoch FROM r.replay_lag) * 1000,
    'sync', CASE WHEN r.sync_state IN ('sync', 'quorum') THEN 1 ELSE 0 END)::text
FROM pg_stat_replication r
UNION ALL
SELECT 'pg_current_snapshot', NULL, json_build_object(
    'xmax', pg_snapshot_xmax(pg_current_snapshot())::text::bigint)::text
"""
# PostgreSQL 17 moved the checkpoint counters out of pg_stat_bgwriter.
_CHECKPOINTER_SQL = """
UNION ALL
SELECT 'pg_stat_checkpointer', NULL, row_to_json(c)::text FROM pg_stat_checkpointer c
"""
# pg_stat_io (16+) has a row per (backend type, object, context); two sums of it carry what
# the older views counted. Shared buffers written by the backends themselves:
_IO_BACKENDS_SQL = """
UNION ALL
SELECT 'pg_stat_io', 'backends', json_build_object(
    'writes', sum(writes), 'fsyncs', sum(fsyncs),
    'write_time', sum(write_time), 'fsync_time', sum(fsync_time))::text
FROM pg_stat_io
WHERE object = 'relation' AND backend_type NOT IN ('checkpointer', 'background writer')
"""
# ... and, from 18 (which took wal_write and wal_sync out of pg_stat_wal), the WAL's writes
# and fsyncs ('normal': the WAL written as it is generated; 'init' fills new segments).
_IO_WAL_SQL = """
UNION ALL
SELECT 'pg_stat_io', 'wal', json_build_object(
    'writes', sum(writes), 'fsyncs', sum(fsyncs), 'write_bytes', sum(write_bytes),
    'write_time', sum(write_time), 'fsync_time', sum(fsync_time))::text
FROM pg_stat_io WHERE object = 'wal' AND context = 'normal'
"""


def snapshot_sql(server_version_num: int) -> str:
    """The snapshot query for a server of this version (server_version_num, e.g. 170010)."""
    sql = _COMMON_SQL
    if server_version_num >= 160000:
        sql += _IO_BACKENDS_SQL
    if server_version_num >= 170000:
        sql += _CHECKPOINTER_SQL
    if server_version_num >= 180000:
        sql += _IO_WAL_SQL
    return sql


# The server log's size, where the logging collector writes one (else this query fails, and
# is not asked again until the server restarts).
LOGDIR_SQL = (
    "SELECT 'pg_ls_logdir', NULL, json_build_object('bytes', coalesce(sum(size), 0))::text "
    "FROM pg_ls_logdir()"
)


class PgstatsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    interval_s: float = Field(1.0, gt=0, le=60, description="seconds between snapshots")
    reconnect_s: float = Field(30.0, ge=0)


class PgstatsCollector(PollingCollector):
    name = "pgstats"
    summary = "pg_stat_wal/bgwriter/checkpointer/io/database/replication snapshots each second"
    cost = "one query a second"
    default_in_runs = True
    Options = PgstatsOptions
    application_name = "pgscope-pgstats"

    options: PgstatsOptions

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        if env.conn is None:
            return Availability.yes()
        try:
            with env.conn.connect(application_name=cls.application_name) as session:
                session.execute(snapshot_sql(session.info.server_version)).fetchall()
        except psycopg.Error as exc:
            return Availability.no(
                f"cannot read the statistics views: {exc.diag.message_primary or exc}"
            )
        except Exception as exc:  # TargetError: unreachable
            return Availability.no(str(exc))
        return Availability.yes()

    def prepare(self, ctx: CollectorContext) -> None:
        ctx.store.create_tables(self.name)
        self.reconnect_s = self.options.reconnect_s
        self.snapshots = 0
        self.boundary_store = ctx.store  # the main thread's own handle
        self.logdir = True  # until pg_ls_logdir() says there is none

    def target_restarted(self) -> None:
        self.logdir = True  # settings changed: the logging collector may be on now

    def step_started(self, step: StepInfo) -> None:
        self._boundary(step, "start")

    def step_finished(self, step: StepInfo) -> None:
        self._boundary(step, "end")

    def window_edge(self, ending: StepInfo, starting: StepInfo) -> None:
        """One snapshot ends a window and begins the next: the windows share its instant."""
        self._boundary(ending, "end", starting)

    def _boundary(self, step: StepInfo, mark: str, starting: StepInfo | None = None) -> None:
        """A snapshot at a step's edge (and, given `starting`, the next one's start), from the
        runner's thread on a connection of its own (the periodic thread keeps its own)."""
        marks = [(step.step_id, mark)]
        if starting is not None:
            marks.append((starting.step_id, "start"))
        with self.ctx.conn.connect(application_name=self.application_name) as session:
            self._snapshot(session, self.boundary_store, marks)

    def run_loop(self) -> None:
        next_at = time.monotonic()
        while True:
            stopping = self.stop_event.wait(max(0.0, next_at - time.monotonic()))
            next_at += self.options.interval_s
            try:
                self._snapshot(self.session, self.store)
                self.snapshots += 1
            except psycopg.OperationalError as exc:
                if stopping or not self.reconnect(exc, f"{self.snapshots} snapshots"):
                    return
                next_at = time.monotonic()
            if stopping:
                return  # that was the final snapshot: the last step's window has an end

    def _rows(self, session: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
        rows = session.execute(snapshot_sql(session.info.server_version), prepare=True).fetchall()
        if self.logdir:
            try:
                rows += session.execute(LOGDIR_SQL).fetchall()
            except (psycopg.errors.UndefinedFile, psycopg.errors.InsufficientPrivilege):
                self.logdir = False  # no log directory (logging collector off), or no right
        return rows

    def _snapshot(
        self,
        session: psycopg.Connection[Any],
        store: RunStore,
        marks: Sequence[tuple[int | None, str | None]] = ((None, None),),
    ) -> None:
        """One reading of the views, stored once per (step, mark) it stands for."""
        rows = self._rows(session)
        ts_us = now_us()
        columns: dict[str, list[Any]] = {
            k: [] for k in ("ts_us", "source", "object", "counter", "value", "step_id", "mark")
        }
        for step_id, mark in marks:
            for source, obj, payload in rows:
                for counter, value in json.loads(payload).items():
                    if isinstance(value, bool) or not isinstance(value, int | float):
                        continue
                    columns["ts_us"].append(ts_us)
                    columns["source"].append(source)
                    columns["object"].append(obj)
                    columns["counter"].append(counter)
                    columns["value"].append(float(value))
                    columns["step_id"].append(step_id)
                    columns["mark"].append(mark)
        store.append("pgstats_counters", columns)
