"""How the shared-memory sampler names wait numbers (collect/waitnames.py): the stored lists of
15 and 16 against their binaries, and the list, the votes and the numbers in their order."""

from __future__ import annotations

import contextlib
import tomllib
from importlib import resources

import pytest

from pgscope.collect.waitnames import (
    CLASS_BYTES,
    VOTES_AGAINST_LIST,
    WaitNames,
    _stored,
    number_name,
)
from tests.servers import pg_of_major

CLIENT_READ = 0x06000000
WAL_SYNC = 0x0A000000 | 70  # 15's number for IO:WALSync (pg_wait_sampling calls it so)
LWLOCK_72 = 0x01000000 | 72


def stored_numbers(major: int) -> dict[int, tuple[str, str]]:
    """What the stored lists say, numbered as waitnames.listed numbers them on 15 and 16."""
    numbers = {0x04000000: ("BufferPin", "BufferPin")}
    for kind, names in _stored(major).items():
        byte = 0x01 if kind == "LWLock" else CLASS_BYTES[kind]
        numbers.update({byte << 24 | i: (kind, name) for i, name in enumerate(names) if name})
    return numbers


def test_the_stored_lists_number_the_waits_calibration_checks() -> None:
    for major in (15, 16):
        numbers = stored_numbers(major)
        assert numbers[CLIENT_READ] == ("Client", "ClientRead")
        assert ("Timeout", "PgSleep") in numbers.values()
        assert ("IO", "WALSync") in numbers.values()
    # The numbers the shared-memory sampler wrote on 15 before it had the lists, where
    # pg_wait_sampling, beside it, said WALSync and LockManager (docs/benchmarks.md).
    assert stored_numbers(15)[WAL_SYNC] == ("IO", "WALSync")
    assert stored_numbers(15)[0x01000000 | 61] == ("LWLock", "LockManager")
    # Individual LWLocks keep their ids on every version; 17 and 18 list only LWLocks.
    for major in (15, 16, 17, 18):
        lwlocks = _stored(major)["LWLock"]
        assert lwlocks[8] == "WALWrite" and lwlocks[4] == "ProcArray" and lwlocks[0] == ""
    assert set(_stored(18)) == {"LWLock"} and _stored(14) == {}
    # 18's LWLock names are checked against the server's own (test_activity_memory.py); a
    # name of 15 or 16 that 18 lacks is one 17 removed, not a misread string.
    newest = set(_stored(18)["LWLock"])
    for major in (15, 16):
        assert set(_stored(major)["LWLock"]) - newest == {"OldSnapshotTimeMap"}


def test_every_stored_name_is_in_its_servers_binary() -> None:
    """The names are the strings the server reports (a wrong split of a merged string, or a
    GUC's spelling, would not be a whole NUL-terminated string of the binary)."""
    text = resources.files("pgscope.collect").joinpath("wait_numbers.toml").read_text()
    checked = []
    for major, classes in tomllib.loads(text).items():
        with contextlib.suppress(pytest.skip.Exception):
            binary = pg_of_major(int(major)).path("postgres").read_bytes()
            # A minor release may append an event to a class (15.20's IPC:
            # WalReceiverUpstreamCatchup), which an older binary of the major lacks.
            names = [name for table in classes.values() for name in table["names"][:-1]]
            missing = [n for n in names if n and f"{n}\0".encode() not in binary]
            assert not missing, f"PostgreSQL {major}'s binary lacks {missing}"
            checked.append(major)
    if not checked:
        pytest.skip("no PostgreSQL 15-18 is installed (make setup installs them)")


def test_the_list_names_a_wait_until_reads_overrule_it() -> None:
    events: list[tuple[str, str]] = []
    names = WaitNames(
        {WAL_SYNC: ("IO", "WALSync")}, "a list", lambda kind, d: events.append((kind, d))
    )
    assert names.name(0) == (None, None)
    assert names.name(WAL_SYNC) == ("IO", "WALSync")
    # Reads that vote for a neighbour are outnumbered or too few to overrule the list.
    for _ in range(VOTES_AGAINST_LIST - 1):
        names.vote(WAL_SYNC, "IO", "WALWrite")
    assert names.name(WAL_SYNC) == ("IO", "WALSync") and not events
    names.vote(WAL_SYNC, "IO", "WALSync")
    for _ in range(5):
        names.vote(WAL_SYNC, "IO", "WALWrite")
    assert names.name(WAL_SYNC) == ("IO", "WALSync") and not events
    # Several reads, none agreeing with the list: the server's word, said once.
    other = WaitNames({WAL_SYNC: ("IO", "WALSync")}, "a list", lambda k, d: events.append((k, d)))
    for _ in range(VOTES_AGAINST_LIST):
        other.vote(WAL_SYNC, "IO", "DataFileRead")
    assert other.name(WAL_SYNC) == ("IO", "DataFileRead")
    assert other.name(WAL_SYNC) == ("IO", "DataFileRead")
    assert len(events) == 1 and events[0][0] == "activity-names", events
    assert "a list says IO:WALSync" in events[0][1] and "DataFileRead 3 times" in events[0][1]


def test_an_unlisted_wait_is_numbered_then_renamed_once_voted() -> None:
    names = WaitNames({}, "none", lambda kind, detail: None)
    assert names.name(LWLOCK_72) == ("LWLock", "#72")
    assert names.name(0x0300000A) == ("Lock", "advisory")
    assert names.learnt() == []
    names.vote(LWLOCK_72, "LWLock", "WALWrite")
    assert names.known() == {LWLOCK_72}
    assert names.learnt() == [("LWLock", "#72", "WALWrite")]
    assert names.name(LWLOCK_72) == ("LWLock", "WALWrite")
    assert number_name(0x0B000001) == ("InjectionPoint", "#1")
