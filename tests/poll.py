"""Waiting in tests for a condition, never for a fixed time: a loaded host (the suite runs
beside load, and `make test-fast` beside a `pgscope run`) makes any fixed wait too short.
`tests/test_code_quality.py` keeps `time.sleep` out of every other test module: a test that
needs time to pass (a load observed for a few seconds) says so with `elapse`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
POLL_S = 0.01


def wait_until(
    condition: Callable[[], T], what: str, timeout: float = 60.0, every: float = POLL_S
) -> T:
    """`condition()`'s first truthy value; AssertionError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(every)


def elapse(seconds: float, why: str) -> None:
    """Let `seconds` pass because the scenario is made of that time (a load observed for a few
    windows), never to wait for something to happen: that is `wait_until`'s."""
    assert why, "say what the time is for"
    time.sleep(seconds)
