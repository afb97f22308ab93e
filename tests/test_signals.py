"""A Ctrl-C that lands inside a library which answers our exception with its own (DuckDB
raises "Query interrupted" when a signal's exception surfaces mid-query): pgscope still knows
it was the signal. No server: runs in milliseconds."""

from __future__ import annotations

import os
import signal

import pytest

from pgscope.errors import ExitCode, Interrupted
from pgscope.signals import received, signals_as_exceptions


def _library_call() -> None:
    """What DuckDB does with the exception our handler raises during a query."""
    try:
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs before the next line
    except Interrupted as exc:
        raise RuntimeError("Query interrupted") from exc


def test_a_signal_a_library_replaced_is_still_known_as_the_signal() -> None:
    with signals_as_exceptions():
        with pytest.raises(RuntimeError, match="Query interrupted"):
            _library_call()
        signalled = received()
    assert isinstance(signalled, Interrupted) and signalled.exit_code == ExitCode.INTERRUPTED


def test_a_new_command_starts_with_no_signal_received() -> None:
    with signals_as_exceptions():
        assert received() is None
        with pytest.raises(Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)
        assert received() is not None
    with signals_as_exceptions():
        assert received() is None
