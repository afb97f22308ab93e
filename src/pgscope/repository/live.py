"""An observation pushed as it runs (`observe --push`): each window, once closed, reaches the
repository, so a long observation is seen centrally while it goes on.

A thread of its own pushes an instalment (push.py, final=False) whenever windows close: the
store as it is, from where the repository's last instalment stopped. While the repository
cannot be reached, nothing is lost and nothing waits: the windows are in the store already,
and the next instalment that goes through takes all of them, in one transaction, in order
(the repository's watermarks say where the last one stopped). The thread retries on its own,
at growing intervals, between windows too. The observing never waits for it.

The last instalment, with the analysis, is made once the observation is over and its store
closed (`finish`): the run folder is pushed as `pgscope push` pushes one, retrying for a
while; if the repository is still away, the folder keeps everything and `pgscope push`
sends the rest later.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from pgscope.errors import InputFileError, PgscopeError, RefusedError, TargetError
from pgscope.repository import connection
from pgscope.repository.push import Pushed, push, scratch
from pgscope.store import RunStore
from pgscope.target.conn import ConnParams

RETRY_FIRST_S = 1.0
RETRY_MAX_S = 10.0


class LivePusher:
    def __init__(self, params: ConnParams, say: Callable[[str], None]) -> None:
        self.params = params
        self.say = say
        self.session: psycopg.Connection[Any] | None = None
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.store: RunStore | None = None
        self.failing: str | None = None  # why the last attempt failed
        self.pushed_through: int | None = None  # the last window the repository has
        self.instalments = 0

    def check(self) -> None:
        """Before observing: a repository that answers must be one this pgscope can push to
        (RefusedError, one line, else); one that does not answer is said, and pushed to once
        it does."""
        try:
            self._connect()
        except RefusedError:
            raise
        except PgscopeError as exc:
            self._failed(exc)

    def start(self, store: RunStore) -> None:
        """Push the observation's store (from a cursor of this thread's own) as it fills."""
        self.store = store.writer()
        self.thread = threading.Thread(target=self._run, name="pgscope-push", daemon=True)
        self.thread.start()

    def windows_closed(self, step_ids: list[int]) -> None:
        self.wake.set()

    def stop(self) -> None:
        """Before the store closes: the instalment in flight finished (or failed), the thread
        ended, its cursor closed."""
        self.stopping.set()
        self.wake.set()
        if self.thread is not None:
            self.thread.join()
        if self.store is not None:
            self.store.close()
            self.store = None

    def _run(self) -> None:
        retry = RETRY_FIRST_S
        while not self.stopping.is_set():
            self.wake.wait(timeout=retry if self.failing else None)
            self.wake.clear()
            if self.stopping.is_set():
                break
            retry = RETRY_FIRST_S if self._instalment() else min(retry * 2, RETRY_MAX_S)

    def _instalment(self) -> bool:
        assert self.store is not None
        try:
            session = self._connect()
            with scratch() as fifos:
                pushed = push(session, self.store, scratch=fifos, document=None, final=False)
        except (PgscopeError, psycopg.Error, OSError) as exc:
            self._failed(exc)
            return False
        self._arrived(pushed)
        return True

    def _connect(self) -> psycopg.Connection[Any]:
        if self.session is None or self.session.closed or self.session.broken:
            self.session, _ = connection.connect(
                self.params, writing=True, application_name="pgscope push"
            )
        return self.session

    def _failed(self, exc: BaseException) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
        reason = " ".join(str(exc).split()) or type(exc).__name__
        if self.failing is None:
            self.say(
                f"the repository is out of reach ({reason}): the windows wait in the store "
                f"and go when it is back"
            )
        self.failing = reason

    def _arrived(self, pushed: Pushed) -> None:
        self.instalments += 1
        if self.failing is not None:
            since = 1 if self.pushed_through is None else self.pushed_through + 1
            upto = pushed.through_step
            what = f"windows {since}-{upto}" if upto is not None and upto > since else "its windows"
            self.say(f"the repository is back: {what} pushed")
            self.failing = None
        self.pushed_through = pushed.through_step

    def finish(self, run_dir: Path, document: dict[str, Any], wait_s: float) -> Pushed:
        """The last instalment, with the analysis: the run folder (its store closed) pushed
        whole from where the repository stopped; tried again for up to `wait_s` while the
        repository is out of reach. TargetError, one line, after that."""
        deadline = time.monotonic() + wait_s
        retry = RETRY_FIRST_S
        while True:
            try:
                session = self._connect()
                with scratch() as fifos:
                    store = RunStore.open(run_dir, writable=fifos)
                    try:
                        pushed = push(session, store, scratch=fifos, document=document, final=True)
                    finally:
                        store.close()
                self._arrived(pushed)
                return pushed
            except (RefusedError, InputFileError):
                raise
            except (PgscopeError, psycopg.Error, OSError) as exc:
                self._failed(exc)
                if time.monotonic() + retry > deadline:
                    raise TargetError(
                        f"the repository was out of reach for the observation's end "
                        f"({self.failing}): its last windows and analysis are only in "
                        f"{run_dir}; `pgscope push {run_dir} --to ...` sends them"
                    ) from None
                time.sleep(retry)  # the observation is over: nothing else to do meanwhile
                retry = min(retry * 2, RETRY_MAX_S)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
