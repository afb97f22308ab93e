"""What keeps a run on a user's server read-only, and what in a pgbench script would undo it.

The guard is the server's own: every pgbench session starts with
`default_transaction_read_only = on`, put last in the connection's `options` (a DSN's own
`options` cannot override it: libpq takes the connection string's over PGOPTIONS, and the last
`-c` of a setting wins). A script can still lift it from inside its session, so without
--allow-writes a script that could is refused before any load: one that opens a transaction
READ WRITE, sets or resets the read-only settings (SET, RESET ALL, SET SESSION
CHARACTERISTICS, set_config()), or runs a shell command. And something between pgscope and
the server can drop `options` (a pooler), so before any load a session opened exactly as
pgbench's must show the server read-only. What none of this sees: a function the script calls
that lifts the guard itself; a role without write privileges closes that too
(docs/existing-servers.md).
"""

from __future__ import annotations

import re
from pathlib import Path

from pgscope.errors import RefusedError
from pgscope.target.conn import ConnParams

READ_ONLY_OPTION = "-c default_transaction_read_only=on"
# What the server must answer, asked in a session opened as pgbench opens its own.
_GUARD_SETTINGS = ("default_transaction_read_only", "transaction_read_only")

# SQL comments, removed before looking: `-- ...` to the end of the line, and `/* ... */`.
_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)
_LIFTS = (
    (re.compile(r"\bread\s+write\b", re.IGNORECASE), "a READ WRITE transaction"),
    (
        re.compile(r"\b(default_)?transaction_read_only\b", re.IGNORECASE),
        "a change of the read-only setting",
    ),
    (re.compile(r"\bset_config\b", re.IGNORECASE), "set_config(), which changes settings"),
    (
        re.compile(r"\bsession\s+characteristics\b", re.IGNORECASE),
        "SET SESSION CHARACTERISTICS",
    ),
    (re.compile(r"\breset\s+all\b", re.IGNORECASE), "RESET ALL"),
    (re.compile(r"^\s*\\(set)?shell\b", re.IGNORECASE | re.MULTILINE), "a shell command"),
)


def with_read_only(options: str | None) -> str:
    """A connection's `options` with the read-only guard last, where nothing overrides it."""
    return f"{options} {READ_ONLY_OPTION}" if options and options.strip() else READ_ONLY_OPTION


def guarded(conn: ConnParams) -> ConnParams:
    """The connection pgbench opens on a user's server: the DSN's own parameters, the guard
    last in their `options`."""
    params = dict(conn.params)
    params["options"] = with_read_only(params.get("options"))
    return ConnParams(params, conn.secrets)


def verify_read_only(conn: ConnParams) -> None:
    """Before any load: open a session exactly as pgbench will and ask the server whether it
    is read-only. Something between pgscope and the server can drop the guard (a connection
    pooler that ignores `options`), and then only the server's answer tells."""
    with guarded(conn).connect() as session:
        shown = {}
        for name in _GUARD_SETTINGS:
            row = session.execute(f"SHOW {name}").fetchone()
            shown[name] = str(row[0]) if row else "unknown"
    lifted = [f"{name} = {value}" for name, value in shown.items() if value != "on"]
    if lifted:
        raise RefusedError(
            f"the read-only guard did not hold on {conn.conninfo()}: a session opened as "
            f"pgbench opens its own shows {', '.join(lifted)} (does a connection pooler drop "
            f"the `options` connection parameter?); pgscope only reads from an existing "
            f"server: connect to the server directly, or pass --allow-writes"
        )


def lifting_statement(script: Path) -> str | None:
    """Why `script` could lift the read-only guard (its first such line), or None."""
    # pgbench reads a script as bytes in any encoding: what the patterns look for is ASCII.
    raw = script.read_text(encoding="utf-8", errors="surrogateescape")
    text = _COMMENTS.sub(lambda m: "\n" * m.group(0).count("\n"), raw)
    for pattern, what in _LIFTS:
        found = pattern.search(text)
        if found:
            line = text.count("\n", 0, found.start()) + 1
            return f"{script.name} line {line}: {what}"
    return None
