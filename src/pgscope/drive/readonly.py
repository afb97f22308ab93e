"""What keeps a run on a user's server read-only, and what in a pgbench script would undo it.

Read-only rests on the server: before a user's scripts run there, their role must be one
that cannot write (target/privileges.py); what a script could do then is what that role may.
Two layers stand in front of it. Every pgbench session starts with
`default_transaction_read_only = on`, put last in the connection's `options` (a DSN's own
`options` cannot override it: libpq takes the connection string's over PGOPTIONS, and the last
`-c` of a setting wins), and before any load a session opened exactly as pgbench's must show
the server read-only (something between pgscope and the server, a pooler, can drop
`options`). And without --allow-writes a script that could lift that setting from inside its
session is refused before any load, judged on its tokens as pgbench and the server read them
(drive/scriptlex.py), not on its spelling: a READ WRITE transaction; SET, RESET or
set_config() of the read-only settings, RESET ALL, SET SESSION CHARACTERISTICS; code that
cannot be judged (a DO block, a function's body, EXECUTE of a built string, the functions
that run SQL given as text); a change of how the server reads the script's text
(standard_conforming_strings, client_encoding); a shell command; and, under the simple
protocol, a `:variable` a query set (`\\gset`), whose text pgbench pastes into the SQL.
And, on the server, `check_script_reads`: every statement must be a read by PostgreSQL's own
parser (drive/statements.py), and every function it would run (called, behind an operator, a
type, a view, a row security policy, a domain, or in the body of an SQL or PL/pgSQL function
it runs), resolved on the server in every schema with the search path pinned, must be one
PostgreSQL keeps from writing (STABLE or IMMUTABLE) or a reviewed harmless volatile built-in.
The role's privileges stay the ground under all of it (docs/existing-servers.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import psycopg

from pgscope.drive.scriptlex import Command, read_script
from pgscope.drive.statements import (
    Name,
    NotARead,
    Uses,
    body_uses,
    defined_variables,
    read_uses,
    sql_uses,
)
from pgscope.errors import RefusedError
from pgscope.labels import READ_ONLY_OPTION
from pgscope.target.conn import ConnParams
from pgscope.target.privileges import pinned

# What the server must answer, asked in a session opened as pgbench opens its own.
_GUARD_SETTINGS = ("default_transaction_read_only", "transaction_read_only")
_READ_ONLY_SETTINGS = frozenset(_GUARD_SETTINGS)
# Settings that change how the server reads a script's text from how pgbench (and this
# check) read it: with standard_conforming_strings off a backslash escapes a quote in '...',
# and some client encodings have a backslash as the second byte of a character.
_SCANNING_SETTINGS = frozenset({"standard_conforming_strings", "client_encoding"})
# Functions that run SQL given to them as text: what they run cannot be judged here.
_SQL_RUNNERS = frozenset(
    {
        "query_to_xml",
        "query_to_xmlschema",
        "query_to_xml_and_xmlschema",
        "ts_stat",
        "ts_rewrite",
        "dblink",
        "dblink_exec",
        "dblink_open",
        "dblink_send_query",
    }
)
_SHELL = frozenset({"shell", "setshell"})
_SETS_VARIABLES = frozenset({"gset", "aset"})
# Client encodings in which a backslash or quote byte can end a multibyte character: the
# server would read a script's quoting differently from pgbench.
_UNSAFE_ENCODINGS = frozenset({"SJIS", "SHIFT_JIS_2004", "BIG5", "GBK", "GB18030", "UHC", "JOHAB"})


def with_read_only(options: str | None) -> str:
    """A connection's `options` with the read-only guard last, where nothing overrides it."""
    return f"{options} {READ_ONLY_OPTION}" if options and options.strip() else READ_ONLY_OPTION


def guarded(conn: ConnParams) -> ConnParams:
    """The connection pgbench opens on a user's server: the DSN's own parameters, the guard
    last in their `options`."""
    params = dict(conn.params)
    params["options"] = with_read_only(params.get("options"))
    return ConnParams(params, conn.secrets)


def verify_read_only(conn: ConnParams, scripts: bool) -> None:
    """Before any load: open a session exactly as pgbench will and ask the server whether it
    is read-only. Something between pgscope and the server can drop the guard (a connection
    pooler that ignores `options`), and then only the server's answer tells. With `scripts`
    (a user's to run), the session must also read SQL text as pgbench does."""
    with guarded(conn).connect() as session:
        shown = {}
        for name in (*_GUARD_SETTINGS, "standard_conforming_strings", "client_encoding"):
            row = session.execute(f"SHOW {name}").fetchone()
            shown[name] = str(row[0]) if row else "unknown"
    lifted = [f"{name} = {shown[name]}" for name in _GUARD_SETTINGS if shown[name] != "on"]
    if lifted:
        raise RefusedError(
            f"the read-only guard did not hold on {conn.conninfo()}: a session opened as "
            f"pgbench opens its own shows {', '.join(lifted)} (does a connection pooler drop "
            f"the `options` connection parameter?); pgscope only reads from an existing "
            f"server: connect to the server directly, or pass --allow-writes"
        )
    if scripts and (
        shown["standard_conforming_strings"] != "on"
        or shown["client_encoding"] in _UNSAFE_ENCODINGS
    ):
        raise RefusedError(
            f"sessions on {conn.conninfo()} read SQL with standard_conforming_strings = "
            f"{shown['standard_conforming_strings']} and client_encoding = "
            f"{shown['client_encoding']}: the server would read a script's quotes otherwise "
            f"than pgbench and pgscope's check of it do; connect with standard_conforming_strings "
            f"on and a client_encoding such as UTF8, or pass --allow-writes"
        )


def lifting_statement(scripts: Sequence[Path], protocol: str) -> str | None:
    """Why one of `scripts` could lift the read-only guard (`name line N: what`, the first
    such command), or None. They are judged together: pgbench's variables are the client's,
    shared by its scripts, so one script's `\\gset` can fill another's `:name`."""
    read = [(path, read_script(_text(path))) for path in scripts]
    for path, commands in read:
        for command in commands:
            what = _lifts(command)
            if what is not None:
                return f"{path.name} line {command.line}: {what}"
    if protocol != "simple":
        return None  # extended and prepared send a variable as a parameter: a value, no SQL
    setters = [(path, c) for path, commands in read for c in commands if c.meta in _SETS_VARIABLES]
    for path, commands in read:
        for command in commands:
            for name in command.variables() if command.meta is None else []:
                setter = next(
                    (s for s in setters if name.startswith(_prefix(s[1]))),
                    None,
                )
                if setter is not None:
                    return (
                        f"{path.name} line {command.line}: :{name}, which \\{setter[1].meta} "
                        f"({setter[0].name} line {setter[1].line}) can set to any text a query "
                        f"returns, pasted into the SQL by the simple protocol (--protocol "
                        f"prepared or extended sends it as a value)"
                    )
    return None


def _text(script: Path) -> str:
    # pgbench reads a script as bytes in any encoding: what is looked for is ASCII, and a
    # byte that is not UTF-8 stays a character of its own (an identifier's, as pgbench has it).
    return script.read_text(encoding="utf-8", errors="surrogateescape")


def _prefix(setter: Command) -> str:
    """The prefix `\\gset PREFIX` gives the variables it sets ('' : any name)."""
    return setter.args.split()[0] if setter.args.split() else ""


def _lifts(command: Command) -> str | None:
    """What in one command could lift the guard, in words, or None."""
    if command.meta is not None:
        return f"a shell command (\\{command.meta})" if command.meta in _SHELL else None
    words = command.words()
    named = {t.text for t in command.tokens if t.kind in ("word", "ident", "string")}
    pairs = set(pairwise(words))
    lead = [w for w in words[:4] if w not in ("or", "replace")]
    if ("session", "characteristics") in pairs:
        return "SET SESSION CHARACTERISTICS"
    if ("read", "write") in pairs:
        return "a READ WRITE transaction"
    if named & _READ_ONLY_SETTINGS:
        return "a change of the read-only setting"
    if {t.text for t in command.tokens if t.kind in ("word", "ident")} & {"set_config"}:
        return "set_config(), which changes settings"
    if ("reset", "all") in pairs:
        return "RESET ALL"
    if named & _SCANNING_SETTINGS or ("set", "names") in pairs:
        return "a change of how the server reads the script's text (its quoting or encoding)"
    if words[:1] == ["do"]:
        return "a DO block, whose code cannot be judged"
    if lead[:1] == ["create"] and {"function", "procedure"} & set(lead[1:3]):
        return "a function's body, whose code cannot be judged"
    runners = {t.text for t in command.tokens if t.kind in ("word", "ident")} & _SQL_RUNNERS
    if runners:
        return f"{min(runners)}(), which runs SQL given as text"
    for token, following in pairwise(command.tokens):
        if token.kind == "word" and token.text == "execute" and following.kind != "word":
            return "EXECUTE of a built string, which cannot be judged"
    return None


# -- PostgreSQL's own rules: reads only, and only functions that cannot write -----------------

# Volatile functions of pg_catalog that only read, or act on the calling session alone:
# reviewed one by one. Every other volatile function is refused (lo_from_bytea, nextval,
# pg_stat_reset, pg_advisory_lock, pg_notify, set_config, pg_terminate_backend ...).
HARMLESS_VOLATILE = frozenset(
    {
        # time and chance
        "random", "random_normal", "setseed", "clock_timestamp", "timeofday",
        "pg_sleep", "pg_sleep_for", "pg_sleep_until", "gen_random_uuid", "uuidv4", "uuidv7",
        # where the server is (read)
        "pg_current_wal_lsn", "pg_current_wal_insert_lsn", "pg_current_wal_flush_lsn",
        "pg_last_wal_receive_lsn", "pg_last_wal_replay_lsn", "pg_last_xact_replay_timestamp",
        "pg_is_in_recovery", "pg_is_wal_replay_paused", "pg_get_wal_replay_pause_state",
        "pg_control_checkpoint", "pg_control_init", "pg_control_recovery", "pg_control_system",
        "pg_current_logfile", "pg_jit_available", "pg_notification_queue_usage",
        "pg_database_size", "pg_relation_size", "pg_table_size", "pg_indexes_size",
        "pg_total_relation_size", "pg_tablespace_size", "pg_blocking_pids",
        "pg_safe_snapshot_blocking_pids", "pg_xact_status", "txid_status",
        "pg_xact_commit_timestamp", "pg_xact_commit_timestamp_origin", "pg_last_committed_xact",
        "pg_collation_actual_version", "pg_database_collation_actual_version",
        # the statistics and activity views' own functions (read)
        "current_query", "pg_stat_clear_snapshot", "pg_stat_have_stats",
        "pg_stat_get_xact_blocks_fetched", "pg_stat_get_xact_blocks_hit",
        "pg_stat_get_xact_function_calls", "pg_stat_get_xact_function_self_time",
        "pg_stat_get_xact_function_total_time", "pg_stat_get_xact_numscans",
        "pg_stat_get_xact_tuples_deleted", "pg_stat_get_xact_tuples_fetched",
        "pg_stat_get_xact_tuples_hot_updated", "pg_stat_get_xact_tuples_newpage_updated",
        "pg_stat_get_xact_tuples_inserted", "pg_stat_get_xact_tuples_returned",
        "pg_stat_get_xact_tuples_updated", "pg_stat_get_recovery_prefetch",
        "pg_lock_status", "pg_get_backend_memory_contexts", "pg_get_shmem_allocations",
        "pg_get_multixact_members", "pg_prepared_xact", "pg_show_all_file_settings",
        "pg_hba_file_rules", "pg_ident_file_mappings", "pg_get_wal_resource_managers",
        "pg_show_replication_origin_status", "pg_partition_tree", "pg_partition_ancestors",
        "pg_ls_waldir", "pg_ls_logdir", "pg_ls_tmpdir", "pg_ls_archive_statusdir",
        # a sequence's last value, read (nextval and setval take or set one: refused)
        "currval", "lastval", "pg_sequence_last_value",
        # TABLESAMPLE's methods (handlers that describe the sampling)
        "bernoulli", "system",
    }
)  # fmt: skip
# Volatile functions of an extension that only read, by (extension, function).
HARMLESS_EXTENSION_VOLATILE = frozenset(
    {
        ("pg_stat_statements", "pg_stat_statements"),
        ("pg_stat_statements", "pg_stat_statements_info"),
    }
)
# Schemas whose views are the server's own (their queries are PostgreSQL's, not a role's).
_SYSTEM_SCHEMAS = ("pg_catalog", "information_schema")
# How deep views over views are followed before the script is refused as not judged.
_MAX_DEPTH = 32

# (schema, name, extension) of the function `f`, and whether it can write: volatile, or an
# aggregate with a volatile support function (an aggregate's own mark says nothing of them).
_FUNCTION_COLUMNS = """
    fn.nspname, f.proname, f.oid::pg_catalog.regprocedure::pg_catalog.text,
    (f.provolatile OPERATOR(pg_catalog.=) 'v' OR EXISTS (
        SELECT FROM pg_catalog.pg_aggregate a JOIN pg_catalog.pg_proc s
            ON s.oid OPERATOR(pg_catalog.=) ANY (ARRAY[a.aggtransfn, a.aggfinalfn,
                a.aggcombinefn, a.aggserialfn, a.aggdeserialfn, a.aggmtransfn,
                a.aggminvtransfn, a.aggmfinalfn]::pg_catalog.oid[])
        WHERE a.aggfnoid OPERATOR(pg_catalog.=) f.oid
          AND s.provolatile OPERATOR(pg_catalog.=) 'v')),
    (SELECT e.extname FROM pg_catalog.pg_depend d
        JOIN pg_catalog.pg_extension e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
        WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
          AND d.objid OPERATOR(pg_catalog.=) f.oid
          AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
          AND d.deptype OPERATOR(pg_catalog.=) 'e' LIMIT 1),
    l.lanname::pg_catalog.text,
    CASE WHEN l.lanname OPERATOR(pg_catalog.=) ANY ('{sql,plpgsql}'::pg_catalog.name[])
          AND f.prokind OPERATOR(pg_catalog.=) 'f'
          AND fn.nspname OPERATOR(pg_catalog.<>) 'pg_catalog'::pg_catalog.name
        THEN pg_catalog.pg_get_functiondef(f.oid) END
"""
# The language of the function `f` (joined by every query that reads _FUNCTION_COLUMNS).
_LANGUAGE = "JOIN pg_catalog.pg_language l ON l.oid OPERATOR(pg_catalog.=) f.prolang"
_FUNCTIONS = f"""
SELECT f.proname, fn.nspname, f.pronargs, {_FUNCTION_COLUMNS}
FROM pg_catalog.pg_proc f
JOIN pg_catalog.pg_namespace fn ON fn.oid OPERATOR(pg_catalog.=) f.pronamespace
{_LANGUAGE}
WHERE f.proname OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.text[])
"""
_OPERATORS = f"""
SELECT o.oprname, n.nspname, 0, {_FUNCTION_COLUMNS}
FROM pg_catalog.pg_operator o
JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) o.oprnamespace
JOIN pg_catalog.pg_proc f ON f.oid OPERATOR(pg_catalog.=) o.oprcode
JOIN pg_catalog.pg_namespace fn ON fn.oid OPERATOR(pg_catalog.=) f.pronamespace
{_LANGUAGE}
WHERE o.oprname OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.text[])
"""
# A type's input function, and the functions of the casts to it.
_TYPES = f"""
SELECT t.typname, n.nspname, 0, {_FUNCTION_COLUMNS}
FROM pg_catalog.pg_type t
JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) t.typnamespace
CROSS JOIN LATERAL (
    SELECT t.typinput::pg_catalog.oid
    UNION ALL
    SELECT c.castfunc FROM pg_catalog.pg_cast c
    WHERE c.casttarget OPERATOR(pg_catalog.=) t.oid
      AND c.castfunc OPERATOR(pg_catalog.<>) 0
) AS x(fn)
JOIN pg_catalog.pg_proc f ON f.oid OPERATOR(pg_catalog.=) x.fn
JOIN pg_catalog.pg_namespace fn ON fn.oid OPERATOR(pg_catalog.=) f.pronamespace
{_LANGUAGE}
WHERE t.typname OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.text[])
"""
# A relation: its kind, a view's query (not the server's own views) and its row security
# policies' expressions (which run as it is read).
_RELATIONS = """
SELECT c.relname, n.nspname, c.relkind::pg_catalog.text,
    pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.'
        OPERATOR(pg_catalog.||) pg_catalog.quote_ident(c.relname),
    CASE WHEN c.relkind OPERATOR(pg_catalog.=) 'v'
          AND NOT n.nspname OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.text[])
        THEN pg_catalog.pg_get_viewdef(c.oid) END,
    ARRAY(SELECT pg_catalog.pg_get_expr(p.polqual, p.polrelid) FROM pg_catalog.pg_policy p
          WHERE p.polrelid OPERATOR(pg_catalog.=) c.oid AND p.polqual IS NOT NULL
            AND c.relrowsecurity)
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
WHERE c.relname OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.text[])
  AND c.relkind OPERATOR(pg_catalog.=) ANY ('{r,p,v,m,f}'::pg_catalog.char[])
"""


# A domain's CHECK expressions (a cast to it runs them), and the domain it is over.
_DOMAINS = """
SELECT t.typname, n.nspname, pg_catalog.format_type(t.oid, NULL),
    ARRAY(SELECT pg_catalog.pg_get_expr(c.conbin, 0) FROM pg_catalog.pg_constraint c
          WHERE c.contypid OPERATOR(pg_catalog.=) t.oid AND c.conbin IS NOT NULL),
    b.typname, bn.nspname
FROM pg_catalog.pg_type t
JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) t.typnamespace
JOIN pg_catalog.pg_type b ON b.oid OPERATOR(pg_catalog.=) t.typbasetype
JOIN pg_catalog.pg_namespace bn ON bn.oid OPERATOR(pg_catalog.=) b.typnamespace
WHERE t.typtype OPERATOR(pg_catalog.=) 'd'
  AND t.typname OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.text[])
"""
# Functions the server runs without a script naming them, wherever a value is converted,
# sorted, hashed, compared or sent: implicit casts, operator classes' support functions, types'
# output functions. One that could write could write from any statement, so it refuses every
# script. (PostgreSQL's own are all STABLE or IMMUTABLE: only the volatile ones, and the ones
# outside pg_catalog, are read.)
_UNASKED = f"""
SELECT 'unasked', '', 0, {_FUNCTION_COLUMNS}, u.what
FROM (
    SELECT c.castfunc, 'the server''s implicit cast from '
        OPERATOR(pg_catalog.||) c.castsource::pg_catalog.regtype::pg_catalog.text
        OPERATOR(pg_catalog.||) ' to '
        OPERATOR(pg_catalog.||) c.casttarget::pg_catalog.regtype::pg_catalog.text
    FROM pg_catalog.pg_cast c WHERE c.castcontext OPERATOR(pg_catalog.<>) 'e'
    UNION ALL
    SELECT p.amproc::pg_catalog.oid, 'the support function of operator family '
        OPERATOR(pg_catalog.||) p.amprocfamily::pg_catalog.text
    FROM pg_catalog.pg_amproc p
    UNION ALL
    SELECT t.typoutput::pg_catalog.oid, 'the output function of type '
        OPERATOR(pg_catalog.||) t.oid::pg_catalog.regtype::pg_catalog.text
    FROM pg_catalog.pg_type t
) AS u(fn, what)
JOIN pg_catalog.pg_proc f ON f.oid OPERATOR(pg_catalog.=) u.fn
JOIN pg_catalog.pg_namespace fn ON fn.oid OPERATOR(pg_catalog.=) f.pronamespace
{_LANGUAGE}
WHERE f.provolatile OPERATOR(pg_catalog.=) 'v'
   OR fn.nspname OPERATOR(pg_catalog.<>) 'pg_catalog'::pg_catalog.name
"""


def check_script_reads(conn: ConnParams, scripts: Sequence[Path]) -> None:
    """Refuse (RefusedError, one line naming the file, line and what) a script on a user's
    server unless every SQL statement in it is a read by PostgreSQL's own parser, and every
    function it would run, resolved on the server, cannot write: STABLE or IMMUTABLE (the
    server refuses writes inside those) or one of the reviewed harmless volatile built-ins.
    Names are resolved in every schema (an unqualified name could be any schema's, by the
    role's search path or one the script sets), each candidate counting."""
    uses: list[Uses] = []
    read = [(path, read_script(_text(path))) for path in scripts]
    defined = defined_variables([command for _, commands in read for command in commands])
    for path, commands in read:
        for command in commands:
            if command.meta is not None:
                continue
            where = f"{path.name} line {command.line}"
            try:
                uses.append(read_uses(command, where, defined))
            except NotARead as exc:
                raise _not_read(f"{where}: {exc}") from None
    with guarded(conn).connect() as session, pinned(session):
        casts = _unasked(session, uses)
        why = casts if isinstance(casts, str) else _first_unsafe(session, uses, casts)
    if why is not None:
        raise _not_read(why)


def _not_read(why: str) -> RefusedError:
    return RefusedError(
        f"script {why}; pgscope runs only reads on an existing server (PostgreSQL's parser "
        f"and its functions' volatility decide) unless you pass --allow-writes"
    )


def _unasked(
    session: psycopg.Connection[Any], uses: list[Uses]
) -> list[tuple[str, str, Name]] | str:
    """Why a function the server runs unasked (_UNASKED) could write, or what the bodies of
    those outside pg_catalog run (judged with the script's own, at its first statement)."""
    if not uses:
        return []
    inner: list[tuple[str, str, Name]] = []
    for row in session.execute(_UNASKED).fetchall():
        function, what = Function(*row[3:-1]), row[-1]
        said = f"{uses[0].where}: {what} runs {function.signature}"
        why = function.unsafe()
        if why is not None:
            return f"{said}, {why}, wherever the server applies it"
        if function.definition is not None:
            try:
                body = body_uses(function.language, function.definition)
            except NotARead as exc:
                return f"{said}, whose body has {exc}"
            inner += [
                (uses[0].where, f"{said[len(uses[0].where) + 2 :]}, whose body ", n) for n in body
            ]
    return inner


def _first_unsafe(
    session: psycopg.Connection[Any], uses: list[Uses], more: list[tuple[str, str, Name]]
) -> str | None:
    """The first thing in `uses` (and `more`, found elsewhere) that could write, in words
    (`s.sql line 1: calls ...`), or None. Views' queries, policies, domains' checks and
    functions' bodies are followed, as what running them runs."""
    pending = [(use.where, "", name) for use in uses for name in use.names] + more
    seen: set[tuple[str, Name]] = set()
    for _ in range(_MAX_DEPTH):
        pending = [p for p in pending if (p[0], p[2]) not in seen]
        if not pending:
            return None
        seen |= {(where, name) for where, _, name in pending}
        bodies = _unsafe_calls(session, pending)
        if isinstance(bodies, str):
            return bodies
        following = _read_relations(session, [p for p in pending if p[2].kind == "relation"])
        if isinstance(following, str):
            return following
        checks = _domain_checks(session, [p for p in pending if p[2].kind == "type"])
        if isinstance(checks, str):
            return checks
        pending = bodies + following + checks
    where, through, name = pending[0]
    return f"{where}: {through}{name.shown()}: views or functions nested too deep to judge"


@dataclass(frozen=True)
class Function:
    """A function the server would run, as _FUNCTION_COLUMNS reads it."""

    schema: str
    name: str
    signature: str
    volatile: bool
    extension: str | None
    language: str
    definition: str | None  # SQL and PL/pgSQL outside pg_catalog: its body is read too

    def unsafe(self) -> str | None:
        """Why the server could not be trusted to keep this function from writing, or None."""
        if self.volatile and not _harmless(self.schema, self.name, self.extension):
            return "a volatile function that could write"
        if self.schema != "pg_catalog" and self.language not in _JUDGED_LANGUAGES:
            return (
                f"a function in language {self.language}, which can run SQL (a volatile "
                f"function's call too) that is not read here"
            )
        return None


# Languages whose functions are judged: C and internal ones by their volatility (the server's
# own, and an extension's, installed by a superuser); SQL and PL/pgSQL by their volatility
# and their bodies, read here. Any other (PL/Perl, PL/Python ...) could run any SQL.
_JUDGED_LANGUAGES = frozenset({"internal", "c", "sql", "plpgsql"})


def _unsafe_calls(
    session: psycopg.Connection[Any], pending: list[tuple[str, str, Name]]
) -> list[tuple[str, str, Name]] | str:
    """Why a function, operator or type in `pending` could write, or what the bodies of the
    SQL and PL/pgSQL functions they run would run in turn (to be judged the same way)."""
    inner: list[tuple[str, str, Name]] = []
    for kind, query, what in (
        ("function", _FUNCTIONS, "calls"),
        ("operator", _OPERATORS, "uses operator"),
        ("type", _TYPES, "names type"),
    ):
        wanted = [p for p in pending if p[2].kind == kind]
        if not wanted:
            continue
        rows = session.execute(query, [sorted({p[2].name for p in wanted})]).fetchall()
        for where, through, name in sorted(wanted, key=lambda p: (p[0], p[1], p[2].name)):
            for found, schema, arguments, *columns in rows:
                if found != name.name or (name.schema is not None and schema != name.schema):
                    continue
                if name.one_argument and arguments != 1:
                    continue
                function = Function(*columns)
                runs = "" if kind == "function" else f", which runs {function.signature}"
                shown = function.signature if kind == "function" else name.shown()
                said = f"{where}: {through}{what} {shown}{runs}"
                why = function.unsafe()
                if why is not None:
                    return f"{said}, {why}"
                if function.definition is None:
                    continue
                try:
                    body = body_uses(function.language, function.definition)
                except NotARead as exc:
                    return f"{said}, whose body has {exc}"
                context = f"{through}{what} {shown}{runs}, whose body "
                inner += [(where, context, n) for n in body]
    return inner


def _harmless(schema: str, name: str, extension: str | None) -> bool:
    if extension is not None:
        return (extension, name) in HARMLESS_EXTENSION_VOLATILE
    return schema == "pg_catalog" and name in HARMLESS_VOLATILE


def _read_relations(
    session: psycopg.Connection[Any], relations: list[tuple[str, str, Name]]
) -> list[tuple[str, str, Name]] | str:
    """What reading `relations` runs (their views' queries, their policies), or why one of
    them cannot be read (a foreign table, a view whose query is not a read)."""
    if not relations:
        return []
    names = sorted({r[2].name for r in relations})
    rows = session.execute(_RELATIONS, [list(_SYSTEM_SCHEMAS), names]).fetchall()
    found: list[tuple[str, str, Name]] = []
    for where, through, name in relations:
        for relname, schema, relkind, shown, view, policies in rows:
            if relname != name.name or (name.schema is not None and schema != name.schema):
                continue
            if relkind == "f":
                return (
                    f"{where}: {through}reads foreign table {shown}, which another server "
                    f"answers in a session of its own"
                )
            queries = ([f"view {shown}, whose query", view] if view else []) + [
                item
                for policy in policies
                for item in (f"table {shown}, whose row security policy", f"SELECT {policy}")
            ]
            for context, sql in zip(queries[::2], queries[1::2], strict=True):
                try:
                    inner = sql_uses(sql)
                except NotARead as exc:
                    return f"{where}: {through}reads {context} is not a read: {exc}"
                found += [(where, f"{through}reads {context} ", n) for n in inner]
    return found


def _domain_checks(
    session: psycopg.Connection[Any], types: list[tuple[str, str, Name]]
) -> list[tuple[str, str, Name]] | str:
    """What a cast to the domains among `types` runs (their CHECK expressions), and the
    domains they are over; or why one of them cannot be judged."""
    if not types:
        return []
    rows = session.execute(_DOMAINS, [sorted({t[2].name for t in types})]).fetchall()
    found: list[tuple[str, str, Name]] = []
    for where, through, name in types:
        for typname, schema, shown, checks, base, base_schema in rows:
            if typname != name.name or (name.schema is not None and schema != name.schema):
                continue
            context = f"{through}names domain {shown}, whose check"
            over = f"{through}names domain {shown}, over which it is: "
            found.append((where, over, Name("type", base_schema, base)))
            for check in checks:
                try:
                    inner = sql_uses(f"SELECT {check}")
                except NotARead as exc:
                    return f"{where}: {context} is not a read: {exc}"
                found += [(where, context + " ", n) for n in inner]
    return found
