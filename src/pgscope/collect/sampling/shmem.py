"""Every process's wait event and state read straight from a local server's shared memory.

Why: an SQL sampler wakes a backend for every sample, and that wake-up alone costs the server
more than pg_wait_sampling's whole collector (docs/benchmarks.md, "Where a sample's server CPU
goes"). Reading the two arrays `pg_stat_get_activity` itself reads, the PGPROC array (each
process's `wait_event_info`) and the backend status array (its state and query_id), costs the
server nothing: the main segment, mapped read-only into this process, is read in place (it is
mapped at the same address in every server process; calibration reads the postmaster's copy
with process_vm_readv).

How the layout is found, without debug symbols, on any version: `pg_shmem_allocations` gives
where the "Proc Header" (whose first field points at the PGPROC array, and whose fifth is its
length) and the "Backend Status Array" live in the main segment, which starts with
PostgreSQL's shared-memory magic number. Within them, the stride and the pid field come from
where the pids `pg_stat_activity` lists sit (each array holds one slot per process); the wait
field from our own session, idle (Client:ClientRead, 0x06000000) then in pg_sleep (class
Timeout, 0x09); the state field and its values from the same two moments; the query_id field
from the id our own statement reports. Anything that does not come out unique fails the
calibration, and the caller falls back to SQL.

A parallel worker is a background worker to the status array (st_backendType B_BG_WORKER, as
the logical replication launcher is: pg_stat_activity names either by its registration), and
its statement is its leader's. What ties it to its leader is PGPROC.lockGroupLeader, a pointer
to the leader's slot (a leader's points at itself): the field just before lockGroupMembers,
the last list head of PGPROC (15 to 18, as since lock groups came in 9.6), which points at
itself in every slot whose process leads no workers (`_leader_offset`). Not found: workers
are named only as the server names them when asked (once a second), and their leader is
known only from that.

Needs root (or CAP_SYS_PTRACE) and the server on this host; `pg_monitor` for the SQL side.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from pgscope.collect.sampling import waitnames

SHMEM_MAGIC = 679834894  # PGShmemMagic, at the start of the main segment
CLIENT_READ = 0x06000000  # PG_WAIT_CLIENT | WAIT_EVENT_CLIENT_READ, every version
TIMEOUT_CLASS = waitnames.CLASS_BYTES["Timeout"]
MAX_STRIDE = 4096  # above any PGPROC or PgBackendStatus (~0.9 kB and ~0.4 kB)

# pg_stat_activity's states, in BackendState's order after the first one found (PG 18 puts
# "starting" before "idle"; calibration finds where "idle" is).
STATES_FROM_IDLE = (
    "idle",
    "active",
    "idle in transaction",
    "fastpath function call",
    "idle in transaction (aborted)",
    "disabled",
)

ALLOCATIONS_SQL = (
    "SELECT name, off, size FROM pg_shmem_allocations "
    "WHERE name IN ('Proc Header', 'Backend Status Array')"
)
PIDS_SQL = "SELECT pid, backend_type FROM pg_stat_activity"
# Our own statement in a known wait and state, reporting its own query_id.
PROBE_S = 0.5
PROBE_ATTEMPTS = 3
IDLE_WAIT_S = 2.0  # for an idle session to be back in its ClientRead wait
PROBE_SQL = "SELECT query_id, pg_sleep(%s) FROM pg_stat_activity WHERE pid = pg_backend_pid()"


class ShmemError(Exception):
    """The server's shared memory cannot be read or understood here; sample through SQL."""


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_readv = _libc.process_vm_readv
_readv.argtypes = [
    ctypes.c_int,
    ctypes.POINTER(_Iovec),
    ctypes.c_ulong,
    ctypes.POINTER(_Iovec),
    ctypes.c_ulong,
    ctypes.c_ulong,
]
_readv.restype = ctypes.c_ssize_t


def read_memory(pid: int, address: int, size: int) -> bytes:
    buffer = ctypes.create_string_buffer(size)
    local = _Iovec(ctypes.cast(buffer, ctypes.c_void_p), size)
    remote = _Iovec(address, size)
    got = _readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if got != size:
        error = ctypes.get_errno()
        raise ShmemError(
            f"cannot read {size} bytes of process {pid}'s memory: {os.strerror(error)}"
            + (" (needs root)" if error == 1 else "")
        )
    return buffer.raw


@dataclass(frozen=True)
class Array:
    """One array of per-process slots in shared memory."""

    address: int
    count: int
    stride: int
    pid_offset: int

    @property
    def size(self) -> int:
        return self.count * self.stride


@dataclass(frozen=True)
class Layout:
    postmaster: int
    segment: int  # where the main segment starts
    procs: Array
    wait_offset: int  # PGPROC.wait_event_info
    statuses: Array
    state_offset: int  # PgBackendStatus.st_state
    state_names: dict[int, str]
    type_offset: int  # PgBackendStatus.st_backendType
    client_type: int  # its value for a client backend
    query_id_offset: int | None  # PgBackendStatus.st_query_id (None: query ids are off)
    leader_offset: int | None = None  # PGPROC.lockGroupLeader (None: not found)
    # The server's names of the numbered wait classes (waitnames.listed), checked on ClientRead
    # and PgSleep; empty when there is no list or it failed the check.
    wait_names: dict[int, tuple[str, str]] = field(default_factory=dict)
    wait_names_source: str = "none"


def _segment(postmaster: int) -> int:
    """Where the main shared-memory segment starts in the postmaster: the shared mapping that
    begins with the magic number."""
    try:
        lines = Path(f"/proc/{postmaster}/maps").read_text().splitlines()
    except OSError as exc:
        raise ShmemError(f"cannot read /proc/{postmaster}/maps: {exc.strerror}") from None
    for line in lines:
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if "s" not in fields[1] or end - start < 1 << 20:
            continue
        with_magic = read_memory(postmaster, start, 4)
        if struct.unpack("i", with_magic)[0] == SHMEM_MAGIC:
            return start
    raise ShmemError(f"no PostgreSQL shared-memory segment in process {postmaster}")


def _slots(region: bytes, pids: list[int], own: int, fits: Any) -> tuple[int, int]:
    """(stride, pid offset) of an array of per-process slots: every pid must sit a whole
    number of strides from our own, at one of the places its value is found (a pid's value
    can also turn up elsewhere: taking only the first place failed about one calibration in
    ten). Of the strides that fit, `fits(stride)` (the array's known size) and the largest
    is taken: every divisor of the true stride fits too."""
    words = memoryview(region).cast("i")
    wanted = set(pids)
    places: dict[int, list[int]] = {}
    for index, value in enumerate(words):
        if value in wanted:
            places.setdefault(value, []).append(index * 4)
    if own not in places or len(places) < 3:
        raise ShmemError("the server's processes were not found in its shared memory")
    others = [found for pid, found in places.items() if pid != own]
    best: tuple[int, int] | None = None
    for stride in range(MAX_STRIDE, 63, -8):
        if not fits(stride):
            continue
        for mine in places[own]:
            if all(any((p - mine) % stride == 0 for p in found) for found in others):
                best = (stride, mine % stride)
                break
        if best:
            return best
    raise ShmemError("no consistent slot size in shared memory")


def _field(slot_a: bytes, slot_b: bytes, fits: Any, width: int = 4) -> list[int]:
    """Offsets in a slot whose value in two readings satisfies `fits(a, b)`."""
    a = memoryview(slot_a).cast("I" if width == 4 else "Q")
    b = memoryview(slot_b).cast("I" if width == 4 else "Q")
    return [i * width for i in range(len(a)) if fits(a[i], b[i])]


def calibrate(session: psycopg.Connection[Any], postmaster: int) -> Layout:
    """The layout of `postmaster`'s arrays, learnt with `session` (idle, autocommit, ours:
    it is put through a pg_sleep of PROBE_S)."""
    start = _segment(postmaster)
    where = {name: (int(off), int(size)) for name, off, size in session.execute(ALLOCATIONS_SQL)}
    if len(where) != 2:
        raise ShmemError("pg_shmem_allocations does not list the proc and status arrays")
    header = read_memory(postmaster, start + where["Proc Header"][0], 40)
    procs_address = struct.unpack_from("Q", header)[0]
    proc_count = struct.unpack_from("I", header, 32)[0]
    if not 1 <= proc_count <= 1 << 18:
        raise ShmemError(f"the proc header gives {proc_count} processes")
    status_address = start + where["Backend Status Array"][0]
    status_size = where["Backend Status Array"][1]
    own = session.info.backend_pid
    listed = session.execute(PIDS_SQL).fetchall()
    pids = [int(pid) for pid, _ in listed if pid]

    procs_region = read_memory(postmaster, procs_address, proc_count * MAX_STRIDE)
    # The arrays allocated after the PGPROC array (xids, the header's second field) bound
    # its stride, where they follow it.
    span = struct.unpack_from("Q", header, 8)[0] - procs_address
    bounded = proc_count * 64 <= span <= proc_count * MAX_STRIDE + 4096
    proc_stride, proc_pid = _slots(
        procs_region, pids, own, lambda s: not bounded or s * proc_count <= span
    )
    procs = Array(procs_address, proc_count, proc_stride, proc_pid)
    status_region = read_memory(postmaster, status_address, status_size)
    # One status slot per backend and auxiliary process: about as many as PGPROCs, less
    # those of prepared transactions.
    row = session.execute("SHOW max_prepared_transactions").fetchone()
    prepared = int(row[0]) if row else 0
    status_stride, status_pid = _slots(
        status_region,
        pids,
        own,
        lambda s: (
            status_size % s == 0
            and proc_count - prepared - 16 <= status_size // s <= proc_count + 16
        ),
    )
    statuses = Array(status_address, status_size // status_stride, status_stride, status_pid)

    # A field can change by chance between the two readings: the probe is tried again before
    # giving up. Each reading waits for the state it needs rather than for a time: a loaded host
    # (the suite's first pass on 2 busy CPUs) can reply before the backend is back in its
    # ClientRead wait, and start the probe's pg_sleep late.
    for _attempt in range(PROBE_ATTEMPTS):
        idle_proc, idle_status = _idle_slots(postmaster, procs, statuses, own)
        probe = _Probe(session)
        waits: list[int] = []
        states: list[int] = []
        try:
            deadline = time.monotonic() + PROBE_S + IDLE_WAIT_S
            while (
                probe.thread.is_alive()
                and time.monotonic() < deadline
                and (len(waits) != 1 or len(states) != 1)
            ):
                time.sleep(0.02)  # until our session is seen in its pg_sleep
                busy_proc, busy_status = _own_slots(postmaster, procs, statuses, own)
                waits = _field(
                    idle_proc,
                    busy_proc,
                    lambda a, b: a == CLIENT_READ and b >> 24 == TIMEOUT_CLASS,
                )
                states = _field(idle_status, busy_status, lambda a, b: 1 <= a <= 3 and b == a + 1)
        finally:
            query_id = probe.result()
        if len(waits) == 1 and len(states) == 1:
            break
    else:
        raise ShmemError(
            f"could not tell the wait and state fields apart ({len(waits)} and {len(states)} "
            f"candidates, {PROBE_ATTEMPTS} probes)"
        )
    idle = struct.unpack_from("i", idle_status, states[0])[0]
    type_offset = status_pid + 4  # st_backendType follows st_procpid in every version
    client_type = struct.unpack_from("i", idle_status, type_offset)[0]
    names, source = waitnames.listed(session)
    sleeping = struct.unpack_from("I", busy_proc, waits[0])[0]
    if names and (
        names.get(CLIENT_READ) != ("Client", "ClientRead")
        or names.get(sleeping) != ("Timeout", "PgSleep")
    ):
        # A list in another order than the numbers: unused, not trusted for the rest.
        names, source = {}, f"{source} (not used: it does not number ClientRead and PgSleep)"
    query_ids = (
        _field(busy_status, busy_status, lambda a, _b: a == query_id % (1 << 64), width=8)
        if query_id
        else []
    )
    own_slot = _own_index(procs_region, procs, own)
    return Layout(
        postmaster=postmaster,
        segment=start,
        procs=procs,
        wait_offset=waits[0],
        statuses=statuses,
        state_offset=states[0],
        state_names={idle + i: name for i, name in enumerate(STATES_FROM_IDLE)},
        type_offset=type_offset,
        client_type=client_type,
        query_id_offset=query_ids[0] if len(query_ids) == 1 else None,
        leader_offset=_leader_offset(procs_region, procs, own_slot),
        wait_names=names,
        wait_names_source=source,
    )


def _own_index(region: bytes, procs: Array, own: int) -> int:
    pids = memoryview(region).cast("i")[procs.pid_offset // 4 : procs.size // 4 : procs.stride // 4]
    return list(pids).index(own)


def _leader_offset(region: bytes, procs: Array, own_slot: int) -> int | None:
    """Where PGPROC.lockGroupLeader is, from `region` (the proc array as read at calibration),
    or None: the 8 bytes before the last 16 that point at themselves (an empty list head) in our
    own slot and in every slot no process holds, provided that in every slot in use they hold
    nothing or the start of a slot (a leader's, or its own once it has led workers)."""
    stride, count = procs.stride, procs.count
    if stride % 8:
        return None  # a slot of pointers is a whole number of them
    words = memoryview(region).cast("Q")
    pids = memoryview(region).cast("i")[procs.pid_offset // 4 : procs.size // 4 : stride // 4]
    free = [i for i, pid in enumerate(pids) if pid == 0]
    empty_heads = [
        offset
        for offset in range(8, stride - 15, 8)
        if all(
            words[(i * stride + offset) // 8]
            == words[(i * stride + offset) // 8 + 1]
            == procs.address + i * stride + offset
            for i in [own_slot, *free]
        )
    ]
    if not empty_heads:
        return None
    leader = empty_heads[-1] - 8
    starts = {procs.address + i * stride for i in range(count)} | {0}
    in_use = [i for i, pid in enumerate(pids) if pid != 0]
    if all(words[(i * stride + leader) // 8] in starts for i in in_use):
        return leader
    return None


def _own_slots(postmaster: int, procs: Array, statuses: Array, own: int) -> tuple[bytes, bytes]:
    """Our session's PGPROC and status slot, as they are now."""
    found = []
    for array in (procs, statuses):
        region = read_memory(postmaster, array.address, array.size)
        words = memoryview(region).cast("i")[array.pid_offset // 4 :: array.stride // 4]
        index = list(words).index(own) if own in words else -1
        if index < 0:
            raise ShmemError("our own session is missing from the server's shared memory")
        found.append(region[index * array.stride : (index + 1) * array.stride])
    return found[0], found[1]


def _idle_slots(postmaster: int, procs: Array, statuses: Array, own: int) -> tuple[bytes, bytes]:
    """Our idle session's slots once its PGPROC shows the ClientRead wait somewhere, or as they
    are after IDLE_WAIT_S: the server answers before it waits on the socket again."""
    deadline = time.monotonic() + IDLE_WAIT_S
    while True:
        proc, status = _own_slots(postmaster, procs, statuses, own)
        if _field(proc, proc, lambda a, _b: a == CLIENT_READ) or time.monotonic() > deadline:
            return proc, status
        time.sleep(0.01)


class _Probe:
    """Our session in pg_sleep for PROBE_S, in another thread, reporting its query_id."""

    def __init__(self, session: psycopg.Connection[Any]) -> None:
        self.row: tuple[Any, ...] | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(session,), daemon=True)
        self.thread.start()

    def _run(self, session: psycopg.Connection[Any]) -> None:
        try:
            self.row = session.execute(PROBE_SQL, (PROBE_S,)).fetchone()
        except BaseException as exc:  # reported by result()
            self.error = exc

    def result(self) -> int | None:
        self.thread.join(timeout=5)
        if self.error is not None:
            raise ShmemError(f"calibration query failed: {self.error}")
        return int(self.row[0]) if self.row and self.row[0] is not None else None


def open_segment(layout: Layout) -> tuple[int, int, int]:
    """A read-only descriptor of the server's main segment (through /proc/PID/map_files,
    root only), and where the segment starts and ends in the server: the caller closes it."""
    start, end = _mapping(layout.postmaster, layout.segment)
    try:
        fd = os.open(f"/proc/{layout.postmaster}/map_files/{start:x}-{end:x}", os.O_RDONLY)
    except OSError as exc:
        raise ShmemError(f"cannot map the server's shared memory: {exc.strerror}") from None
    return fd, start, end


class Reader:
    """The server's main segment mapped read-only into this process, for reads now and then
    (naming what the compiled sampler reads, collect/sampling/activitymem.py): a field of every slot
    is one strided read, no system call and no copy."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        fd, start, end = open_segment(layout)
        try:
            self.mapping = mmap.mmap(fd, end - start, mmap.MAP_SHARED, mmap.PROT_READ)
        except OSError as exc:
            raise ShmemError(f"cannot map the server's shared memory: {exc.strerror}") from None
        finally:
            os.close(fd)
        whole = memoryview(self.mapping)
        self.views: list[dict[str, memoryview]] = []
        for array in (layout.procs, layout.statuses):
            region = whole[array.address - start : array.address - start + array.size]
            self.views.append({code: region.cast(code) for code in ("i", "I")})

    def column(self, which: int, offset: int, code: str = "i") -> list[int]:
        """Field `offset` (4 bytes: "i" signed, "I" unsigned) of every slot of the proc (0)
        or status (1) array, as it is now."""
        array = self.layout.procs if which == 0 else self.layout.statuses
        return self.views[which][code][offset // 4 :: array.stride // 4].tolist()

    def waits(self) -> dict[int, int]:
        """Every PGPROC slot's wait_event_info by its pid, as it is now."""
        layout = self.layout
        pids = self.column(0, layout.procs.pid_offset)
        return dict(zip(pids, self.column(0, layout.wait_offset, "I"), strict=True))

    def close(self) -> None:
        for views in self.views:
            for view in views.values():
                view.release()
        self.views = []
        self.mapping.close()


def _mapping(postmaster: int, start: int) -> tuple[int, int]:
    for line in Path(f"/proc/{postmaster}/maps").read_text().splitlines():
        low, high = (int(x, 16) for x in line.split()[0].split("-"))
        if low == start:
            return low, high
    raise ShmemError(f"the server's shared memory is no longer mapped in process {postmaster}")
