"""What keeps a run on a user's server read-only, and what in a pgbench script would undo it.

The guard is the server's own: every pgbench session starts with
`default_transaction_read_only = on`, put last in the connection's `options` (a DSN's own
`options` cannot override it: libpq takes the connection string's over PGOPTIONS, and the last
`-c` of a setting wins). A script can still lift it from inside its session, so without
--allow-writes a script that could is refused before any load: one that opens a transaction
READ WRITE, sets or resets the read-only settings (SET, RESET ALL, SET SESSION
CHARACTERISTICS, set_config()), or runs a shell command. What it cannot see: a function the
script calls that lifts the guard itself; a role without write privileges closes that too.
"""

from __future__ import annotations

import re
from pathlib import Path

READ_ONLY_OPTION = "-c default_transaction_read_only=on"

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
