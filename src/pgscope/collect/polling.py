"""Collectors that work from a thread of their own: the thread's life cycle and its failure
(`ThreadCollector`), and for the SQL-based ones a monitoring connection on top
(`PollingCollector`): a statement timeout, and reconnecting after the server restarts,
recording the gap. Subclasses implement `run_loop()`; SQL ones call `reconnect()` when a
query fails for connection reasons.
"""

from __future__ import annotations

import contextlib
import threading
import time
from abc import abstractmethod
from typing import Any

import psycopg

from pgscope.collect.base import Collector, CollectorContext
from pgscope.errors import TargetError
from pgscope.store import RunStore, now_us

STATEMENT_TIMEOUT = "2s"  # a monitoring query that hangs must not hang the collector


class ThreadCollector(Collector):
    def start(self, ctx: CollectorContext) -> None:
        self.ctx = ctx
        self.store: RunStore = ctx.store.writer()
        self.stop_event = threading.Event()
        self.error: str | None = None
        self.prepare(ctx)
        self.opened()
        self.thread = threading.Thread(
            target=self._guarded, name=f"pgscope-{self.name}", daemon=True
        )
        self.thread.start()

    def prepare(self, ctx: CollectorContext) -> None:
        """Create tables and anything else needed before the thread starts."""

    def opened(self) -> None:
        """Open what the thread will use (a connection), after prepare()."""

    def closed(self) -> None:
        """Release it, after the thread ended."""

    @abstractmethod
    def run_loop(self) -> None:
        """Work until `self.stop_event` is set; return early only on failure."""

    def _guarded(self) -> None:
        try:
            self.run_loop()
        except Exception as exc:  # record, never crash the run
            self.error = f"{self.name} failed: {' '.join(str(exc).split())}"

    def failure(self) -> str | None:
        if not self.thread.is_alive() and not self.stop_event.is_set():
            return self.error or f"{self.name} stopped"
        return None

    def stop(self) -> str | None:
        self.stop_event.set()
        self.thread.join(timeout=10)
        if self.thread.is_alive():
            return f"{self.name} did not stop within 10 s"
        self.closed()
        return self.error


class PollingCollector(ThreadCollector):
    application_name: str = "pgscope"
    reconnect_s: float = 30.0  # subclasses set it from their options

    def opened(self) -> None:
        self.session = self.connect()

    def closed(self) -> None:
        with contextlib.suppress(Exception):  # a broken connection may fail to close
            self.session.close()

    def connect(self) -> psycopg.Connection[Any]:
        session = self.ctx.conn.connect(application_name=self.application_name)
        session.execute(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'")
        return session

    def reconnect(self, exc: Exception, done: str) -> bool:
        """After the connection dropped: retry for `reconnect_s`, recording the gap.
        `done` says what was collected so far, for the message if we give up."""
        lost_us = now_us()
        reason = " ".join(str(exc).split()) or type(exc).__name__
        deadline = time.monotonic() + self.reconnect_s
        while not self.stop_event.is_set() and time.monotonic() < deadline:
            self.stop_event.wait(0.2)
            try:
                self.session = self.connect()
            except TargetError:
                continue
            self.store.add_gap(self.name, lost_us, now_us(), f"connection lost: {reason}")
            return True
        self.store.add_gap(self.name, lost_us, now_us(), f"connection lost: {reason}")
        if not self.stop_event.is_set():
            self.error = f"lost the connection to the server after {done}: {reason}"
        return False
