"""Questions asked of any server, embedded or not: version, settings, pgbench tables."""

from __future__ import annotations

from typing import Any

import psycopg


def server_version(conn: psycopg.Connection[Any]) -> tuple[str, int]:
    row = conn.execute("SELECT version(), current_setting('server_version_num')::int").fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


def non_default_settings(conn: psycopg.Connection[Any]) -> list[tuple[str, str, str, str]]:
    """(name, setting, unit, source) of every setting not at its built-in default."""
    rows = conn.execute(
        "SELECT name, setting, coalesce(unit, ''), source FROM pg_settings "
        "WHERE source NOT IN ('default', 'override') ORDER BY name"
    ).fetchall()
    return [(str(a), str(b), str(c), str(d)) for a, b, c, d in rows]
