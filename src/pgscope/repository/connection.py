"""A session on the repository: its own connection, never one to a server a run measured.

The connection string comes as any other (--to, --from, their -file forms, or
$PGSCOPE_REPOSITORY; target.conn.ConnParams keeps its password out of every message); TLS and
the rest are libpq's own keywords in it (`sslmode=verify-full sslrootcert=...`). It is not
opened through `ConnParams.connect`: that one counts its session among the observed server's
(`OWN_BACKENDS`, which the memory sampler leaves out by pid) and sets that server's
statistics off for it.
"""

from __future__ import annotations

from typing import Any

import psycopg

from pgscope.errors import TargetError
from pgscope.repository import schema
from pgscope.target.conn import CONNECT_TIMEOUT_S, ConnParams

KEEPALIVE = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}


def connect(
    params: ConnParams, *, writing: bool, application_name: str = "pgscope repository"
) -> tuple[psycopg.Connection[Any], schema.Version]:
    """An autocommit session on the repository and its version, checked (schema.check): a
    repository newer than this pgscope, or, to write, older, is refused in one line."""
    session = open_session(params, application_name)
    try:
        return session, schema.check(session, writing=writing)
    except BaseException:
        session.close()
        raise


def open_session(
    params: ConnParams, application_name: str = "pgscope repository"
) -> psycopg.Connection[Any]:
    kwargs: dict[str, Any] = dict(params.params)
    kwargs.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    kwargs.setdefault("application_name", application_name)
    kwargs.setdefault("client_encoding", "UTF8")
    # A repository across a network that goes away mid-push is noticed in about 30 s, not
    # after the system's TCP timeout (hours): an observation's pusher then retries.
    for key, value in KEEPALIVE.items():
        kwargs.setdefault(key, value)
    kwargs.update(params.secrets)  # the password, an SSL key's passphrase
    try:
        return psycopg.connect(autocommit=True, **kwargs)
    except psycopg.OperationalError as exc:
        reason = " ".join(str(exc).split()) or "no reason given"
        raise TargetError(
            f"cannot connect to the repository {params.conninfo()}: {reason}"
        ) from None
