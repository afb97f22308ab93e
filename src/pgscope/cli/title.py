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

# The options whose value is a connection string: the server (--dsn), the central repository
# pushed to (--to, observe's --push) or read from (--from).
CONNECTION_FLAGS = ("--dsn", "--to", "--from", "--push")


def safe_command_line(argv: list[str]) -> str:
    """The command line as recorded and shown: a connection string (--dsn, --to, --from,
    --push) loses its password."""
    from pgscope.target.conn import ConnParams

    masked: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            arg, hide_next = ConnParams.from_dsn(arg).conninfo(), False
        elif arg in CONNECTION_FLAGS:
            hide_next = True
        elif arg.startswith(tuple(f"{flag}=" for flag in CONNECTION_FLAGS)):
            flag, _, value = arg.partition("=")
            arg = f"{flag}=" + ConnParams.from_dsn(value).conninfo()
        masked.append(arg)
    return shlex.join(masked)


def hide_password() -> None:
    """Rewrite this process's title when its arguments carry a connection string."""
    args = sys.argv[1:]
    if not any(a.split("=", 1)[0] in CONNECTION_FLAGS for a in args):
        return
    import setproctitle

    try:
        title = safe_command_line(["pgscope", *args])
    except Exception:  # a DSN that does not parse: its error comes later, its text stays hidden
        title = "pgscope (arguments hidden: they hold a connection string)"
    setproctitle.setproctitle(title)
