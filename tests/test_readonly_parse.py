"""Issue 37: on a user's server (`--dsn`) a script is read-only by PostgreSQL's own rules. Every
statement is parsed by PostgreSQL's parser (pglast) and must be a read; every function it
would run, resolved on the server, must be STABLE or IMMUTABLE or a reviewed harmless
built-in. The privilege check behind it is complete (large objects, parameter ACLs, EXECUTE
grants through PUBLIC and memberships, foreign servers) and cannot be fooled by a role's
search path. Each attack the red team ran as a pg_monitor role is here, against a throw-away
cluster over its unix socket."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pgscope.drive.readonly import check_script_reads
from pgscope.drive.scriptlex import read_script
from pgscope.drive.statements import NotARead, defined_variables, read_uses
from pgscope.errors import RefusedError
from pgscope.proc import server_account
from pgscope.target.conn import ConnParams
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import PgBinaries
from pgscope.target.privileges import write_privilege
from tests.cli import one_line_error, pgscope
from tests.servers import SMALL_SERVER

SHORT = ["--scale", "0", "--clients", "1", "--duration", "1", "--warmup", "0", "--repeats", "1"]
RECIPES = Path(__file__).resolve().parents[1] / "src" / "pgscope" / "recipes" / "scripts"


def _judged(text: str) -> str | None:
    """Why the first SQL statement of `text` is not a read, or None."""
    commands = read_script(text)
    for command in commands:
        if command.meta is None:
            try:
                read_uses(command, "s.sql line 1", defined_variables(commands))
            except NotARead as exc:
                return str(exc)
    return None


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("INSERT INTO t VALUES (1);", "INSERT, which is not a read"),
        ("WITH x AS (DELETE FROM t RETURNING 1) SELECT * FROM x;", "DELETE in a WITH query"),
        ("SELECT * FROM (SELECT 1 FROM t FOR SHARE) s;", "a locking clause"),
        ("SELECT 1 FROM t FOR NO KEY UPDATE SKIP LOCKED;", "a locking clause"),
        ("SELECT 1 INTO made;", "SELECT INTO, which creates a table"),
        ("ALTER SYSTEM SET work_mem = '1MB';", "ALTER SYSTEM, which is not a read"),
        ("EXPLAIN ANALYZE UPDATE t SET id = 1;", "UPDATE, which is not a read"),
        ("COPY t TO STDOUT;", "COPY, which is not a read"),
        ("NOTIFY x;", "NOTIFY, which is not a read"),
        ("LOCK TABLE t;", "LOCK, which is not a read"),
        ("CALL p();", "CALL, which is not a read"),
        ("SET ROLE postgres;", "SET ROLE"),
        ("SET SESSION AUTHORIZATION postgres;", "SET SESSION AUTHORIZATION"),
        ("RESET ALL;", "RESET ALL"),
        ("PREPARE TRANSACTION 'x';", "two-phase"),
        ("SET TRANSACTION READ WRITE;", "a READ WRITE transaction"),
        # a variable pasted into a name by the simple protocol
        ("\\set x 1\nSELECT f:x();", "PostgreSQL's parser does not read it"),
        ("SELEC 1;", "PostgreSQL's parser does not read it"),
    ],
)
def test_a_statement_that_is_not_a_read_is_found_by_postgresqls_parser(
    text: str, what: str
) -> None:
    why = _judged(text)
    assert why is not None and what in why, (text, why)


@pytest.mark.parametrize(
    "text",
    [
        "\\set aid random(1, 100000)\nSELECT abalance FROM pgbench_accounts WHERE aid = :aid;",
        "SELECT a[1:n] FROM t;",  # an array slice, not a variable pgbench set
        "TABLE t;",
        "VALUES (1), (2);",
        "SHOW work_mem;",
        "SET work_mem = '64MB';",
        "RESET work_mem;",
        "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY;",
        "SELECT 1;\nCOMMIT;",
        "EXPLAIN (ANALYZE) SELECT * FROM t WHERE id BETWEEN 1 AND 2;",
        "WITH x AS (SELECT 1) SELECT * FROM x;",
    ],
)
def test_reads_are_reads(text: str) -> None:
    assert _judged(text) is None


# -- on a server ------------------------------------------------------------------------------


def dsn(cluster: EmbeddedCluster, role: str) -> str:
    return f"host={cluster.socket_dir} port={cluster.port} user={role} dbname=postgres"


def as_role(cluster: EmbeddedCluster, role: str) -> ConnParams:
    return ConnParams({**cluster.conn.params, "user": role})


@pytest.fixture(scope="module")
def server(shared_cluster: EmbeddedCluster) -> EmbeddedCluster:
    """The roles as the docs recommend (pg_monitor, SELECT on the one table), and what the red
    team found already on a server: dblink with a loopback foreign server, a plain
    superuser-owned function wrapping dblink_exec, a view over a writing function."""
    with shared_cluster.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS marks (id int)")
        for role in ("mon", "linker", "tuner", "resetter", "shadowed"):
            if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone():
                conn.execute(f"CREATE ROLE {role} LOGIN")
            conn.execute(f"GRANT pg_monitor TO {role}; GRANT SELECT ON marks TO {role}")
        conn.execute("CREATE EXTENSION IF NOT EXISTS dblink")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute(
            "DROP SERVER IF EXISTS loop CASCADE; "
            "CREATE SERVER loop FOREIGN DATA WRAPPER dblink_fdw OPTIONS "
            f"(host '{shared_cluster.socket_dir}', port '{shared_cluster.port}', "
            "dbname 'postgres'); "
            "CREATE USER MAPPING FOR PUBLIC SERVER loop "
            "OPTIONS (user 'postgres'); "
            "GRANT USAGE ON FOREIGN SERVER loop TO linker"
        )
        conn.execute(
            "CREATE OR REPLACE FUNCTION public.note() RETURNS text LANGUAGE sql AS "
            "$$ SELECT public.dblink_exec('loop', 'INSERT INTO marks VALUES (1)') $$"
        )
        conn.execute(
            "CREATE OR REPLACE VIEW public.blobs AS SELECT lo_from_bytea(0, 'x') AS made; "
            "GRANT SELECT ON public.blobs TO PUBLIC"
        )
        # Attack 2: a PG 15 parameter grant.
        conn.execute("GRANT ALTER SYSTEM ON PARAMETER work_mem TO tuner")
        # Attack 3: pg_stat_statements_reset() granted to the role.
        conn.execute("GRANT EXECUTE ON FUNCTION pg_stat_statements_reset TO resetter")
    return shared_cluster


def count(cluster: EmbeddedCluster, query: str) -> object:
    with cluster.connect() as conn:
        row = conn.execute(query).fetchone()
    return row[0] if row else None


WRITING_SCRIPTS = {
    # (script, what the refusal names, the query that shows its effect)
    "large objects": (
        "SELECT lo_from_bytea(0, 'x');\n",
        "calls lo_from_bytea(oid,bytea), a volatile function that could write",
        "SELECT count(*) FROM pg_largeobject_metadata",
    ),
    "a view over a writing function": (
        "SELECT * FROM public.blobs;\n",
        "reads view public.blobs, whose query calls lo_from_bytea(oid,bytea)",
        "SELECT count(*) FROM pg_largeobject_metadata",
    ),
    "a wrapper of dblink_exec": (
        "SELECT note();\n",
        "calls public.note(), a volatile function that could write",
        "SELECT count(*) FROM marks",
    ),
    "statistics reset": (
        "SELECT pg_stat_reset();\n",
        "calls pg_stat_reset(), a volatile function that could write",
        "SELECT stats_reset::text FROM pg_stat_database WHERE datname = 'postgres'",
    ),
    "pg_stat_statements reset": (
        "\\set n 1\nSELECT pg_stat_statements_reset() WHERE :n = 1;\n",
        "calls public.pg_stat_statements_reset(oid,oid,bigint",
        "SELECT stats_reset::text FROM pg_stat_statements_info",
    ),
    "ALTER SYSTEM": (
        "ALTER SYSTEM SET work_mem = '7MB';\n",
        "line 1: ALTER SYSTEM, which is not a read",
        "SELECT count(*) FROM pg_file_settings WHERE name = 'work_mem'",
    ),
    "a domain whose check writes": (
        "SELECT 1::public.noted;\n",
        "names domain public.noted, whose check calls public.note(), a volatile function",
        "SELECT count(*) FROM marks",
    ),
    "a STABLE SQL function calling a writing one": (
        "SELECT calm();\n",
        "calls public.calm(), whose body calls public.note(), a volatile function",
        "SELECT count(*) FROM marks",
    ),
    "a STABLE PL/pgSQL function calling a writing one": (
        "SELECT calm_pl();\n",
        "calls public.calm_pl(), whose body calls pg_stat_reset(), a volatile function",
        "SELECT stats_reset::text FROM pg_stat_database WHERE datname = 'postgres'",
    ),
    "a STABLE PL/pgSQL function running a built string": (
        "SELECT 1 WHERE calm_exec() > 0;\n",
        "calls public.calm_exec(), whose body has EXECUTE of a built string",
        "SELECT count(*) FROM marks",
    ),
    "an operator over a writing function": (
        "SELECT 1 OPERATOR(public.###) 2;\n",
        "uses operator public.###, which runs public.plus_and_write(integer,integer)",
        "SELECT count(*) FROM marks",
    ),
}


@pytest.fixture(scope="module")
def operator_over_a_write(server: EmbeddedCluster) -> None:
    """An operator, a domain and STABLE functions whose code writes (through the dblink
    wrapper, or a statistics reset: PostgreSQL lets a STABLE function call a volatile one)."""
    with server.connect() as conn:
        conn.execute(
            "CREATE OR REPLACE FUNCTION public.calm() RETURNS int STABLE LANGUAGE sql AS "
            "$$ SELECT length(public.note()) $$; "
            "CREATE OR REPLACE FUNCTION public.calm_pl() RETURNS int STABLE LANGUAGE plpgsql "
            "AS $$ BEGIN PERFORM pg_stat_reset(); RETURN 1; END $$; "
            "CREATE OR REPLACE FUNCTION public.calm_exec() RETURNS int STABLE "
            "LANGUAGE plpgsql AS $$ BEGIN EXECUTE 'SELECT ' || 'public.note()'; RETURN 1; "
            "END $$"
        )
        conn.execute(
            "DROP DOMAIN IF EXISTS public.noted; "
            "CREATE DOMAIN public.noted AS int CHECK (length(public.note()) > 0)"
        )
        conn.execute(
            "CREATE OR REPLACE FUNCTION public.plus_and_write(int, int) RETURNS int "
            "LANGUAGE sql AS $$ SELECT $1 + $2 + length(public.note()) $$; "
            "DROP OPERATOR IF EXISTS public.### (int, int); "
            "CREATE OPERATOR public.### (LEFTARG = int, RIGHTARG = int, "
            "FUNCTION = public.plus_and_write)"
        )


@pytest.mark.parametrize("attack", sorted(WRITING_SCRIPTS))
def test_a_script_calling_a_writing_function_is_refused_by_the_parse_and_resolve_check_alone(
    server: EmbeddedCluster, operator_over_a_write: None, tmp_path: Path, attack: str
) -> None:
    """Issue 37's acceptance 3, the privilege check not asked: each of these passed it as a
    pg_monitor role (443 large objects, 78 rows through dblink, statistics reset,
    postgresql.auto.conf rewritten). The parse-and-resolve check refuses each by what it
    would run on the server."""
    text, what, _ = WRITING_SCRIPTS[attack]
    script = tmp_path / "attack.sql"
    script.write_text(text)
    role = {"ALTER SYSTEM": "tuner", "pg_stat_statements reset": "resetter"}.get(attack, "mon")
    with pytest.raises(RefusedError) as refused:
        check_script_reads(as_role(server, role), [script])
    message = str(refused.value)
    assert message.startswith("script attack.sql line "), message
    assert what in message, message
    assert message.endswith("unless you pass --allow-writes"), message


@pytest.mark.parametrize("attack", ["large objects", "a wrapper of dblink_exec"])
def test_a_pg_monitor_role_running_a_writing_script_writes_nothing(
    server: EmbeddedCluster, tmp_path: Path, attack: str
) -> None:
    """End to end as the recommended role: `SELECT lo_from_bytea(0,'x')` wrote 443 large
    objects in a 1-s run, the dblink wrapper 78 rows. Refused now before any load (exit 6),
    nothing written."""
    text, what, effect = WRITING_SCRIPTS[attack]
    script = tmp_path / "attack.sql"
    script.write_text(text)
    before = count(server, effect)
    results = tmp_path / "r"
    result = pgscope(
        "run", "--dsn", dsn(server, "mon"), "--script", str(script), *SHORT,
        "--results-dir", str(results),
    )  # fmt: skip
    assert count(server, effect) == before, result.stderr[-1500:]
    assert result.returncode == 6, result.stderr[-1500:]
    assert what in one_line_error(result)
    assert not results.exists(), "refused before any run folder is made"


def test_a_select_only_script_and_the_bundled_read_script_run_as_pg_monitor(
    server: EmbeddedCluster, tmp_path: Path
) -> None:
    script = tmp_path / "read.sql"
    script.write_text(
        "\\set id random(1, 10)\nSELECT count(*), max(id) FROM marks WHERE id <> :id;\n"
        "SELECT now(), random(), clock_timestamp() - now() AS t, 'a' || 'b' AS s;\n"
        "SELECT count(*) FROM pg_stat_activity JOIN pg_locks USING (pid);\n"
    )
    monitoring = tmp_path / "statements.sql"  # its view calls a volatile function: reviewed
    monitoring.write_text(
        "SELECT pg_sleep(0), calls FROM pg_stat_statements LIMIT 1;\n"
        "SELECT count(*) FROM marks TABLESAMPLE bernoulli (50);\n"
    )
    for path in (script, monitoring, RECIPES / "select1.sql"):
        check_script_reads(as_role(server, "mon"), [path])
    results = tmp_path / "r"
    result = pgscope(
        "run", "--dsn", dsn(server, "mon"), "--script", str(script),
        "--script", str(RECIPES / "select1.sql"), *SHORT, "--json",
        "--results-dir", str(results),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-1500:]
    [step] = json.loads(result.stdout)["steps"]
    assert not step["workload_error"], step


def privilege_of(cluster: EmbeddedCluster, role: str) -> str | None:
    with as_role(cluster, role).connect() as session:
        return write_privilege(session)


def test_the_privilege_check_finds_every_way_the_red_team_wrote(server: EmbeddedCluster) -> None:
    """Each of these roles passed the privilege check (issue 37); each is named now. A grant
    to pg_monitor or PUBLIC counts when PostgreSQL did not make it (pg_init_privs keeps what
    initdb and each extension's script granted)."""
    assert privilege_of(server, "tuner") == 'role "tuner" may ALTER SYSTEM parameter work_mem'
    assert privilege_of(server, "linker") == (
        'role "linker" may use foreign server loop, which connects to a server in a session '
        "of its own"
    )
    resetter = privilege_of(server, "resetter") or ""
    assert resetter.startswith('role "resetter" may execute public.pg_stat_statements_reset('), (
        resetter
    )
    # pg_stat_reset() granted to pg_monitor, then to PUBLIC; revoked after (the other
    # tests' roles are pg_monitor's members).
    try:
        with server.connect() as conn:
            conn.execute("GRANT EXECUTE ON FUNCTION pg_stat_reset() TO pg_monitor")
        assert privilege_of(server, "mon") == (
            'role "mon" may execute pg_stat_reset(), which PUBLIC may not by default '
            '(through role "pg_monitor")'
        )
        with server.connect() as conn:
            conn.execute("REVOKE EXECUTE ON FUNCTION pg_stat_reset() FROM pg_monitor")
            conn.execute("GRANT EXECUTE ON FUNCTION pg_stat_reset() TO PUBLIC")
        assert privilege_of(server, "mon") == (
            'role "mon" may execute pg_stat_reset(), which PUBLIC may not by default '
            "(granted to PUBLIC)"
        )
    finally:
        with server.connect() as conn:
            conn.execute("REVOKE EXECUTE ON FUNCTION pg_stat_reset() FROM pg_monitor, PUBLIC")


def test_a_role_that_only_reads_passes_the_completed_privilege_check(
    server: EmbeddedCluster,
) -> None:
    """pg_monitor's own grants (pg_ls_waldir() ...) are PostgreSQL's: not counted; nor is a
    grant of a function that only reads, as a DBA gives to read the server's log (issue 41:
    a granted pg_current_logfile() made `run --dsn` refuse the role)."""
    assert privilege_of(server, "mon") is None
    try:
        with server.connect() as conn:
            conn.execute("GRANT EXECUTE ON FUNCTION pg_current_logfile() TO mon")
            conn.execute("GRANT EXECUTE ON FUNCTION pg_current_logfile(text) TO mon")
        assert privilege_of(server, "mon") is None
    finally:
        with server.connect() as conn:
            conn.execute("REVOKE EXECUTE ON FUNCTION pg_current_logfile() FROM mon")
            conn.execute("REVOKE EXECUTE ON FUNCTION pg_current_logfile(text) FROM mon")


SHADOWS = {
    # The privilege functions the check calls, each in the role's own schema first.
    "has_table_privilege": "oid, oid, text",
    "has_any_column_privilege": "oid, oid, text",
    "has_function_privilege": "oid, oid, text",
    "has_schema_privilege": "oid, oid, text",
    "has_sequence_privilege": "oid, oid, text",
    "has_database_privilege": "oid, text, text",
}


def test_the_privilege_check_is_not_fooled_by_the_roles_search_path(
    server: EmbeddedCluster,
) -> None:
    """`ALTER ROLE r SET search_path = shadow, pg_catalog` with shadow has_*_privilege
    functions answering false made the check pass a role with INSERT, and ran their code (430
    rows written) in a session without the read-only guard. The check now names every
    function in pg_catalog, with the search path pinned, in a read-only transaction: the
    role's INSERT is found and the shadows never run."""
    with server.connect() as conn:
        conn.execute(
            "CREATE SCHEMA IF NOT EXISTS shadow; "
            "CREATE TABLE IF NOT EXISTS shadow.ran (at timestamptz); "
            "GRANT USAGE ON SCHEMA shadow TO shadowed; GRANT INSERT ON marks, shadow.ran "
            "TO shadowed"
        )
        for name, arguments in SHADOWS.items():
            conn.execute(
                f"CREATE OR REPLACE FUNCTION shadow.{name}({arguments}) RETURNS boolean "
                "LANGUAGE plpgsql AS "
                "$$ BEGIN INSERT INTO shadow.ran VALUES (now()); RETURN false; END $$"
            )
        conn.execute("ALTER ROLE shadowed SET search_path = shadow, pg_catalog")
    assert privilege_of(server, "shadowed") == 'role "shadowed" has INSERT on public.marks'
    assert count(server, "SELECT count(*) FROM shadow.ran") == 0, "a shadow function ran"


def test_the_refusal_of_a_writing_function_comes_first_for_a_pg_monitor_role(
    server: EmbeddedCluster, tmp_path: Path
) -> None:
    """A role the privilege check passes still runs no statistics reset through a script."""
    script = tmp_path / "reset.sql"
    script.write_text("SELECT 1;\n-- a comment\nSELECT pg_stat_reset();\n")
    result = pgscope(
        "run", "--dsn", dsn(server, "mon"), "--script", str(script), *SHORT,
        "--results-dir", str(tmp_path / "r"),
    )  # fmt: skip
    assert result.returncode == 6, result.stderr[-1500:]
    assert one_line_error(result).startswith(
        "pgscope: error: script reset.sql line 3: calls pg_stat_reset(), a volatile function"
    )


@pytest.mark.parametrize(
    ("volatility", "what"),
    [
        ("VOLATILE", "public.mood_text(public.mood), a volatile function that could write"),
        ("STABLE", "public.mood_text(public.mood), whose body calls public.note(), a volatile"),
    ],
)
def test_an_implicit_cast_over_a_writing_function_refuses_every_script(
    server: EmbeddedCluster, tmp_path: Path, volatility: str, what: str
) -> None:
    """The server applies an implicit cast where no script names it (a function's argument):
    one whose function could write, itself or in its body, could write from any statement."""
    script = tmp_path / "one.sql"
    script.write_text("SELECT 1;\n")
    with server.connect() as conn:
        conn.execute(
            "DROP TYPE IF EXISTS public.mood CASCADE; CREATE TYPE public.mood AS ENUM ('a'); "
            f"CREATE FUNCTION public.mood_text(public.mood) RETURNS text {volatility} "
            "LANGUAGE sql AS $$ SELECT public.note() $$; "
            "CREATE CAST (public.mood AS text) WITH FUNCTION public.mood_text(public.mood) "
            "AS IMPLICIT"
        )
    try:
        with pytest.raises(RefusedError) as refused:
            check_script_reads(as_role(server, "mon"), [script])
        message = str(refused.value)
        assert "one.sql line 1: the server's implicit cast from public.mood to text runs " in (
            message
        )
        assert what in message, message
    finally:
        with server.connect() as conn:
            conn.execute("DROP TYPE public.mood CASCADE")
    check_script_reads(as_role(server, "mon"), [script])


def test_reads_pass_and_writes_are_refused_on_every_version(
    pg_version: PgBinaries, tmp_path: Path
) -> None:
    """The catalog queries and the reviewed list hold on 15 to 18: the bundled read script and
    reads of the statistics views pass as a pg_monitor role; lo_from_bytea is refused."""
    reads, writes = tmp_path / "reads.sql", tmp_path / "writes.sql"
    reads.write_text(
        "\\set n random(1, 9)\nSELECT count(*) FROM pg_stat_activity a JOIN pg_locks l "
        "USING (pid) WHERE a.pid <> :n;\nSELECT * FROM pg_stat_database, pg_stat_bgwriter;\n"
        "SELECT pg_current_wal_lsn(), pg_database_size(current_database()), now();\n"
    )
    writes.write_text("SELECT 1;\nSELECT lo_from_bytea(0, 'x');\n")
    with EmbeddedCluster(
        pg_version, server_account(None), tmp_path / "server.log",
        {**benchmark_defaults(4), **SMALL_SERVER},
    ) as cluster:  # fmt: skip
        with cluster.connect() as conn:
            conn.execute("CREATE ROLE mon LOGIN; GRANT pg_monitor TO mon")
        role = as_role(cluster, "mon")
        check_script_reads(role, [reads, RECIPES / "select1.sql"])
        with pytest.raises(RefusedError, match=r"writes\.sql line 2: calls lo_from_bytea"):
            check_script_reads(role, [writes])
        with role.connect() as session:
            assert write_privilege(session) is None
