"""A Ctrl-C that lands inside DuckDB: DuckDB answers our exception with its own ("Query
interrupted"); pgscope still knows it was a signal. No server: runs in about a second."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from pgscope.duck import connect
from pgscope.errors import ExitCode, Interrupted
from pgscope.signals import received, signals_as_exceptions


def test_a_signal_inside_a_duckdb_query_is_still_known_as_the_signal() -> None:
    db = connect()
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    caught: BaseException | None = None
    with signals_as_exceptions():
        timer.start()
        try:
            db.execute("SELECT count(*) FROM range(1000000000000) a WHERE a.range % 7 = 3")
        except BaseException as exc:  # what DuckDB raises instead of ours
            caught = exc
        finally:
            timer.cancel()
        signalled = received()
    assert caught is not None and not isinstance(caught, Interrupted), caught
    assert isinstance(signalled, Interrupted) and signalled.exit_code == ExitCode.INTERRUPTED


def test_a_new_command_starts_with_no_signal_received() -> None:
    with signals_as_exceptions():
        assert received() is None
        with pytest.raises(Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before the next line
        assert received() is not None
    with signals_as_exceptions():
        assert received() is None
