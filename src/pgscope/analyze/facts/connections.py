"""Facts about connecting, per cell: what each transaction paid to get a connection, seen
from three sides that would disagree if the cost were not there.

- pgbench: its connection time per transaction against the transaction's latency, which
  leaves that time out (`conn.time_share`: the share of each client's time spent connecting);
- the server: sessions started per transaction and their mean lifetime (pg_stat_database,
  PostgreSQL 14+): a connection per transaction starts a backend per transaction, each living
  a few milliseconds;
- the host: the server's CPU time per transaction, which forking a backend, authenticating
  it and filling its catalog caches multiply.
"""

from __future__ import annotations

import statistics

from pgscope.analyze.facts import CellFacts, FactKind, FactSheet, Family

PGBENCH = "pgbench's summary (its connection time)"
SESSIONS = "the pgstats collector (pg_stat_database.sessions, PostgreSQL 14+)"
MS_PER_XACT = FactKind(
    "conn.ms_per_xact", "ms", "connection time per transaction", PGBENCH, ("pgbench",)
)
TIME_SHARE = FactKind(
    "conn.time_share", "share", "clients' time spent connecting", PGBENCH, ("pgbench",)
)
SESSIONS_PER_XACT = FactKind(
    "conn.sessions_per_xact",
    "ratio",
    "sessions the server started per transaction (pg_stat_database.sessions)",
    SESSIONS,
    ("pgstats",),
)
SESSION_MS = FactKind(
    "conn.session_ms",
    "ms",
    "session time per session started (pg_stat_database.session_time / sessions)",
    SESSIONS,
    ("pgstats",),
)
SERVER_CPU_MS = FactKind(
    "conn.server_cpu_ms_per_xact",
    "ms",
    "the server's CPU time per transaction (backends, and the postmaster forking them)",
    "the host collector",
    ("host",),
)


class ConnectionFamily(Family):
    name = "connections"
    order = 110

    def fill(self, sheet: FactSheet, cell: CellFacts) -> None:
        steps = [s for s in cell.steps() if s.status == "ok"]
        timed = [
            (s.connection_ms, s.latency_ms.mean)
            for s in steps
            if s.connection_ms is not None and s.latency_ms.mean is not None
        ]
        if timed:
            connecting = statistics.fmean(c for c, _ in timed)
            reconnects = any(s.reconnects for s in steps)
            how = "a new connection per transaction" if reconnects else "one connection per client"
            sheet.add(MS_PER_XACT, connecting, f"{MS_PER_XACT.label}, {how}, {cell.where}")
            sheet.add(
                TIME_SHARE,
                statistics.fmean(c / (c + lat) if c + lat > 0 else 0.0 for c, lat in timed),
                f"{TIME_SHARE.label}, {how}, {cell.where}",
            )
        ids = cell.step_ids
        counted = [c for c in cell.analysis.counters if c.step_id in ids]
        per_xact = [v for c in counted if (v := c.sessions_per_xact) is not None]
        if per_xact:
            sheet.add(
                SESSIONS_PER_XACT,
                statistics.fmean(per_xact),
                f"{SESSIONS_PER_XACT.label} {cell.where}",
            )
        lifetimes = [v for c in counted if (v := c.mean_session_ms) is not None]
        if lifetimes:
            sheet.add(SESSION_MS, statistics.fmean(lifetimes), f"{SESSION_MS.label} {cell.where}")
        row = next((h for h in cell.analysis.cpu.host if cell.owns(h)), None)
        if row is None or row.server is None or not row.cpus:
            return
        windows = [
            ((s.window_end_us - s.window_start_us) / 1e6, s.xacts)
            for s in steps
            if s.window_start_us is not None and s.window_end_us is not None and s.xacts
        ]
        seconds, xacts = sum(w for w, _ in windows), sum(x for _, x in windows)
        if seconds > 0 and xacts:
            sheet.add(
                SERVER_CPU_MS,
                row.server * row.cpus * seconds * 1000 / xacts,
                f"{SERVER_CPU_MS.label} {cell.where}",
            )
