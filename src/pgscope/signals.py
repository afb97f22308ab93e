"""Signals as exceptions: SIGINT and SIGTERM become `Interrupted` in the main thread, so the
same `finally` blocks that tear down on errors run on Ctrl-C too, and the user gets one line
with exit code 130 or 143 (never a silent exit: typer turns a bare KeyboardInterrupt into
exit 130 without a word)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from pgscope.errors import ExitCode, Interrupted

# The signal that arrived in the outermost block, if any: a library that catches our exception
# in its own code (DuckDB turns it into "Query interrupted") must not turn a Ctrl-C into an
# internal error and a lost summary.
_state: dict[str, Any] = {"depth": 0, "received": None}


def received() -> Interrupted | None:
    """The `Interrupted` a signal raised in the current block, even where another library
    caught it and raised its own error instead."""
    found = _state["received"]
    return found if isinstance(found, Interrupted) else None


@contextmanager
def signals_as_exceptions() -> Iterator[None]:
    """SIGINT/SIGTERM raise `Interrupted` in the main thread; later ones are ignored until the
    block ends, so that teardown is not itself interrupted. Blocks nest: the outer block's
    handler is back when an inner one ends."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if signum == signal.SIGINT:
            exc = Interrupted("SIGINT", ExitCode.INTERRUPTED)
        else:
            exc = Interrupted("SIGTERM", ExitCode.TERMINATED)
        _state["received"] = _state["received"] or exc
        raise exc

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    if _state["depth"] == 0:
        _state["received"] = None
    _state["depth"] += 1
    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        _state["depth"] -= 1
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def signals_deferred(reraise: bool = True) -> Iterator[list[Interrupted]]:
    """For short work that must not be cut (a run's last writes, the summary of a run whose
    data is safe): a first SIGINT/SIGTERM is kept, in the list this yields, and raised as
    `Interrupted` when the block ends (`reraise`) or left to the caller; a second one raises
    at once (the user insists)."""
    pending: list[Interrupted] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        code = ExitCode.INTERRUPTED if signum == signal.SIGINT else ExitCode.TERMINATED
        exc = Interrupted(signal.Signals(signum).name, code)
        _state["received"] = _state["received"] or exc
        if pending:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            raise exc
        pending.append(exc)

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, handler)
    try:
        yield pending
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    if pending and reraise:
        raise pending[0]
