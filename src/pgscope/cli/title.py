"""pgscope's own process title, without the password a --dsn may carry.

Every user of the host can read a process's arguments (`ps`, /proc/PID/cmdline); a
`--dsn "... password=..."` would show there for as long as pgscope runs. The title is
rewritten with the password masked as soon as the command line is read, before the rest of
pgscope is imported (the first ~0.1 s of start-up remain: pass the password in PGPASSWORD
or ~/.pgpass to leave no window at all).
"""

from __future__ import annotations

import shlex
import sys


def safe_command_line(argv: list[str]) -> str:
    """The command line as recorded and shown: a --dsn value loses its password."""
    from pgscope.target.conn import ConnParams

    masked: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            arg, hide_next = ConnParams.from_dsn(arg).conninfo(), False
        elif arg == "--dsn":
            hide_next = True
        elif arg.startswith("--dsn="):
            arg = "--dsn=" + ConnParams.from_dsn(arg[len("--dsn=") :]).conninfo()
        masked.append(arg)
    return shlex.join(masked)


def hide_password() -> None:
    """Rewrite this process's title when its arguments carry a --dsn."""
    args = sys.argv[1:]
    if not any(a == "--dsn" or a.startswith("--dsn=") for a in args):
        return
    import setproctitle

    try:
        title = safe_command_line(["pgscope", *args])
    except Exception:  # a DSN that does not parse: its error comes later, its text stays hidden
        title = "pgscope (arguments hidden: they hold a --dsn)"
    setproctitle.setproctitle(title)
