"""Signals as exceptions: SIGINT and SIGTERM become `Interrupted` in the main thread, so the
same `finally` blocks that tear down on errors run on Ctrl-C too, and the user gets one line
with exit code 130 or 143 (never a silent exit: typer turns a bare KeyboardInterrupt into
exit 130 without a word)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from pgscope.errors import ExitCode, Interrupted


@contextmanager
def signals_as_exceptions() -> Iterator[None]:
    """SIGINT/SIGTERM raise `Interrupted` in the main thread; later ones are ignored until the
    block ends, so that teardown is not itself interrupted. Blocks nest: the outer block's
    handler is back when an inner one ends."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if signum == signal.SIGINT:
            raise Interrupted("SIGINT", ExitCode.INTERRUPTED)
        raise Interrupted("SIGTERM", ExitCode.TERMINATED)

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
