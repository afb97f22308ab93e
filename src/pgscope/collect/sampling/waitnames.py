"""What each wait number read from shared memory is called (the shared-memory sampler's names).

A process's wait_event_info is a number: its class in the top byte and, below, for most classes
its event's position in the class's enum; for LWLocks a tranche id, for heavyweight locks the
lock tag, for extensions an id given out at run time. Three sources name it, best first:

- heavyweight locks' tags (pg_locks' locktype), the same on every version;
- the server's list of its events in number order: PostgreSQL 17 and later give it for the
  enum classes (pg_get_wait_events() reads an array generated with the enums from one sorted
  list); wait_numbers.toml has the rest, taken from each version's headers and binary
  (scripts/wait-numbers.py): 15's and 16's enum classes, and every version's LWLocks by
  tranche id. shmem.calibrate checks it on ClientRead and PgSleep;
- what the server reported for a process read in the same wait just before and just after
  (votes), for the waits the lists leave out (extensions' LWLock tranches and events);
- the class and number (`LWLock:#72`), renamed at the end if a vote came later.

Without the list, a short wait such as IO:WALSync was rarely caught by a vote and the samples
said `IO:#70` where pg_wait_sampling said WALSync.
"""

from __future__ import annotations

import tomllib
from collections import Counter
from collections.abc import Callable
from importlib import resources
from typing import Any

import psycopg

from pgscope.collect.tracing.bpf import LOCK_TYPES

# The wait class is the top byte of wait_event_info (utils/wait_event.h), unchanged since 9.6.
WAIT_CLASSES = {
    0x01: "LWLock",
    0x03: "Lock",
    0x04: "BufferPin",
    0x05: "Activity",
    0x06: "Client",
    0x07: "Extension",
    0x08: "IPC",
    0x09: "Timeout",
    0x0A: "IO",
    0x0B: "InjectionPoint",
}
# The classes whose events are numbered by their place in an enum.
LISTED_CLASSES = {"BufferPin", "Activity", "Client", "IPC", "Timeout", "IO"}
CLASS_BYTES = {kind: byte for byte, kind in WAIT_CLASSES.items() if kind in LISTED_CLASSES}
LWLOCK, LOCK = 0x01, 0x03
# A Lock wait's low byte is its lock tag type (storage/lock.h, LockTagType): pg_locks' names,
# and PostgreSQL 16's apply-transaction lock after them.
LOCK_TAGS = (*LOCK_TYPES, "applytransaction")
LIST_SQL = "SELECT type, name FROM pg_get_wait_events() WITH ORDINALITY ORDER BY ordinality"
# Reads of a process in a listed wait that all called it something else before the list is
# doubted: one read can vote for a neighbouring wait of the same class.
VOTES_AGAINST_LIST = 3


def number_name(raw: int) -> tuple[str | None, str | None]:
    """What a wait_event_info says by itself: its class, and for heavyweight locks the lock
    tag; other events by number."""
    if raw == 0:
        return None, None
    kind = WAIT_CLASSES.get(raw >> 24, f"class {raw >> 24}")
    low = raw & 0xFFFF
    if raw >> 24 == LOCK and low < len(LOCK_TAGS):
        return kind, LOCK_TAGS[low]
    return kind, f"#{low}"


def _stored(major: int) -> dict[str, list[str]]:
    """wait_numbers.toml's lists for `major`: {class: names in number order}."""
    text = resources.files("pgscope.collect.sampling").joinpath("wait_numbers.toml").read_text()
    classes = tomllib.loads(text).get(str(major), {})
    return {kind: list(table["names"]) for kind, table in classes.items()}


def listed(session: psycopg.Connection[Any]) -> tuple[dict[int, tuple[str, str]], str]:
    """{wait_event_info: (type, event)} from the lists for the server behind `session`, and
    where they came from; empty for a version with none."""
    major = session.info.server_version // 10000
    stored = _stored(major)
    lwlocks = stored.pop("LWLock", [])
    if major >= 17:
        try:
            rows = [(str(k), str(n)) for k, n in session.execute(LIST_SQL).fetchall()]
        except psycopg.Error as exc:  # the session is autocommit: nothing to roll back
            return {}, f"no list: pg_get_wait_events() failed: {str(exc).strip()}"
        source = "the server's pg_get_wait_events()"
        # The LWLock ids of 17 come from 18's headers, and a minor release may add a lock
        # (17 and 18 did: SerialControl), which moves every tranche after it: the list is
        # used only when its names are exactly the server's.
        if lwlocks and set(lwlocks) - {""} == {n for k, n in rows if k == "LWLock"}:
            source += f", LWLocks by PostgreSQL {major}'s ids"
        else:
            lwlocks, source = [], f"{source}, LWLocks as the server reports them"
    else:
        # One BufferPin event, number 0, on every version (17's list carries it).
        rows = [("BufferPin", "BufferPin")] if stored else []
        rows += [(kind, name) for kind, names in stored.items() for name in names]
        source = f"PostgreSQL {major}'s headers"
    position: Counter[str] = Counter()
    found = {}
    for kind, name in rows:
        if kind in CLASS_BYTES:
            found[CLASS_BYTES[kind] << 24 | position[kind]] = (kind, name)
            position[kind] += 1
    found.update({LWLOCK << 24 | i: ("LWLock", name) for i, name in enumerate(lwlocks) if name})
    if not found:
        source = f"no list for PostgreSQL {major}"
    # A heavyweight lock's number is its tag on every version: never left to the votes, which
    # a wait always followed by another of its class misleads (a tuple lock, then the
    # transaction holding the row: the reads around Lock:tuple vote Lock:transactionid).
    found.update({LOCK << 24 | i: ("Lock", tag) for i, tag in enumerate(LOCK_TAGS)})
    return found, source


class WaitNames:
    """The names of one server's wait numbers, from its list and the votes; `report(kind,
    detail)` records an event when the votes overrule the list."""

    def __init__(
        self, listed: dict[int, tuple[str, str]], source: str, report: Callable[[str, str], None]
    ) -> None:
        self.listed = listed
        self.source = source
        self.report = report
        self.votes: dict[int, Counter[tuple[str, str]]] = {}
        self.numbered: set[int] = set()  # written under their number, not their name
        self.overruled: set[int] = set()

    def vote(self, raw: int, kind: str, event: str) -> None:
        self.votes.setdefault(raw, Counter())[(kind, event)] += 1

    def known(self) -> set[int]:
        return self.votes.keys() | self.listed.keys()

    def name(self, raw: int) -> tuple[str | None, str | None]:
        """The list's name; the votes' where several reads called it otherwise and none as
        the list does (a list out of step with the numbers would misname its whole class);
        else the number."""
        if raw == 0:
            return None, None
        votes = self.votes.get(raw)
        listed = self.listed.get(raw)
        if listed is not None:
            if not votes or listed in votes:
                return listed
            ((voted, count),) = votes.most_common(1)
            if count < VOTES_AGAINST_LIST:
                return listed
            if raw not in self.overruled:
                self.overruled.add(raw)
                self.report(
                    "activity-names",
                    f"wait {raw:#010x}: {self.source} says {':'.join(listed)}, the server "
                    f"reported {':'.join(voted)} {count} times; written as the server reported",
                )
            return voted
        if votes:
            return votes.most_common(1)[0][0]
        self.numbered.add(raw)
        return number_name(raw)

    def learnt(self) -> list[tuple[str, str, str]]:
        """Waits written under their number and voted a name since: (type, `#n`, event)."""
        found = []
        for raw in sorted(self.numbered & self.votes.keys()):
            kind, number = number_name(raw)
            assert kind is not None and number is not None
            found.append((kind, number, self.votes[raw].most_common(1)[0][0][1]))
        return found
