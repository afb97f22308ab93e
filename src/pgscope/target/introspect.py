"""Questions asked of any server, embedded or not: version, settings, pgbench tables."""

from __future__ import annotations

import platform
from typing import Any

import psycopg

from pgscope.store import ServerIdentity


def server_version(conn: psycopg.Connection[Any]) -> tuple[str, int]:
    row = conn.execute("SELECT version(), current_setting('server_version_num')::int").fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


def server_identity(conn: psycopg.Connection[Any]) -> ServerIdentity:
    """Which server this is, as a central repository files its runs: its system identifier
    (pg_control_system(), which PostgreSQL lets every role call: None where a DBA revoked
    that), the host as the connection
    named it (this machine's name over a Unix socket), and the port the server listens on."""
    try:
        row = conn.execute("SELECT system_identifier FROM pg_control_system()").fetchone()
        system_identifier = None if row is None or row[0] is None else int(row[0])
    except psycopg.errors.InsufficientPrivilege:
        if not conn.autocommit:
            conn.rollback()
        system_identifier = None
    port = conn.execute("SELECT current_setting('port')::int").fetchone()
    host = conn.info.host
    if not host or host.startswith(("/", "@")):  # a socket: this host's server
        host = platform.node()
    return ServerIdentity(system_identifier, host, None if port is None else int(port[0]))


def non_default_settings(conn: psycopg.Connection[Any]) -> list[tuple[str, str, str, str]]:
    """(name, setting, unit, source) of every setting not at its built-in default."""
    rows = conn.execute(
        "SELECT name, setting, coalesce(unit, ''), source FROM pg_settings "
        "WHERE source NOT IN ('default', 'override') ORDER BY name"
    ).fetchall()
    return [(str(a), str(b), str(c), str(d)) for a, b, c, d in rows]
