"""The repository's schema, derived from the store's declared tables, and its versions.

Every store table (pgscope.tables) has a table of the same name in the schema `pgscope`, with
the same columns (DuckDB's types mapped to PostgreSQL's) after two of the repository's own:
`server_id`, the server the run measured (the distribution column, were the repository a Citus
cluster), and `run_key`, the run. A time-series table (`Table.series`) is partitioned by month
on its time column; partitions are made as runs arrive (`add_partition`) and dropped when they
age out (prune.py). The repository's own tables say what it holds: `servers`, `runs` (one row
per run: what `runs --from` lists, and how far its push went), `documents` (each run's
analysis, as summary.json has it), `push_log` (each push, for the record) and `schema_version`.

The push role only inserts: it copies rows into the store's tables and calls five functions
that run as the schema's owner, each refusing to touch a run whose push is complete
(`open_run`, `add_partition`, `clear_rows`, `rename_waits`, `close_push`), and a run another
login role began pushing (`runs.pushed_as`, its session_user). The reader role only reads.
`init` makes all of this and upgrades an older schema in place (a column a later store version
declares is added); a repository newer than this pgscope is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgscope import __version__, tables
from pgscope.errors import RefusedError, TargetError

SCHEMA = "pgscope"
# The repository's own layout (its own tables, functions and roles), beside the store version
# whose tables it holds (tables.STORE_VERSION). Either one newer than this pgscope's is a
# repository it does not understand.
# 2: the push role's functions check their arguments (a run id is a folder's name and one
# server's; a partition's month lies in PARTITION_FROM .. now + PARTITION_AHEAD).
REPOSITORY_VERSION = 2
PUSH_ROLE = "pgscope_push"
READ_ROLE = "pgscope_read"
PG_TYPES = {
    "BIGINT": "bigint",
    "INTEGER": "integer",
    "SMALLINT": "smallint",
    "DOUBLE": "double precision",
    "VARCHAR": "text",
    "BOOLEAN": "boolean",
}
OWN_TABLES = ("schema_version", "servers", "runs", "documents", "push_log")
# The months a push may make a series' partition for: from this date to a month past the
# repository's clock (a pushing host's clock a little ahead). A push role made one at
# 9e18 µs; it now gets an error, and a run's rows outside go to the default partition.
PARTITION_FROM = "2000-01-01"
PARTITION_AHEAD = "1 month"
# What a run id is (read.RUN_ID, as a POSIX regular expression): it names a folder.
RUN_ID_SQL = "^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}$"
KEY_COLUMNS = ("server_id", "run_key")


@dataclass(frozen=True)
class Version:
    version: int  # the repository's layout
    store_version: int  # the store version whose tables it holds


def store_tables() -> tuple[tables.Table, ...]:
    """The store's tables, as the repository holds them (every declared one)."""
    declared = tuple(tables.declared().values())
    clash = {t.name for t in declared} & set(OWN_TABLES)
    assert not clash, f"store tables named as the repository's own: {clash}"
    return declared


def series_tables() -> tuple[tables.Table, ...]:
    return tuple(t for t in store_tables() if t.series is not None)


def updated_tables() -> tuple[tables.Table, ...]:
    return tuple(t for t in store_tables() if t.updated)


def _ident(*names: str) -> str:
    """A qualified identifier, quoted (names come from pgscope's own declarations)."""
    return ".".join('"' + n.replace('"', '""') + '"' for n in names)


def column_ddl(column: tables.Column) -> str:
    required = "NOT NULL" in column.constraint or "PRIMARY" in column.constraint
    not_null = " NOT NULL" if required else ""
    return f"{_ident(column.name)} {PG_TYPES[column.type]}{not_null}"


def store_table_ddl(t: tables.Table) -> list[str]:
    """A store table in the repository: created if missing, its later columns added to an
    older repository's (without NOT NULL: the rows already there predate them), indexed by
    run; a series partitioned by month, with a default partition for a row without a time.

    A series' run index is a BRIN one: a push appends a run's rows together, so each range
    of pages holds few runs, and the index costs next to nothing to keep as millions of rows
    arrive (a btree on run_key made a push of 1.2 M samples 1.3 to 2.8 times as long,
    measured on a loaded host)."""
    name = _ident(SCHEMA, t.name)
    body = ",\n    ".join(
        ["server_id bigint NOT NULL", "run_key bigint NOT NULL"]
        + [column_ddl(c) for c in t.columns]
    )
    partition = f" PARTITION BY RANGE ({_ident(t.series)})" if t.series else ""
    statements = [f"CREATE TABLE IF NOT EXISTS {name} (\n    {body}\n){partition}"]
    statements += [
        f"ALTER TABLE {name} ADD COLUMN IF NOT EXISTS {_ident(c.name)} {PG_TYPES[c.type]}"
        for c in t.columns
    ]
    if t.series:
        statements.append(
            f"CREATE TABLE IF NOT EXISTS {_ident(SCHEMA, t.name + '_default')} "
            f"PARTITION OF {name} DEFAULT"
        )
    method = " USING brin" if t.series else ""
    storage = " WITH (pages_per_range = 32)" if t.series else ""
    statements.append(
        f"CREATE INDEX IF NOT EXISTS {_ident(t.name + '_run')} ON {name}{method} (run_key){storage}"
    )
    return statements


def _array(names: list[str]) -> str:
    return "ARRAY[" + ", ".join("'" + n.replace("'", "''") + "'" for n in names) + "]::text[]"


# A later version changes these tables with ALTER TABLE ... ADD COLUMN IF NOT EXISTS here, after
# their CREATE, as store_table_ddl does for the store's.
OWN_DDL = """
CREATE TABLE IF NOT EXISTS pgscope.schema_version (
    version integer NOT NULL,
    store_version integer NOT NULL,
    pgscope_version text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS pgscope.servers (
    server_id bigint PRIMARY KEY,
    system_identifier bigint,
    host text NOT NULL,
    port integer,
    first_seen_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS servers_host ON pgscope.servers (host, port);
CREATE INDEX IF NOT EXISTS servers_system_identifier ON pgscope.servers (system_identifier);
CREATE SEQUENCE IF NOT EXISTS pgscope.run_keys;
CREATE TABLE IF NOT EXISTS pgscope.runs (
    server_id bigint NOT NULL REFERENCES pgscope.servers,
    run_key bigint NOT NULL,
    run_id text NOT NULL,
    state text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'complete')),
    pushed_as text NOT NULL DEFAULT session_user,
    name text,
    recipe text,
    status text,
    status_reason text,
    started_us bigint,
    started_at timestamptz,
    target text,
    workload text,
    scale integer,
    clients integer[],
    best_tps double precision,
    steps integer,
    steps_ok integer,
    server_version text,
    verdict text,
    finding_ids text[],
    run_dir text,
    series_from_us bigint,
    series_to_us bigint,
    store_version integer,
    pushed_by text,
    watermarks jsonb NOT NULL DEFAULT '{}',
    first_pushed_at timestamptz NOT NULL DEFAULT now(),
    pushed_at timestamptz,
    PRIMARY KEY (server_id, run_key),
    UNIQUE (server_id, run_id)
);
CREATE INDEX IF NOT EXISTS runs_started ON pgscope.runs (started_us DESC);
CREATE INDEX IF NOT EXISTS runs_server_started ON pgscope.runs (server_id, started_us DESC);
CREATE INDEX IF NOT EXISTS runs_run_id ON pgscope.runs (run_id);
CREATE TABLE IF NOT EXISTS pgscope.documents (
    server_id bigint NOT NULL,
    run_key bigint NOT NULL,
    document json NOT NULL,
    PRIMARY KEY (server_id, run_key)
);
CREATE TABLE IF NOT EXISTS pgscope.push_log (
    server_id bigint NOT NULL,
    run_key bigint NOT NULL,
    pushed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    through_step integer,
    rows bigint NOT NULL,
    final boolean NOT NULL
);
CREATE INDEX IF NOT EXISTS push_log_run ON pgscope.push_log (run_key, pushed_at);
"""

# Functions the push role calls, run as the schema's owner: with a fixed search_path, and
# table names checked against pgscope's own lists (written into each function when init makes
# it) before they are quoted into a statement. None changes a run whose push is complete.
FUNCTIONS = """
CREATE OR REPLACE FUNCTION pgscope.open_run(
    p_server_id bigint, p_system_identifier bigint, p_host text, p_port integer,
    p_run_id text)
RETURNS TABLE (run_key bigint, state text, watermarks jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $f$
#variable_conflict use_column
BEGIN
    -- A run id names a folder where it is pulled: one a pull may make, or none.
    IF p_run_id IS NULL OR p_run_id !~ '@RUN_ID@' THEN
        RAISE EXCEPTION 'pgscope.open_run: % is not a run id', quote_literal(left(p_run_id, 80));
    END IF;
    -- A run id is one server's: another's run of that id would shadow it. One push of an
    -- id at a time (until the push commits) makes the check hold.
    PERFORM pg_advisory_xact_lock(hashtext('pgscope.open_run'), hashtext(p_run_id));
    PERFORM 1 FROM pgscope.runs r WHERE r.run_id = p_run_id AND r.server_id <> p_server_id;
    IF FOUND THEN
        RAISE EXCEPTION 'pgscope.open_run: run % is another server''s in the repository',
            p_run_id;
    END IF;
    -- A known server's row is not touched: a long push would hold its lock, and every other
    -- push of that server would wait for it.
    INSERT INTO pgscope.servers (server_id, system_identifier, host, port)
    VALUES (p_server_id, p_system_identifier, p_host, p_port)
    ON CONFLICT (server_id) DO NOTHING;
    INSERT INTO pgscope.runs (server_id, run_key, run_id)
    VALUES (p_server_id, nextval('pgscope.run_keys'), p_run_id)
    ON CONFLICT (server_id, run_id) DO NOTHING;
    -- Locked until the push ends: a second push of the same run waits, then finds it done.
    RETURN QUERY SELECT r.run_key, r.state, r.watermarks FROM pgscope.runs r
        WHERE r.server_id = p_server_id AND r.run_id = p_run_id
          AND (r.state = 'complete' OR r.pushed_as = session_user) FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgscope.open_run: run % is being pushed by another role', p_run_id;
    END IF;
END
$f$;

CREATE OR REPLACE FUNCTION pgscope.add_partition(p_table text, p_us bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $f$
DECLARE
    month timestamp;
    name text;
BEGIN
    IF NOT p_table = ANY (@SERIES@) THEN
        RAISE EXCEPTION 'pgscope.add_partition: % is not a time series of the repository',
            p_table;
    END IF;
    IF p_us IS NULL OR p_us < extract(epoch FROM timestamptz '@PARTITION_FROM@ UTC') * 1000000
       OR p_us > extract(epoch FROM now() + interval '@PARTITION_AHEAD@') * 1000000 THEN
        RAISE EXCEPTION 'pgscope.add_partition: % µs is not a time a run can have (from '
            '@PARTITION_FROM@ to a month from now)', p_us;
    END IF;
    month := date_trunc('month', to_timestamp(p_us / 1e6) AT TIME ZONE 'UTC');
    name := p_table || '_' || to_char(month, 'YYYY_MM');
    IF to_regclass(format('pgscope.%I', name)) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format(
        'CREATE TABLE pgscope.%I PARTITION OF pgscope.%I FOR VALUES FROM (%s) TO (%s)',
        name, p_table,
        (extract(epoch FROM month) * 1000000)::bigint,
        (extract(epoch FROM month + interval '1 month') * 1000000)::bigint);
    RETURN true;
EXCEPTION WHEN duplicate_table THEN
    RETURN false;  -- another push made it first
END
$f$;

CREATE OR REPLACE FUNCTION pgscope.clear_rows(p_server_id bigint, p_run_key bigint, p_table text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $f$
DECLARE
    cleared bigint;
BEGIN
    IF NOT p_table = ANY (@UPDATED@) THEN
        RAISE EXCEPTION 'pgscope.clear_rows: % is not a table pushed whole', p_table;
    END IF;
    PERFORM 1 FROM pgscope.runs
        WHERE server_id = p_server_id AND run_key = p_run_key AND state = 'open'
          AND pushed_as = session_user;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgscope.clear_rows: run % is not being pushed', p_run_key;
    END IF;
    EXECUTE format('DELETE FROM pgscope.%I WHERE server_id = $1 AND run_key = $2', p_table)
        USING p_server_id, p_run_key;
    GET DIAGNOSTICS cleared = ROW_COUNT;
    RETURN cleared;
END
$f$;

CREATE OR REPLACE FUNCTION pgscope.rename_waits(
    p_server_id bigint, p_run_key bigint, p_kinds text[], p_numbers text[], p_names text[])
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $f$
DECLARE
    renamed bigint;
BEGIN
    PERFORM 1 FROM pgscope.runs
        WHERE server_id = p_server_id AND run_key = p_run_key AND state = 'open'
          AND pushed_as = session_user;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgscope.rename_waits: run % is not being pushed', p_run_key;
    END IF;
    UPDATE pgscope.activity_samples a SET wait_event = n.name
    FROM unnest(p_kinds, p_numbers, p_names) AS n(kind, number, name)
    WHERE a.server_id = p_server_id AND a.run_key = p_run_key
      AND a.wait_event_type = n.kind AND a.wait_event = n.number;
    GET DIAGNOSTICS renamed = ROW_COUNT;
    RETURN renamed;
END
$f$;

CREATE OR REPLACE FUNCTION pgscope.close_push(
    p_server_id bigint, p_run_key bigint, p_watermarks jsonb, p_listing jsonb,
    p_document json, p_through_step integer, p_rows bigint, p_final boolean)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    UPDATE pgscope.runs SET
        state = CASE WHEN p_final THEN 'complete' ELSE 'open' END,
        watermarks = p_watermarks,
        name = p_listing->>'name',
        recipe = p_listing->>'recipe',
        status = p_listing->>'status',
        status_reason = p_listing->>'status_reason',
        started_us = (p_listing->>'started_us')::bigint,
        started_at = to_timestamp((p_listing->>'started_us')::bigint / 1e6),
        target = p_listing->>'target',
        workload = p_listing->>'workload',
        scale = (p_listing->>'scale')::integer,
        clients = ARRAY(SELECT jsonb_array_elements_text(p_listing->'clients')::integer),
        best_tps = (p_listing->>'best_tps')::double precision,
        steps = (p_listing->>'steps')::integer,
        steps_ok = (p_listing->>'steps_ok')::integer,
        server_version = p_listing->>'server_version',
        verdict = p_listing->>'verdict',
        finding_ids = ARRAY(SELECT jsonb_array_elements_text(p_listing->'finding_ids')),
        run_dir = p_listing->>'run_dir',
        series_from_us = least(series_from_us, (p_listing->>'series_from_us')::bigint),
        series_to_us = greatest(series_to_us, (p_listing->>'series_to_us')::bigint),
        store_version = (p_listing->>'store_version')::integer,
        pushed_by = p_listing->>'pushed_by',
        pushed_at = now()
    WHERE server_id = p_server_id AND run_key = p_run_key AND state = 'open'
      AND pushed_as = session_user;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgscope.close_push: run % is not being pushed', p_run_key;
    END IF;
    IF p_document IS NOT NULL THEN
        INSERT INTO pgscope.documents (server_id, run_key, document)
        VALUES (p_server_id, p_run_key, p_document)
        ON CONFLICT (server_id, run_key) DO UPDATE SET document = EXCLUDED.document;
    END IF;
    INSERT INTO pgscope.push_log (server_id, run_key, through_step, rows, final)
    VALUES (p_server_id, p_run_key, p_through_step, p_rows, p_final);
END
$f$;
"""
PUSH_FUNCTIONS = (
    "open_run(bigint, bigint, text, integer, text)",
    "add_partition(text, bigint)",
    "clear_rows(bigint, bigint, text)",
    "rename_waits(bigint, bigint, text[], text[], text[])",
    "close_push(bigint, bigint, jsonb, jsonb, json, integer, bigint, boolean)",
)


def functions_ddl() -> str:
    return (
        FUNCTIONS.replace("@SERIES@", _array([t.name for t in series_tables()]))
        .replace("@UPDATED@", _array([t.name for t in updated_tables()]))
        .replace("@RUN_ID@", RUN_ID_SQL)
        .replace("@PARTITION_FROM@", PARTITION_FROM)
        .replace("@PARTITION_AHEAD@", PARTITION_AHEAD)
    )


def grants_ddl(push_role: str, read_role: str) -> list[str]:
    """The push role: the schema, the version, INSERT on the store's tables, the functions;
    nothing else (no SELECT, UPDATE or DELETE). The reader: SELECT on everything, partitions
    made later included."""
    push, read = _ident(push_role), _ident(read_role)
    statements = [
        f"GRANT USAGE ON SCHEMA pgscope TO {push}, {read}",
        f"GRANT SELECT ON pgscope.schema_version TO {push}",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA pgscope TO {read}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA pgscope GRANT SELECT ON TABLES TO {read}",
    ]
    statements += [f"GRANT INSERT ON {_ident(SCHEMA, t.name)} TO {push}" for t in store_tables()]
    for function in PUSH_FUNCTIONS:
        statements.append(f"REVOKE ALL ON FUNCTION pgscope.{function} FROM PUBLIC")
        statements.append(f"GRANT EXECUTE ON FUNCTION pgscope.{function} TO {push}")
    return statements


@dataclass(frozen=True)
class Initialised:
    before: Version | None  # None: there was no repository
    after: Version
    roles_created: tuple[str, ...]


def init(session: psycopg.Connection[Any], push_role: str, read_role: str) -> Initialised:
    """Create the repository (or upgrade an older one) and its roles, in one transaction."""
    encoding = session.execute("SHOW server_encoding").fetchone()
    if encoding is None or str(encoding[0]).upper() not in ("UTF8", "UTF-8"):
        raise RefusedError(
            f"the repository's database is encoded in {encoding and encoding[0]}: pgscope "
            f"keeps query texts and names as UTF-8; create the database WITH ENCODING 'UTF8'"
        )
    before = installed(session)
    if before is not None:
        refuse_newer(before, session)
    created: list[str] = []
    try:
        with session.transaction():
            for role in (push_role, read_role):
                exists = session.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
                if exists.fetchone() is None:
                    session.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
                    created.append(role)
            session.execute("CREATE SCHEMA IF NOT EXISTS pgscope")
            session.execute(OWN_DDL)
            for t in store_tables():
                for statement in store_table_ddl(t):
                    session.execute(statement)
            session.execute(functions_ddl())
            for statement in grants_ddl(push_role, read_role):
                session.execute(statement)
            after = Version(REPOSITORY_VERSION, tables.STORE_VERSION)
            if before != after:
                session.execute(
                    "INSERT INTO pgscope.schema_version (version, store_version, "
                    "pgscope_version) VALUES (%s, %s, %s)",
                    [after.version, after.store_version, __version__],
                )
    except psycopg.errors.InsufficientPrivilege as exc:
        raise TargetError(
            f"cannot create the repository at {_where(session)}: {_first_line(exc)}; run "
            f"`pgscope repository init` as a role that may create schemas in the database "
            f"and roles (CREATEROLE), or create the roles {push_role} and {read_role} first"
        ) from None
    return Initialised(before, after, tuple(created))


def installed(session: psycopg.Connection[Any]) -> Version | None:
    """The repository's version, or None when the database has none."""
    row = session.execute("SELECT to_regclass('pgscope.schema_version') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return None
    try:
        found = session.execute(
            "SELECT max(version), max(store_version) FROM pgscope.schema_version"
        ).fetchone()
    except psycopg.errors.InsufficientPrivilege as exc:
        if not session.autocommit:
            session.rollback()
        raise TargetError(
            f"cannot read the repository at {_where(session)}: {_first_line(exc)}; the role "
            f"needs {PUSH_ROLE} (to push) or {READ_ROLE} (to read)"
        ) from None
    if found is None or found[0] is None:
        return None
    return Version(int(found[0]), int(found[1]))


def check(session: psycopg.Connection[Any], *, writing: bool) -> Version:
    """The repository's version, refused (one line) when there is none, when it is newer than
    this pgscope, or, to write, older (its owner upgrades it with `repository init`)."""
    version = installed(session)
    if version is None:
        raise TargetError(
            f"no pgscope repository at {_where(session)}: create it with `pgscope repository "
            f"init --to DSN` (as a role that may create schemas and roles)"
        )
    refuse_newer(version, session)
    if writing and (version.version, version.store_version) < (
        REPOSITORY_VERSION,
        tables.STORE_VERSION,
    ):
        raise RefusedError(
            f"the repository at {_where(session)} is of version {version.version} (store "
            f"version {version.store_version}), older than this pgscope's "
            f"({REPOSITORY_VERSION}, store version {tables.STORE_VERSION}): its owner upgrades "
            f"it with `pgscope repository init --to DSN`"
        )
    return version


def refuse_newer(version: Version, session: psycopg.Connection[Any]) -> None:
    if version.version > REPOSITORY_VERSION or version.store_version > tables.STORE_VERSION:
        raise RefusedError(
            f"the repository at {_where(session)} is of version {version.version} (store "
            f"version {version.store_version}), newer than this pgscope "
            f"({__version__}: version {REPOSITORY_VERSION}, store version "
            f"{tables.STORE_VERSION}): upgrade pgscope to use it"
        )


def _where(session: psycopg.Connection[Any]) -> str:
    info = session.info
    host = info.host if info.host and not info.host.startswith("/") else "localhost"
    return f"{host}:{info.port}/{info.dbname}"


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def markdown() -> str:
    """The store's tables as the repository holds them, for docs/repository.md (between its
    markers): each one's time column (partitioned by month on it) and how a push sends it."""
    lines = ["| table | partitioned by month on | an instalment sends |", "|---|---|---|"]
    for t in store_tables():
        series = f"`{t.series}`" if t.series else "-"
        sent = "the whole table again" if t.updated else "the rows after the last one's"
        lines.append(f"| `{t.name}` | {series} | {sent} |")
    return "\n".join(lines) + "\n"
