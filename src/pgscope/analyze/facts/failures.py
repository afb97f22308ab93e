"""How the cell's transactions ended (pgbench's transaction log, after each one's last try):
the shares that failed, by kind, and that needed retries, over the cell's steps; attempted
against effective (succeeded) throughput; and the steps whose clients pgbench aborted on an
error of the workload's own SQL, with the server's message. The largest cause is
`xact.cause.<kind>` (serialization, deadlock, other, workload_error), named in its label: a
finding's title quotes it.

And as the server saw them, whoever ran them (a workload pgscope does not drive, in
`observe`): the share of transactions pg_stat_database counted as rolled back (a client's own
ROLLBACK too), the deadlocks it detected, and the errors the server logged by kind (the
serverlog collector). Where no pgbench log says how transactions ended, the server's log
does: the failed share is its errors (never more than the rollbacks) of the transactions
counted, by kind."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from pgscope.analyze.facts import CellFacts, FactKind, FactSheet, Family
from pgscope.duck import Queryable

LOG = "pgbench's transaction log, or the serverlog collector (a workload pgscope watches)"
SOURCES = ("pgbench log", "serverlog")
PGSTATS = "the pgstats collector (pg_stat_database)"
FAILED = FactKind(
    "xact.failed_share", "share", "transactions that failed (after their last try)", LOG, SOURCES
)
SERIALIZATION = FactKind(
    "xact.serialization_share",
    "share",
    "transactions that failed on a serialization error (SQLSTATE 40001)",
    LOG,
    SOURCES,
)
DEADLOCK = FactKind(
    "xact.deadlock_share",
    "share",
    "transactions that failed on a deadlock (SQLSTATE 40P01)",
    LOG,
    SOURCES,
)
RETRIED = FactKind(
    "xact.retried_share",
    "share",
    "transactions that needed more than one try (pgbench --max-tries)",
    LOG,
    SOURCES,
)
ATTEMPTED_TPS = FactKind(
    "xact.attempted_tps",
    "tps",
    "transactions attempted per second (succeeded or failed)",
    LOG,
    SOURCES,
)
EFFECTIVE_TPS = FactKind(
    "xact.effective_tps", "tps", "transactions that succeeded per second", LOG, SOURCES
)
WORKLOAD_ERROR = FactKind(
    "xact.workload_error",
    "share",
    "share of the steps that pgbench ended on an error of the workload's SQL",
    LOG,
    SOURCES,
)
CAUSE = FactKind(
    "xact.cause.<kind>",
    "share",
    "the largest cause of failed transactions, in words",
    LOG,
    SOURCES,
)


ROLLBACK = FactKind(
    "xact.rollback_share",
    "share",
    "transactions that ended in a rollback (pg_stat_database: a client's own ROLLBACK, and "
    "every transaction an error ended)",
    PGSTATS,
    ("pgstats",),
)
DEADLOCKS = FactKind(
    "server.deadlocks", "count", "deadlocks the server detected (pg_stat_database)", PGSTATS,
    ("pgstats",),
)  # fmt: skip
LOGGED = FactKind(
    "server.errors.<kind>",
    "count",
    "errors the server logged, of one kind (serialization, deadlock, lock_timeout, "
    "statement_timeout, other)",
    "the serverlog collector",
    ("serverlog",),
)
# The server log's kinds, as the pgbench log's: how failed transactions are named.
_LOGGED_CAUSES = {
    "serialization": "serialization failures",
    "deadlock": "deadlocks",
    "lock_timeout": "lock timeouts",
    "statement_timeout": "statement timeouts",
    "other": "other errors",
}

# Each read of the log counted the lines written since the read before: a window takes the
# part of that span it overlaps (a read made late, or the last one, holds lines of the
# window before it). Rows of a store before version 10 have no span: the second of
# their read decides.
_LOGGED_SQL = """
SELECT s.step_id, e.kind, sum(CASE
    WHEN e.from_us IS NULL OR e.to_us <= e.from_us
        THEN CASE WHEN e.second_us >= s.window_start_us AND e.second_us < s.window_end_us
                  THEN e.errors ELSE 0 END
    ELSE e.errors * greatest(0, least(e.to_us, s.window_end_us)
                                - greatest(e.from_us, s.window_start_us))
         / (e.to_us - e.from_us)
    END) AS n
FROM steps s JOIN server_errors e
  ON coalesce(e.from_us, e.second_us) < s.window_end_us
 AND coalesce(e.to_us, e.second_us + 1) > s.window_start_us
GROUP BY ALL
"""


@dataclass(frozen=True)
class ServerSide:
    """One step as the server counted it: commits and rollbacks (every database), deadlocks,
    and the errors it logged by kind (None: the serverlog collector did not run)."""

    commits: float | None
    rollbacks: float | None
    deadlocks: float | None
    errors: dict[str, int] | None


class FailureFamily(Family):
    name = "failures"
    order = 20

    def read(self, store: Queryable) -> dict[int, ServerSide] | None:
        """Per step, what pg_stat_database counted between its edges, and the errors the
        server logged inside its measured window."""
        counted: dict[int, dict[str, float]] = {}
        if store.has_table("pgstats_counters"):
            for row in store.query(
                "SELECT step_id, counter, sum(CASE WHEN mark = 'end' THEN value ELSE -value "
                "END) AS grew FROM (SELECT step_id, mark, counter, sum(value) AS value "
                "FROM pgstats_counters WHERE source = 'pg_stat_database' AND counter IN "
                "('xact_commit', 'xact_rollback', 'deadlocks') AND step_id IS NOT NULL "
                "GROUP BY ALL) GROUP BY ALL HAVING count(DISTINCT mark) = 2"
            ):
                counted.setdefault(int(row["step_id"]), {})[str(row["counter"])] = row["grew"]
        logged: dict[int, dict[str, int]] | None = None
        if store.has_table("server_errors") and store.query(
            "SELECT 1 FROM collectors WHERE name = 'serverlog' AND status IS DISTINCT FROM "
            "'failed' AND available LIMIT 1"
        ):
            logged = {}
            for row in store.query(_LOGGED_SQL):
                if n := round(row["n"] or 0):
                    logged.setdefault(int(row["step_id"]), {})[str(row["kind"])] = n
        if not counted and logged is None:
            return None
        steps = set(counted) | set(logged or {})
        if logged is not None:
            steps |= {int(r["step_id"]) for r in store.query("SELECT step_id FROM steps")}
        return {
            step: ServerSide(
                counted.get(step, {}).get("xact_commit"),
                counted.get(step, {}).get("xact_rollback"),
                counted.get(step, {}).get("deadlocks"),
                None if logged is None else logged.get(step, {}),
            )
            for step in steps
        }

    def fill(self, sheet: FactSheet, cell: CellFacts) -> None:
        self._pgbench(sheet, cell)
        self._server(sheet, cell)

    def _server(self, sheet: FactSheet, cell: CellFacts) -> None:
        """The transactions' ends as the server counted them, and, where no pgbench log said
        how they ended, the failures its log named."""
        evidence: dict[int, ServerSide] = cell.evidence.get(self.name) or {}
        sides = [
            evidence[s.step_id]
            for s in cell.steps()
            if s.step_id in evidence and s.status in ("ok", "errors", "mixed")
        ]
        if not sides:
            return
        counted = [x for x in sides if x.commits is not None and x.rollbacks is not None]
        xacts = sum((x.commits or 0) + (x.rollbacks or 0) for x in counted)
        rollbacks = sum(x.rollbacks or 0 for x in counted)
        if xacts > 0:
            sheet.add(
                ROLLBACK,
                rollbacks / xacts,
                f"transactions that ended in a rollback {cell.where} (pg_stat_database: "
                f"{rollbacks:,.0f} of {xacts:,.0f})",
            )
        deadlocks = [x.deadlocks for x in sides if x.deadlocks is not None]
        if deadlocks:
            sheet.add(DEADLOCKS, sum(deadlocks), f"deadlocks the server detected {cell.where}")
        logs = [x.errors for x in sides if x.errors is not None]
        if not logs:
            return
        errors: dict[str, int] = {}
        for log in logs:
            for kind, n in log.items():
                errors[kind] = errors.get(kind, 0) + n
        for kind, n in sorted(errors.items()):
            sheet.add(
                LOGGED,
                n,
                f"{_LOGGED_CAUSES.get(kind, kind)} the server logged {cell.where}",
                thing=kind,
            )
        if sheet.value(FAILED.name) is not None or not xacts:
            return  # pgbench's log said how its transactions ended
        ended = min(sum(errors.values()), rollbacks)
        failed = ended / xacts
        of = f"share of the {xacts:,.0f} transactions the server counted {cell.where}"
        sheet.add(
            FAILED,
            failed,
            f"transactions that failed on an error the server logged ({ended:,.0f}), {of}",
            source="serverlog",
        )
        serialization = errors.get("serialization", 0)
        sheet.add(
            SERIALIZATION,
            min(serialization, rollbacks) / xacts,
            f"transactions that failed on a serialization error the server logged "
            f"({serialization:,}), {of}",
            source="serverlog",
        )
        deadlock = max(errors.get("deadlock", 0), int(sum(deadlocks)))
        sheet.add(
            DEADLOCK,
            min(deadlock, rollbacks) / xacts,
            f"transactions that failed on a deadlock ({deadlock:,}), {of}",
            source="serverlog",
        )
        kind, n = max(errors.items(), key=lambda kv: (kv[1], kv[0]), default=("", 0))
        if n and failed > 0:
            sheet.add(
                CAUSE,
                min(n, rollbacks) / xacts,
                f"{_LOGGED_CAUSES.get(kind, kind)} ({n:,} logged by the server)",
                thing=kind if kind in ("serialization", "deadlock") else "other",
                source="serverlog",
            )

    def _pgbench(self, sheet: FactSheet, cell: CellFacts) -> None:
        steps = cell.steps()
        measured = [s for s in steps if s.status in ("ok", "errors")]
        counted = [(s, a) for s in measured if (a := s.attempted_xacts) is not None]
        attempted = sum(a for _, a in counted)
        causes: list[tuple[float, str, str]] = []  # (share, kind, in words)
        if attempted:

            def share(values: list[int | None]) -> float:
                return sum(v or 0 for v in values) / attempted

            succeeded = sum(s.succeeded_xacts or 0 for s, _ in counted)
            kinds = {
                "serialization": share([s.failed_serialization for s, _ in counted]),
                "deadlock": share([s.failed_deadlock for s, _ in counted]),
                "other": share([s.failed_other for s, _ in counted]),
            }
            of = f"share of those attempted {cell.where}"
            sheet.add(FAILED, 1 - succeeded / attempted, f"{FAILED.label}, {of}")
            sheet.add(SERIALIZATION, kinds["serialization"], f"{SERIALIZATION.label}, {of}")
            sheet.add(DEADLOCK, kinds["deadlock"], f"{DEADLOCK.label}, {of}")
            sheet.add(
                RETRIED, share([s.retried_xacts for s, _ in counted]), f"{RETRIED.label}, {of}"
            )
            causes += [
                (kinds["serialization"], "serialization", "serialization failures"),
                (kinds["deadlock"], "deadlock", "deadlocks"),
                (kinds["other"], "other", "other errors"),
            ]
            rates = [
                (a / seconds, (s.succeeded_xacts or 0) / seconds)
                for s, a in counted
                if s.window_start_us is not None
                and s.window_end_us is not None
                and (seconds := (s.window_end_us - s.window_start_us) / 1e6) > 0
            ]
            if rates:
                sheet.add(
                    ATTEMPTED_TPS,
                    statistics.fmean(r[0] for r in rates),
                    f"{ATTEMPTED_TPS.label} {cell.where}",
                )
                sheet.add(
                    EFFECTIVE_TPS,
                    statistics.fmean(r[1] for r in rates),
                    f"{EFFECTIVE_TPS.label} {cell.where}",
                )
        errored = [s for s in steps if s.workload_error]
        if errored:
            quoted = '"' + " ".join((errored[0].workload_error or "").split()) + '"'
            every = len(errored) == len(steps) and not any(s.succeeded_xacts for s in steps)
            sheet.add(
                WORKLOAD_ERROR,
                len(errored) / len(steps),
                f"every transaction fails: {quoted}"
                if every
                else f"share of the steps {cell.where} that pgbench ended on an error of the "
                f"workload's SQL: {quoted}",
            )
            causes.append((len(errored) / len(steps), "workload_error", quoted))
        value, kind, name = max(causes, default=(0.0, "", ""))
        if value > 0:
            sheet.add(CAUSE, value, name, thing=kind)
