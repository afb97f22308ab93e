"""How the cell's transactions ended (pgbench's transaction log, after each one's last try):
the shares that failed, by kind, and that needed retries, over the cell's steps; attempted
against effective (succeeded) throughput; and the steps whose clients pgbench aborted on an
error of the workload's own SQL, with the server's message. The largest cause is
`xact.cause.<kind>` (serialization, deadlock, other, workload_error), named in its label: a
finding's title quotes it."""

from __future__ import annotations

import statistics

from pgscope.analyze.facts import CellFacts, FactKind, FactSheet, Family

LOG = "pgbench's transaction log"
SOURCES = ("pgbench log",)
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


class FailureFamily(Family):
    name = "failures"
    order = 20

    def fill(self, sheet: FactSheet, cell: CellFacts) -> None:
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
