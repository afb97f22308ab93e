"""Existing-server target: a user's PostgreSQL reached by DSN.

pgscope never changes such a server's settings (variants are embedded-only), and creates
tables or runs write workloads only with --allow-writes. Without it, a user's scripts run only
as a role that cannot write (target/privileges.py), and pgbench sessions run with
default_transaction_read_only=on, so the server itself rejects a write a script attempts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from pgscope.errors import RefusedError, TargetError
from pgscope.labels import READ_ONLY_OPTION
from pgscope.target.conn import ConnParams
from pgscope.target.privileges import write_privilege


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
            self.conn = self.conn.with_password(used)

    def is_alive(self) -> bool:
        try:
            with self.conn.connect() as conn:
                conn.execute("SELECT 1")
        except (TargetError, psycopg.Error):
            return False
        return True

    def write_privilege(self) -> str | None:
        """What the connecting role could do beyond reading (target/privileges.py), or None.
        Asked in a session that cannot write: read-only from its start (the guard pgbench's
        sessions get, last in `options`), the question in a read-only transaction with the
        search path pinned to pg_catalog."""
        own = (self.conn.params.get("options") or "").strip()
        options = f"{own} {READ_ONLY_OPTION}" if own else READ_ONLY_OPTION
        with self.conn.connect(options=options) as session:
            return write_privilege(session)

    def check_privileges(self, needs: Mapping[str, Sequence[str]], why: str) -> None:
        """Raise TargetError naming the GRANT when the connecting role lacks one of `needs`
        (table -> privileges) on a table that exists (one that does not is another error)."""
        with self.conn.connect() as session:
            missing: dict[str, list[str]] = {}
            for table, privileges in needs.items():
                for privilege in privileges:
                    # Qualified: the role's search path finds the table, never a function.
                    row = session.execute(
                        "SELECT CASE WHEN pg_catalog.to_regclass(%s) IS NULL THEN true "
                        "ELSE pg_catalog.has_table_privilege(pg_catalog.to_regclass(%s), %s) END",
                        [table, table, privilege],
                    ).fetchone()
                    if row is not None and not row[0]:
                        missing.setdefault(table, []).append(privilege)
            if missing:
                raise missing_grants(current_role(session), missing, why)

    def refuse_settings(self, settings: dict[str, str], where: str) -> None:
        if settings:
            names = ", ".join(sorted(settings))
            raise RefusedError(
                f"{where} sets {names}, but pgscope never changes settings on an existing "
                f"server (--dsn); variants and settings are for embedded clusters only: "
                f"drop --dsn to run them on a throw-away cluster"
            )


def current_role(session: psycopg.Connection[Any]) -> str:
    """The session's role as a GRANT statement names it."""
    row = session.execute("SELECT pg_catalog.quote_ident(current_user)").fetchone()
    return str(row[0]) if row else "CURRENT_USER"


def missing_grants(role: str, missing: Mapping[str, Sequence[str]], why: str) -> TargetError:
    """One line that names what `role` lacks (table -> privileges) and the GRANTs that give it:
    `role mon cannot read pgbench_branches (why): GRANT SELECT ON pgbench_branches TO mon`."""
    if all(list(privileges) == ["SELECT"] for privileges in missing.values()):
        lacks = f"cannot read {', '.join(missing)}"
    else:
        lacks = "lacks " + ", ".join(f"{'/'.join(p)} on {t}" for t, p in missing.items())
    by_privileges: dict[str, list[str]] = {}
    for table, privileges in missing.items():
        by_privileges.setdefault(", ".join(privileges), []).append(table)
    grants = "; ".join(
        f"GRANT {privileges} ON {', '.join(tables)} TO {role}"
        for privileges, tables in by_privileges.items()
    )
    return TargetError(f"role {role} {lacks} ({why}): {grants}")
