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
No reading of a script's text can see what a function it calls does: that is why the role's
privileges are the ground (docs/existing-servers.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path

from pgscope.drive.scriptlex import Command, read_script
from pgscope.errors import RefusedError
from pgscope.labels import READ_ONLY_OPTION
from pgscope.target.conn import ConnParams

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
