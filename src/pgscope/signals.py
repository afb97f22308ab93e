"""Signals as exceptions: SIGINT and SIGTERM become `Interrupted` in the main thread, so the
same `finally` blocks that tear down on errors run on Ctrl-C too, and the user gets one line
with exit code 130 or 143 (never a silent exit: typer turns a bare KeyboardInterrupt into
exit 130 without a word)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
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


def _received(signum: int) -> Interrupted:
    """The `Interrupted` for a signal, remembered as this block's (the first one stays)."""
    if signum == signal.SIGINT:
        exc = Interrupted("SIGINT", ExitCode.INTERRUPTED)
    else:
        exc = Interrupted("SIGTERM", ExitCode.TERMINATED)
    _state["received"] = _state["received"] or exc
    return exc


def _ignore_further() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


@contextmanager
def _handling(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """`handler` for SIGINT and SIGTERM while the block runs; the previous ones after."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def signals_as_exceptions() -> Iterator[None]:
    """SIGINT/SIGTERM raise `Interrupted` in the main thread; later ones are ignored until the
    block ends, so that teardown is not itself interrupted. Blocks nest: the outer block's
    handler is back when an inner one ends."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        _ignore_further()
        raise _received(signum)

    if _state["depth"] == 0:
        _state["received"] = None
    _state["depth"] += 1
    try:
        with _handling(handler):
            yield
    finally:
        _state["depth"] -= 1


@contextmanager
def signals_deferred() -> Iterator[list[Interrupted]]:
    """For short work that must not be cut (a run's last writes, the summary of a run whose
    data is safe): a first SIGINT/SIGTERM is kept in the list this yields, for the caller to
    raise when the work is done; a second one raises at once (the user insists)."""
    pending: list[Interrupted] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        exc = _received(signum)
        if pending:
            _ignore_further()
            raise exc
        pending.append(exc)

    with _handling(handler):
        yield pending
