"""pg_wait_sampling's history, read incrementally: a second wait-event source for comparison.

pg_wait_sampling samples wait events inside the server (every `history_period` ms, into a ring
buffer of `history_size` entries). This collector copies the entries newer than the last one it
read, twice a second, and records a gap when the ring wrapped before it could read it. The
Debian 1.1 build records waiting processes only: there is no CPU bucket.

On an embedded cluster it preloads the extension (a restart-time setting) with a 10 ms period
and a history large enough for a second of many sessions. On a user's server it only reads, and
only where the extension is installed in the connected database.

Costs: the extension's own in-server sampling (measured with it: docs/benchmarks.md), plus one
query every 0.5 s that copies the ring buffer.
"""

from __future__ import annotations

import psycopg
from pydantic import BaseModel, ConfigDict, Field

from pgscope.collect.base import Availability, CollectorContext, CollectorEnv
from pgscope.collect.polling import PollingCollector
from pgscope.errors import TargetError

HISTORY_SQL = (
    "SELECT (extract(epoch FROM ts) * 1000000)::bigint, pid, event_type, event, queryid "
    "FROM pg_wait_sampling_history WHERE ts > to_timestamp(%s / 1000000.0) ORDER BY ts"
)


class PgwsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    period_ms: int = Field(
        10, ge=1, le=1000, description="in-server sampling period (embedded clusters only)"
    )
    history_size: int = Field(
        100_000, ge=1000, description="ring buffer entries (embedded clusters only)"
    )
    poll_s: float = Field(0.5, gt=0, le=10, description="how often the ring is copied")
    reconnect_s: float = Field(30.0, ge=0)


class PgwsCollector(PollingCollector):
    name = "pgws"
    summary = "pg_wait_sampling's in-server wait samples, for comparison with `activity`"
    cost = "the extension's sampling plus one ring-buffer copy per 0.5 s"
    default_in_runs = False
    Options = PgwsOptions
    application_name = "pgscope-pgws"

    options: PgwsOptions

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        if env.conn is None:  # embedded: the package must be installed on this host
            control = env.pg.sharedir() / "extension" / "pg_wait_sampling.control"
            if not control.is_file():
                return Availability.no(
                    f"pg_wait_sampling is not installed ({control} missing); fix: apt-get "
                    f"install postgresql-{env.pg.major_version()}-pg-wait-sampling"
                )
            return Availability.yes()
        try:
            with env.conn.connect(application_name=cls.application_name) as session:
                installed = session.execute(
                    "SELECT 1 FROM pg_extension WHERE extname = 'pg_wait_sampling'"
                ).fetchone()
                if installed is None:
                    return Availability.no(
                        "pg_wait_sampling is not installed in this database; fix: add it to "
                        "shared_preload_libraries, restart, CREATE EXTENSION pg_wait_sampling"
                    )
                session.execute("SELECT count(*) FROM pg_wait_sampling_current")
        except TargetError as exc:
            return Availability.no(str(exc))
        except psycopg.Error as exc:
            return Availability.no(
                f"pg_wait_sampling cannot be read: {exc.diag.message_primary or exc}"
            )
        return Availability.yes()

    def startup_settings(self, env: CollectorEnv) -> dict[str, str]:
        if env.target_kind != "embedded":
            return {}
        return {
            "shared_preload_libraries": "pg_wait_sampling",
            "pg_wait_sampling.history_period": str(self.options.period_ms),
            "pg_wait_sampling.profile_period": str(self.options.period_ms),
            "pg_wait_sampling.history_size": str(self.options.history_size),
        }

    def prepare(self, ctx: CollectorContext) -> None:
        ctx.store.create_tables(self.name)
        self.reconnect_s = self.options.reconnect_s
        self.entries = 0
        if ctx.env.target_kind == "embedded":
            with ctx.conn.connect(application_name=self.application_name) as session:
                session.execute("CREATE EXTENSION IF NOT EXISTS pg_wait_sampling")

    def run_loop(self) -> None:
        last_us = None
        while not self.stop_event.wait(self.options.poll_s if last_us is not None else 0):
            try:
                rows = self.session.execute(
                    HISTORY_SQL, (last_us if last_us is not None else 0,), prepare=True
                ).fetchall()
            except psycopg.OperationalError as exc:
                if not self.reconnect(exc, f"{self.entries} history entries"):
                    return
                continue
            if last_us is None:  # the first read only sets the starting point
                last_us = rows[-1][0] if rows else 0
                continue
            if rows:
                self.entries += len(rows)
                self.store.append(
                    "pgws_history",
                    {
                        "ts_us": [r[0] for r in rows],
                        "pid": [r[1] for r in rows],
                        "event_type": [r[2] for r in rows],
                        "event": [r[3] for r in rows],
                        "query_id": [r[4] for r in rows],
                    },
                )
                if len(rows) >= self.options.history_size:
                    self.store.add_gap(
                        self.name, last_us, rows[0][0], "the history ring wrapped between two reads"
                    )
                last_us = rows[-1][0]
