"""What the role of a `--dsn` could do to the server besides reading: the ground read-only
rests on.

pgbench sessions run with `default_transaction_read_only = on`, and scripts are checked for
what could lift it (drive/readonly.py); but a session can lift that setting from inside in
ways no reading of its text foresees (a function that runs SQL given as text, a function on
the server that calls `set_config`). What it cannot lift is what its role may do. So before a
user's scripts run on a user's server, the role is asked, in one query, for anything that
could write or act beyond reading: being a superuser; the attributes that create databases
or roles, replicate or bypass row security; membership in the roles that read or write
server files, run programs, signal other sessions, write all data, checkpoint or maintain;
INSERT, UPDATE, DELETE, TRUNCATE, TRIGGER (and MAINTAIN, 17+) on any table, view or
materialised view, USAGE or UPDATE on a sequence, CREATE on a schema or the database,
UPDATE on a large object (has_largeobject_privilege from 18, the ACL before); owning anything
(an owner grants itself the rest); EXECUTE on a SECURITY DEFINER function (it runs as its
owner); EXECUTE on a function of the server or of an extension that PUBLIC may not call by
default (pg_stat_reset(), lo_import(), pg_stat_statements_reset() ...), granted to the role,
a role it is a member of (pg_monitor too) or PUBLIC where PostgreSQL did not grant it (its
own grants are in pg_init_privs); USAGE on a foreign server (dblink, postgres_fdw connect in
a session of their own); SET or ALTER SYSTEM on a parameter (pg_parameter_acl, 15+).

The question is asked so that the role cannot answer it (`pinned`): in a read-only
transaction, with the search path pinned to pg_catalog and every function named there, so a
role's own `search_path` cannot put its functions in place of has_table_privilege().

Every role the session's role can become counts (`SET ROLE` is allowed in a read-only
transaction), so each question is asked of each of them. Not counted, as every role has them
by default: TEMP on the database (a temporary table is the session's own, and the read-only
guard refuses it anyway), and UPDATE on the pg_settings view (it is set_config(), which the
read-only guard's own checks are about).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import psycopg

# Predefined roles whose members can act on the server beyond reading its data, by the
# version that has them.
POWERFUL_ROLES: dict[str, tuple[int, str]] = {
    "pg_read_server_files": (110000, "reads any file the server can"),
    "pg_write_server_files": (110000, "writes any file the server can"),
    "pg_execute_server_program": (110000, "runs programs as the server account"),
    "pg_signal_backend": (90600, "cancels and terminates other sessions"),
    "pg_write_all_data": (140000, "writes every table"),
    "pg_checkpoint": (150000, "forces checkpoints"),
    "pg_maintain": (170000, "vacuums, analyses, refreshes and locks every table"),
}
# Server functions PUBLIC may not call by default that only read (the server's log and
# directories, its files' status): a role granted them, to read the server's log, writes
# nothing with them. pg_read_file() and its kin read any file the server can read: a grant of
# them is the DBA's own choice of what the role may read, not a way to write.
READING_FUNCTIONS = (
    "pg_current_logfile",
    "pg_ls_logdir",
    "pg_ls_waldir",
    "pg_ls_tmpdir",
    "pg_ls_archive_statusdir",
    "pg_ls_dir",
    "pg_stat_file",
    "pg_read_file",
    "pg_read_binary_file",
)
ATTRIBUTES = (
    ("rolcreatedb", "CREATEDB"),
    ("rolcreaterole", "CREATEROLE"),
    ("rolreplication", "REPLICATION"),
    ("rolbypassrls", "BYPASSRLS"),
)


def _write_privileges_sql(version_num: int) -> str:
    """One query: a row (rank, order, what the role can do, the role that gives it) per way
    the session's role could write or act, best first. Version-aware, 15 to 18.

    `me` is every role the session's role can become (itself included): their attributes
    and what they own count. Privileges are asked of the session's role, which the has_*
    functions answer with what it inherits, and of the roles it can become only by SET ROLE
    (`acting`): usually itself alone, so a catalog of 100,000 tables is asked once each."""
    table_privileges = ["INSERT", "UPDATE", "DELETE", "TRUNCATE", "TRIGGER"]
    if version_num >= 170000:
        table_privileges.append("MAINTAIN")
    roles = ", ".join(
        f"('{name}', '{why}')"
        for name, (since, why) in POWERFUL_ROLES.items()
        if version_num >= since
    )
    attributes = " UNION ALL ".join(
        f"SELECT 3, 0, 'has the {shown} attribute', m.rolname FROM me m WHERE m.{column}"
        for column, shown in ATTRIBUTES
    )
    # INSERT and UPDATE may be granted on columns only: has_any_column_privilege sees those.
    table_checks = " UNION ALL ".join(
        f"SELECT {order}, '{p}' AS p, "
        + (
            f"has_any_column_privilege(m.oid, c.oid, '{p}')"
            if p in ("INSERT", "UPDATE")
            else f"has_table_privilege(m.oid, c.oid, '{p}')"
        )
        + " AS yes, m.rolname, c.name FROM acting m, rel c"
        for order, p in enumerate(table_privileges)
    )
    if version_num >= 180000:
        large_object = (
            "SELECT 8, 0, 'has UPDATE on large object ' || l.oid, m.rolname "
            "FROM acting m, pg_largeobject_metadata l "
            "WHERE has_largeobject_privilege(m.oid, l.oid, 'UPDATE')"
        )
    else:  # before 18 no has_largeobject_privilege(): the ACL itself
        large_object = (
            "SELECT 8, 0, 'has UPDATE on large object ' || l.oid, "
            "coalesce((SELECT rolname FROM me WHERE oid = a.grantee), 'PUBLIC') "
            "FROM pg_largeobject_metadata l, aclexplode(l.lomacl) a "
            "WHERE a.privilege_type = 'UPDATE' "
            "AND (a.grantee = 0 OR a.grantee IN (SELECT oid FROM me))"
        )
    reading = ", ".join(f"'{name}'" for name in READING_FUNCTIONS)
    parameters = (
        """    UNION ALL
    SELECT 7, 3, 'may ' || x.privilege_type || ' parameter ' || a.parname,
        coalesce((SELECT rolname FROM me WHERE oid = x.grantee), 'PUBLIC')
    FROM pg_parameter_acl a, aclexplode(a.paracl) x
    WHERE x.grantee = 0 OR x.grantee IN (SELECT oid FROM me)
"""
        if version_num >= 150000
        else ""
    )
    return f"""
WITH me AS (
    SELECT r.oid, r.rolname, r.rolsuper, r.rolcreatedb, r.rolcreaterole, r.rolreplication,
           r.rolbypassrls
    FROM pg_roles r WHERE pg_has_role(session_user, r.oid, 'MEMBER')
),
acting AS (
    SELECT oid, rolname FROM me
    WHERE rolname = session_user OR NOT pg_has_role(session_user, oid, 'USAGE')
),
named AS (  -- every relation by its schema-qualified name
    SELECT c.oid, c.relkind, c.relowner, quote_ident(n.nspname) || '.' || quote_ident(c.relname)
        AS name
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
),
rel AS (
    SELECT oid, name FROM named WHERE relkind IN ('r', 'p', 'v', 'm', 'f')
      AND oid <> 'pg_catalog.pg_settings'::regclass
),
found (rank, ord, what, via) AS (
    SELECT 1, 0, 'is a superuser', m.rolname FROM me m WHERE m.rolsuper
    UNION ALL
    SELECT 2, 0, 'is a member of ' || p.name || ', which ' || p.why, NULL
    FROM (VALUES {roles}) AS p(name, why)
    WHERE pg_has_role(session_user, to_regrole(p.name), 'MEMBER')
    UNION ALL
    {attributes}
    UNION ALL
    SELECT 4, t.ord, 'has ' || t.p || ' on ' || t.name, t.rolname
    FROM ({table_checks}) AS t(ord, p, yes, rolname, name) WHERE t.yes
    UNION ALL
    SELECT 4, 9, 'has ' || p.p || ' on sequence ' || c.name, m.rolname
    FROM acting m, named c, (VALUES ('USAGE'), ('UPDATE')) AS p(p)
    WHERE c.relkind = 'S' AND has_sequence_privilege(m.oid, c.oid, p.p)
    UNION ALL
    SELECT 5, 0, 'has CREATE on schema ' || quote_ident(n.nspname), m.rolname
    FROM acting m, pg_namespace n WHERE has_schema_privilege(m.oid, n.oid, 'CREATE')
    UNION ALL
    SELECT 5, 1, 'has CREATE on database ' || quote_ident(current_database()), m.rolname
    FROM acting m WHERE has_database_privilege(m.oid, current_database(), 'CREATE')
    UNION ALL
    SELECT 6, 0, 'owns database ' || quote_ident(d.datname), m.rolname
    FROM me m JOIN pg_database d ON d.datdba = m.oid WHERE d.datname = current_database()
    UNION ALL
    SELECT 6, 1, 'owns schema ' || quote_ident(n.nspname), m.rolname
    FROM me m JOIN pg_namespace n ON n.nspowner = m.oid
    UNION ALL
    SELECT 6, 2, 'owns ' || CASE c.relkind WHEN 'S' THEN 'sequence ' WHEN 'v' THEN 'view '
        WHEN 'm' THEN 'materialized view ' WHEN 'i' THEN 'index ' WHEN 'I' THEN 'index '
        WHEN 'c' THEN 'type ' ELSE 'table ' END || c.name, m.rolname
    FROM me m JOIN named c ON c.relowner = m.oid
    UNION ALL
    SELECT 6, 3, 'owns function ' || p.oid::regprocedure, m.rolname
    FROM me m JOIN pg_proc p ON p.proowner = m.oid
    UNION ALL
    SELECT 6, 4, 'owns large object ' || l.oid, m.rolname
    FROM me m JOIN pg_largeobject_metadata l ON l.lomowner = m.oid
    UNION ALL
    SELECT 7, 0, 'may execute ' || p.oid::regprocedure || ', a SECURITY DEFINER function of '
        || quote_ident(pg_get_userbyid(p.proowner)) || ', which runs as its owner', m.rolname
    FROM acting m, pg_proc p
    WHERE p.prosecdef AND p.proowner NOT IN (SELECT oid FROM me)
      AND has_function_privilege(m.oid, p.oid, 'EXECUTE')
    UNION ALL
    SELECT 7, 1, 'may execute ' || p.oid::regprocedure || ', which PUBLIC may not by default',
        coalesce((SELECT rolname FROM me WHERE oid = a.grantee), 'PUBLIC')
    FROM pg_proc p
    LEFT JOIN pg_init_privs i
        ON i.objoid = p.oid AND i.classoid = 'pg_proc'::regclass AND i.objsubid = 0,
    aclexplode(p.proacl) a
    WHERE a.privilege_type = 'EXECUTE'
      AND (a.grantee = 0 OR a.grantee IN (SELECT oid FROM me))
      AND (p.pronamespace = 'pg_catalog'::regnamespace OR i.objoid IS NOT NULL)
      AND NOT (p.pronamespace = 'pg_catalog'::regnamespace AND p.proname IN ({reading}))
      AND NOT EXISTS (
          SELECT FROM aclexplode(coalesce(i.initprivs, acldefault('f', p.proowner))) d
          WHERE d.grantee = a.grantee AND d.privilege_type = 'EXECUTE')
    UNION ALL
    SELECT 7, 2, 'may use foreign server ' || quote_ident(s.srvname)
        || ', which connects to a server in a session of its own', m.rolname
    FROM acting m, pg_foreign_server s WHERE has_server_privilege(m.oid, s.oid, 'USAGE')
{parameters}    UNION ALL
    {large_object}
    UNION ALL
    SELECT 8, 1, 'may write every large object (lo_compat_privileges is on)', NULL
    WHERE current_setting('lo_compat_privileges') = 'on'
      AND EXISTS (SELECT FROM pg_largeobject_metadata)
)
SELECT what, via, session_user FROM found ORDER BY rank, ord, what LIMIT 1
"""


# The functions the query calls, schema-qualified: with the search path pinned too, a role's
# own `search_path` (ALTER ROLE ... SET search_path = shadow, pg_catalog) cannot put functions
# of its choosing in their place.
_CALLED = re.compile(
    r"(?<![.\w])(has_\w+_privilege|pg_has_role|aclexplode|acldefault|to_regrole|quote_ident|"
    r"current_database|current_setting|pg_get_userbyid)\("
)


@contextlib.contextmanager
def pinned(session: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    """A read-only transaction on `session` (autocommit), rolled back on the way out, whose
    search path is pg_catalog alone (pg_temp last, where it finds no function): nothing the
    role or its database set can put another schema's functions or operators before the
    server's own, and nothing run inside can write."""
    with session.transaction(force_rollback=True):
        session.execute("SET TRANSACTION READ ONLY")
        session.execute("SET LOCAL search_path = pg_catalog, pg_temp")
        yield session


def qualified(sql: str) -> str:
    """`sql` with the functions it calls named in pg_catalog."""
    return _CALLED.sub(r"pg_catalog.\1(", sql)


def write_privilege(session: psycopg.Connection[Any]) -> str | None:
    """What the session's role could do beyond reading, the first of it in words
    (`role "bench" has INSERT on public.accounts`, `... (through role "app")`), or None
    when it can only read. Asked in a pinned read-only transaction (`pinned`): the session
    must be in autocommit, as ConnParams.connect() opens it."""
    with pinned(session):
        sql = qualified(_write_privileges_sql(session.info.server_version))
        row = session.execute(sql).fetchone()
    if row is None:
        return None
    what, via, user = row
    if via == "PUBLIC":
        through = " (granted to PUBLIC)"
    else:
        through = f' (through role "{via}")' if via is not None and via != user else ""
    return f'role "{user}" {what}{through}'
