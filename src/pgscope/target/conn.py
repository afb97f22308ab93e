"""Connection parameters shared by psycopg (our queries) and pgbench (the load).

The password travels only in the environment (PGPASSWORD), never in argv: a process title
is readable by every user of the host.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgscope.errors import TargetError, UsageError

CONNECT_TIMEOUT_S = 10
APPLICATION_NAME = "pgscope"
# The server processes of pgscope's own sessions, by pid, as they connect: the sampler that
# reads the server's memory (collect/activitymem.py) leaves them out even when they end before
# it has asked their application_name (a collector's one-statement session at a window edge,
# seen as a ninth client).
OWN_BACKENDS: set[int] = set()


@dataclass(frozen=True)
class ConnParams:
    params: dict[str, str] = field(default_factory=dict)  # libpq keywords, no password
    password: str | None = None

    @classmethod
    def from_dsn(cls, dsn: str, where: str = "--dsn") -> ConnParams:
        """Parse a connection string; `where` names its source in errors (--dsn, a file)."""
        try:
            dsn.encode("utf-8")
        except UnicodeEncodeError as exc:
            # Bytes that are not UTF-8 reach Python's argv as lone surrogates; libpq wants
            # text it can send, so say which byte, not a codec's traceback.
            byte = ord(dsn[exc.start]) & 0xFF
            raise UsageError(
                f"{where}: not a valid connection string: byte 0x{byte:02x} at position "
                f"{exc.start} is not UTF-8 text"
            ) from None
        try:
            params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
        except psycopg.ProgrammingError as exc:
            raise UsageError(f"{where}: not a valid connection string: {exc}") from None
        password = params.pop("password", None)
        return cls(params, password)

    @property
    def dbname(self) -> str:
        return self.params.get("dbname", "")

    def conninfo(self) -> str:
        """The libpq connection string without the password (safe to show and store)."""
        return make_conninfo(**self.params)

    def env(self) -> dict[str, str]:
        """Environment additions for libpq programs (pgbench, psql)."""
        return {"PGPASSWORD": self.password} if self.password else {}

    def connect(
        self,
        *,
        autocommit: bool = True,
        application_name: str = APPLICATION_NAME,
        options: str | None = None,
    ) -> psycopg.Connection[tuple[Any, ...]]:
        kwargs: dict[str, object] = dict(self.params)
        kwargs.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
        kwargs.setdefault("application_name", application_name)
        if self.password:
            kwargs["password"] = self.password
        if options:
            kwargs["options"] = options
        try:
            session = psycopg.connect(autocommit=autocommit, **kwargs)  # type: ignore[arg-type]
        except psycopg.OperationalError as exc:
            reason = str(exc).strip() or "no reason given"
            raise TargetError(f"cannot connect to {self.conninfo()}: {reason}") from None
        OWN_BACKENDS.add(session.info.backend_pid)
        if autocommit:
            _untracked(session)
        return session


def _untracked(session: psycopg.Connection[Any]) -> None:
    """pgscope's own statements stay out of pg_stat_statements, out of the plans auto_explain
    samples and out of the functions' counts, where the session may say so (a superuser's,
    as on an embedded cluster): they are not the workload's."""
    # On a user's server, as an unprivileged role, it may not: its statements are counted.
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        session.execute("SET pg_stat_statements.track = 'none'")
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        session.execute("SET auto_explain.sample_rate = 0")
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        session.execute("SET track_functions = 'none'")
