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

from pgscope.analyze.model import FactSheet, RunAnalysis, Step
from pgscope.words import n_clients

SOURCE = "pgbench"


def connection_facts(sheet: FactSheet, analysis: RunAnalysis, variant: str, n: int) -> None:
    steps = [
        s for s in analysis.steps if s.variant == variant and s.clients == n and s.status == "ok"
    ]
    timed = [
        (s.connection_ms, s.latency_ms.mean)
        for s in steps
        if s.connection_ms is not None and s.latency_ms.mean is not None
    ]
    if timed:
        connecting = statistics.fmean(c for c, _ in timed)
        reconnects = any(s.reconnects for s in steps)
        how = "a new connection per transaction" if reconnects else "one connection per client"
        sheet.add(
            "conn.ms_per_xact",
            connecting,
            "ms",
            SOURCE,
            f"connection time per transaction, {how}, at {n_clients(n)}",
        )
        sheet.add(
            "conn.time_share",
            statistics.fmean(c / (c + lat) if c + lat > 0 else 0.0 for c, lat in timed),
            "share",
            SOURCE,
            f"clients' time spent connecting, {how}, at {n_clients(n)}",
        )
    _server_facts(sheet, analysis, variant, n)
    _cpu_facts(sheet, analysis, variant, n, steps)


def _server_facts(sheet: FactSheet, analysis: RunAnalysis, variant: str, n: int) -> None:
    counted = [c for c in analysis.counters if c.variant == variant and c.clients == n]
    per_xact = [v for c in counted if (v := c.sessions_per_xact) is not None]
    if per_xact:
        sheet.add(
            "conn.sessions_per_xact",
            statistics.fmean(per_xact),
            "ratio",
            "pgstats",
            f"sessions the server started per transaction (pg_stat_database.sessions) at "
            f"{n_clients(n)}",
        )
    lifetimes = [v for c in counted if (v := c.mean_session_ms) is not None]
    if lifetimes:
        sheet.add(
            "conn.session_ms",
            statistics.fmean(lifetimes),
            "ms",
            "pgstats",
            f"session time per session started (pg_stat_database.session_time / sessions) "
            f"at {n_clients(n)}",
        )


def _cpu_facts(
    sheet: FactSheet, analysis: RunAnalysis, variant: str, n: int, steps: list[Step]
) -> None:
    row = next((h for h in analysis.cpu.host if h.variant == variant and h.clients == n), None)
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
            "conn.server_cpu_ms_per_xact",
            row.server * row.cpus * seconds * 1000 / xacts,
            "ms",
            "host",
            f"the server's CPU time per transaction (backends, and the postmaster forking "
            f"them) at {n_clients(n)}",
        )
