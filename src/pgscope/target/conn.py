"""Connection parameters shared by psycopg (our queries) and pgbench (the load).

The secrets a connection string can hold (SECRET_KEYS: the password, and the passphrase of
the client's SSL key) are kept apart from the rest: never in a program's arguments (a
process title is readable by every user of the host), in what is shown or stored (the run
folder, its summary and report). The password reaches pgbench and psql in their environment
(PGPASSWORD), the SSL passphrase, which has no environment variable, in a service file of
their own (drive/loaduser.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgscope.errors import TargetError, UsageError
from pgscope.tables.statistics import OWN_MARK

CONNECT_TIMEOUT_S = 10
APPLICATION_NAME = "pgscope"
# The server processes of pgscope's own sessions, by pid, as they connect: the sampler that
# reads the server's memory (collect/sampling/activitymem.py) leaves them out even when they
# end before it has asked their application_name (a collector's one-statement session at a
# window edge, seen as a ninth client).
OWN_BACKENDS: set[int] = set()
# The libpq keywords whose values are secrets: masked wherever a connection is shown, stored
# or passed in argv.
SECRET_KEYS = ("password", "sslpassword")
MAX_SSLPASSWORD = 200


@dataclass(frozen=True)
class ConnParams:
    params: dict[str, str] = field(default_factory=dict)  # libpq keywords, no secret
    secrets: dict[str, str] = field(default_factory=dict)  # those of SECRET_KEYS given

    @property
    def password(self) -> str | None:
        return self.secrets.get("password")

    def with_password(self, password: str) -> ConnParams:
        return replace(self, secrets={**self.secrets, "password": password})

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
            # libpq's message quotes the text it stopped at, which may be part of a password
            # (`password=Pw Secret`: 'missing "=" after "Secret"'): said without it.
            raise UsageError(
                f"{where}: not a valid connection string: {_parse_problem(str(exc))} (its "
                f"text is not shown: it may hold a password)"
            ) from None
        secrets = {key: params.pop(key) for key in SECRET_KEYS if key in params}
        sslpassword = secrets.get("sslpassword")
        if sslpassword is not None and "service" in params:
            raise UsageError(
                f"{where}: sslpassword with service={params['service']}: pgscope passes the "
                f"SSL key's passphrase to pgbench in a service file of its own; put sslpassword "
                f"in that service's section instead"
            )
        if sslpassword is not None and (
            sslpassword != sslpassword.strip()
            or "\n" in sslpassword
            or "\r" in sslpassword
            or len(sslpassword.encode()) > MAX_SSLPASSWORD
        ):
            raise UsageError(
                f"{where}: an sslpassword with a line break, spaces at either end or more "
                f"than {MAX_SSLPASSWORD} bytes cannot be passed to pgbench (a line of a libpq "
                f"service file holds it, and PostgreSQL 15's reads 255 bytes of one)"
            )
        return cls(params, secrets)

    @property
    def dbname(self) -> str:
        return self.params.get("dbname", "")

    def conninfo(self) -> str:
        """The libpq connection string without its secrets (safe to show and store)."""
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
        kwargs.update(self.secrets)
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


# libpq's parse errors, by their start, in words that quote nothing of the string.
_PARSE_PROBLEMS = (
    ('missing "=" after', "a word without \"=\" (quote a value holding spaces: password='a b')"),
    ("unterminated quoted string", "a quoted value is not closed"),
    ("invalid connection option", "a keyword libpq does not know"),
    ("invalid percent-encoded token", "a %-escape of the URI is not valid"),
    ("forbidden value %00", "the URI holds %00"),
    ("invalid URI query parameter", "a parameter of the URI is not one libpq knows"),
    ("missing key/value separator", 'a parameter of the URI has no "="'),
    ("extra key/value separator", 'a parameter of the URI has two "="'),
)


def _parse_problem(message: str) -> str:
    """What libpq found wrong with a connection string, without any of the string's text."""
    for start, said in _PARSE_PROBLEMS:
        if message.startswith(start):
            return said
    return "libpq cannot parse it"


# What pgscope's own sessions set so that their statements are not counted as the workload's.
_UNTRACKED = {
    "pg_stat_statements.track": "'none'",
    "auto_explain.sample_rate": "0",
    "track_functions": "'none'",
}
# The settings of _UNTRACKED this session may set, asked before any is set: a SET the role may
# not make is an ERROR in the server's log (about 30 an observation as pg_monitor), which the
# server log collector would then count among the workload's failures. The question is
# itself counted by pg_stat_statements (tracking is still on): its comment (OWN_MARK) lets
# the analysis leave it out of the workload's statements.
_SETTABLE = (
    f"{OWN_MARK} SELECT name FROM pg_catalog.pg_settings WHERE name = ANY(%s) AND "
    "(context = 'user' OR (context = 'superuser' AND "
    "pg_catalog.current_setting('is_superuser')::bool))"
)
# PostgreSQL 15 grants SET on a superuser's parameter to other roles.
_SETTABLE_15 = (
    f"{OWN_MARK} SELECT name FROM pg_catalog.pg_settings WHERE name = ANY(%s) AND "
    "(context = 'user' OR (context = 'superuser' AND "
    "(pg_catalog.current_setting('is_superuser')::bool "
    "OR pg_catalog.has_parameter_privilege(name, 'SET'))))"
)


def _untracked(session: psycopg.Connection[Any]) -> None:
    """pgscope's own statements stay out of pg_stat_statements, out of the plans auto_explain
    samples and out of the functions' counts, where the session may say so (a superuser's,
    as on an embedded cluster, or a role granted SET on them): they are not the workload's.
    On a user's server, as an unprivileged role, it may not: its statements are counted."""
    query = _SETTABLE_15 if session.info.server_version >= 150000 else _SETTABLE
    settable = {name for (name,) in session.execute(query, [list(_UNTRACKED)]).fetchall()}
    # pg_stat_statements.track first: the SETs after it are not counted. Names and values
    # are _UNTRACKED's own, written as the analysis finds them (SET pg_stat_statements...).
    for name, value in _UNTRACKED.items():
        if name in settable:
            session.execute(f"SET {name} = {value}")
