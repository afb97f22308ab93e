"""`runs --from`: a repository's runs, newest first, as `runs --json` lists a folder's. Apart
from read.py, whose run stores need DuckDB: a listing is one query, and its command should
start as fast as one (docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg


@dataclass(frozen=True)
class Filters:
    server: str | None = None  # a host, host:port, system identifier or server id
    since_us: int | None = None
    until_us: int | None = None
    verdict: str | None = None  # words of the verdict, or a finding's id
    limit: int | None = None


LIST = """
SELECT r.run_id, r.run_dir, r.name, r.started_us, r.target, r.workload, r.scale, r.clients,
       r.best_tps, r.verdict, r.recipe, r.status, r.status_reason, r.steps, r.steps_ok,
       r.server_version, r.state, r.pushed_at, s.server_id, s.system_identifier, s.host,
       s.port
FROM pgscope.runs r JOIN pgscope.servers s USING (server_id)
WHERE r.pushed_at IS NOT NULL
  AND (%(server)s::text IS NULL OR s.host = %(server)s
       OR s.host || ':' || s.port = %(server)s
       OR s.system_identifier::text = %(server)s OR s.server_id::text = %(server)s)
  AND (%(since)s::bigint IS NULL OR r.started_us >= %(since)s)
  AND (%(until)s::bigint IS NULL OR r.started_us < %(until)s)
  AND (%(verdict)s::text IS NULL OR r.verdict ILIKE '%%' || %(verdict)s || '%%'
       OR %(verdict)s = ANY (r.finding_ids))
ORDER BY r.started_us DESC NULLS LAST, r.run_id DESC
LIMIT %(limit)s
"""


def list_runs(session: psycopg.Connection[Any], filters: Filters) -> list[dict[str, Any]]:
    """The runs, newest first, as `runs --json` lists a folder's (docs/json.md), each with
    its server and whether its push is complete."""
    params = {
        "server": filters.server,
        "since": filters.since_us,
        "until": filters.until_us,
        "verdict": filters.verdict,
        "limit": filters.limit,
    }
    with session.cursor() as cursor:
        cursor.execute(LIST, params)
        names = [d.name for d in cursor.description or []]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return [_listed(row) for row in rows]


def _listed(row: dict[str, Any]) -> dict[str, Any]:
    import time

    started = row["started_us"]
    best = row["best_tps"]
    return {
        "name": row["name"],
        "date": None
        if started is None
        else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started / 1e6)),
        "target": row["target"],
        "workload": row["workload"],
        "scale": row["scale"],
        "clients": list(row["clients"] or []),
        "best_tps": None if best is None else float(best),
        "verdict": row["verdict"],
        "run_id": row["run_id"],
        "run_dir": row["run_dir"],
        "recipe": row["recipe"],
        "status": row["status"],
        "status_reason": row["status_reason"],
        "steps": row["steps"],
        "steps_ok": row["steps_ok"],
        "started_us": started,
        "server_version": row["server_version"],
        "server": {
            "server_id": row["server_id"],
            "system_identifier": None
            if row["system_identifier"] is None
            else str(row["system_identifier"]),
            "host": row["host"],
            "port": row["port"],
        },
        "pushed": row["state"],
        "pushed_at": row["pushed_at"].isoformat() if row["pushed_at"] else None,
    }
