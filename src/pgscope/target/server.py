"""Existing-server target: a user's PostgreSQL reached by DSN.

pgscope never changes such a server's settings (variants are embedded-only), and creates
tables or runs write workloads only with --allow-writes. Without it, pgbench sessions run with
default_transaction_read_only=on, so the server itself rejects a write a script attempts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import psycopg

from pgscope.errors import RefusedError, TargetError
from pgscope.target.conn import ConnParams


@dataclass
class ExistingServer:
    conn: ConnParams
    allow_writes: bool

    def check_reachable(self) -> None:
        """Connect once now, so an unreachable DSN fails before anything else happens.

        A password libpq found on its own (~/.pgpass) is kept for pgbench and psql: they run as
        an unprivileged account, which cannot read pgscope's user's files."""
        with self.conn.connect() as conn:
            conn.execute("SELECT 1")
            used = conn.info.password
        if used and not self.conn.password:
            self.conn = replace(self.conn, password=used)

    def is_alive(self) -> bool:
        try:
            with self.conn.connect() as conn:
                conn.execute("SELECT 1")
        except (TargetError, psycopg.Error):
            return False
        return True

    def refuse_settings(self, settings: dict[str, str], where: str) -> None:
        if settings:
            names = ", ".join(sorted(settings))
            raise RefusedError(
                f"{where} sets {names}, but pgscope never changes settings on an existing "
                f"server (--dsn); variants and settings are for embedded clusters only: "
                f"drop --dsn to run them on a throw-away cluster"
            )
