"""The activity sampler's loop when it reads the server's shared memory (collect/sampling/shmem.py)
instead of asking it: same tables, same rows, no work for the server per sample.

Each sample is taken by a small compiled program (collect/sampling/native/shmem_sampler.c,
built when pgscope is installed, run only from the package's folder and checked first:
`helper_binary`):
it wakes on schedule, reads, per process slot in use, its pid, wait_event_info, state,
backend type, query_id and lock group leader from the mapped segment, and writes a second of
samples at a time down a pipe as columns of numbers. After a second that held something new,
or every META_MAX_S (`META_SQL`, one statement), the server names what numbers cannot say:
each process's backend type, database, user and application, and the texts of new query ids;
and, from what each process was waiting on around that statement, votes for the names of
waits the server's list leaves out (waitnames.py). The numbers become rows in DuckDB when
written (every `flush_s`).

Backend types are named as pg_stat_activity names them. A number names a type only for the
server's own kinds of process (CORE_TYPES): every background worker has the same number
(B_BG_WORKER), and pg_stat_activity names each by its registration ('parallel worker',
'logical replication launcher'), so a background worker is named by its pid (the 1-Hz
statement), or NULL as the server leaves one it cannot name. A process whose lock group leader
is another process is a parallel worker, whenever it was sampled (a worker lives for one
statement, often less than a second: the statement may never see it); its samples carry its
leader's query_id where its own is not set yet (a worker reports it once it has started), so
that its time is its leader's statement's (`classify`).

What it costs (docs/benchmarks.md, "A sampler that reads shared memory"): no server CPU per
sample; ~15 us of the helper's per sample (a wake-up and the reads), a second's decoding and
the 1-Hz statement on our side. It needs root and the server on this host. When the server
restarts, the layout is found again (the old segment stays mapped, frozen: it is never read
after its postmaster is gone).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

import numpy as np
import psycopg

from pgscope.collect.sampling import shmem, waitnames
from pgscope.collect.statistics.statements import masked
from pgscope.store import now_us
from pgscope.target import conn

if TYPE_CHECKING:
    import threading

    from pgscope.collect.base import CollectorContext
    from pgscope.store import RunStore


class Host(Protocol):
    """What the loop uses of the activity collector that runs it (collect/sampling/activity.py):
    its session, store, counters and rate rows, which both sources share."""

    ctx: CollectorContext
    store: RunStore
    session: psycopg.Connection[Any]
    stop_event: threading.Event
    error: str | None
    options: Any
    samples: int
    target_hz: float
    known_queries: set[int]
    pending_rate: list[tuple[Any, ...]]
    last_flush: float
    taken_until_us: int
    own_pid: int
    application_name: str
    reconnect_s: float
    sampling_postmaster: int | None
    sampling_again: threading.Event

    def reconnect(self, exc: Exception, done: str) -> bool: ...

    def _record_blockers(self) -> None: ...

    def _flush(self) -> None: ...

    def flush_due(self) -> bool: ...


SOURCE = Path(__file__).parent / "native" / "shmem_sampler.c"
HELPER = "pgscope-shmem-sampler"
# Built from SOURCE when pgscope is installed (scripts/setup.sh, hatch_build.py): it ships
# with the package, and a host without a C compiler samples from memory all the same.
BINARY = Path(__file__).parent / "native" / "bin" / HELPER
MAGIC = 0x53534750
META_MAX_S = 10.0
IDLE_CLASSES = (0x05, 0x07)  # Activity, Extension: a background process's main-loop waits
META_SQL = """
SELECT pid, backend_type, datname, usename, application_name, wait_event_type, wait_event,
       query_id, CASE WHEN query_id <> ALL(%(known)s::bigint[]) THEN query END, leader_pid
FROM pg_stat_activity
"""
# GetBackendTypeDesc's names (PostgreSQL 13-18) but "background worker": the kinds of process
# one number always names. pg_stat_activity names a background worker by its registration
# instead, one name per process, not per number.
CORE_TYPES = frozenset(
    {
        "archiver",
        "autovacuum launcher",
        "autovacuum worker",
        "background writer",
        "checkpointer",
        "client backend",
        "dead-end client backend",
        "io worker",
        "logger",
        "slotsync worker",
        "standalone backend",
        "startup",
        "stats collector",
        "walreceiver",
        "walsender",
        "walsummarizer",
        "walwriter",
    }
)
# The samples taken in, as one registered table of numbers (a row per process kept, per
# sample), named through the lists given: each code is a 1-based position in its list, 0 for
# none (DuckDB reads a list at 0 as NULL). Joining three tables in SQL instead cost twice as
# much CPU per write.
# The columns written, by name: shared memory holds no statement text (`command` NULL).
COLUMNS = (
    "(ts_us, sample_no, pid, backend_type, state, wait_event_type, wait_event, query_id, "
    "datname, usename, application_name)"
)
WRITE_SQL = f"""
INSERT INTO activity_samples {COLUMNS}
SELECT ts_us, sample_no, pid,
       CASE WHEN leader <> 0 THEN 'parallel worker' ELSE coalesce($m_type[m], $bt_name[bt]) END,
       $st_name[st], $w_type[w], $w_event[w], nullif(query_id, 0), $m_db[m], $m_user[m],
       $m_app[m]
FROM _mem_rows
"""
# A sample with no process kept: one row of the sampler's own, as the SQL sampler writes.
EMPTY_SQL = f"""
INSERT INTO activity_samples {COLUMNS}
SELECT unnest($ts_us), unnest($sample_no), $own, 'client backend', 'active', NULL, NULL, NULL,
       NULL, NULL, $application
"""
RENAME_SQL = """
UPDATE activity_samples SET wait_event = n.event
FROM (SELECT unnest($kind) AS kind, unnest($number) AS number, unnest($event) AS event) AS n
WHERE wait_event_type = n.kind AND wait_event = n.number
"""


def helper_binary(path: Path = BINARY) -> Path:
    """The compiled sampler, checked to be safe to run (`untrusted`): ShmemError, one line,
    says why not. It is built with the package (scripts/setup.sh; hatch_build.py when a wheel
    is built), never here: a program built on first use and cached in the user's cache folder
    was run as root from wherever that folder said, whoever had put it there."""
    problem = untrusted(path)
    if problem is not None:
        raise shmem.ShmemError(problem)
    return path


def untrusted(path: Path) -> str | None:
    """Why running `path` could run a program someone other than root (or this user) chose,
    or None: it must be a regular file, executable, owned by root or this process's user and
    writable by no one else, in folders (every one above it, as named and as resolved) that
    are owned by root or this user and writable by no one else."""
    euid = os.geteuid()
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return (
            f"the sampler is not built ({path} is missing; scripts/setup.sh, or installing "
            f"pgscope from a wheel, builds it)"
        )
    except OSError as exc:
        return f"cannot check the sampler {path}: {exc.strerror or exc}"
    if not stat.S_ISREG(found.st_mode):
        return f"the sampler {path} is not a regular file (a link, say): not run"
    problem = _foreign(path, found, euid)
    if problem is not None:
        return problem
    if not found.st_mode & stat.S_IXUSR:
        return f"the sampler {path} is not executable"
    absolute = Path(os.path.abspath(path))
    for folder in dict.fromkeys([*absolute.parents, *Path(os.path.realpath(path)).parents]):
        try:
            info = os.stat(folder)
        except OSError as exc:
            return f"cannot check {folder}, above the sampler: {exc.strerror or exc}"
        problem = _foreign(folder, info, euid)
        if problem is not None:
            return f"{problem}, above the sampler: not run"
    return None


def _foreign(path: Path, info: os.stat_result, euid: int) -> str | None:
    """Why someone other than root or `euid` could change `path`, or None."""
    if info.st_uid not in (0, euid):
        return f"{path} belongs to uid {info.st_uid}, not root"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by {'others' if info.st_mode & stat.S_IWOTH else 'its group'}"
    return None


@dataclass
class Batch:
    """One write of the helper: its samples as columns of numbers, a row per process per
    sample (state and backend type -1: it had no status slot; leader 0: none but itself)."""

    cpu_ns: int
    tick_us: np.ndarray
    late_us: np.ndarray
    read_ns: np.ndarray
    tick: np.ndarray
    pid: np.ndarray
    wait: np.ndarray
    state: np.ndarray
    btype: np.ndarray
    query_id: np.ndarray
    leader: np.ndarray


def read_batch(pipe: IO[bytes]) -> Batch | None:
    """The next batch from the helper's output; None at its end."""
    head = pipe.read(24)
    if len(head) < 24:
        return None
    magic, ticks, rows, _ = np.frombuffer(head[:16], dtype=np.uint32).tolist()
    if magic != MAGIC:
        raise shmem.ShmemError("the sampler's output is out of step")
    layout = [("q", ticks), ("i", ticks), ("i", ticks)]
    layout += [("i", rows), ("i", rows), ("I", rows), ("i", rows), ("i", rows), ("q", rows)]
    layout += [("i", rows)]
    size = sum(np.dtype(code).itemsize * n for code, n in layout)
    body = pipe.read(size)
    if len(body) < size:
        return None
    arrays, at = [], 0
    for code, n in layout:
        arrays.append(np.frombuffer(body, dtype=np.dtype(code), count=n, offset=at))
        at += np.dtype(code).itemsize * n
    return Batch(int(np.frombuffer(head[16:], dtype=np.int64)[0]), *arrays)


def _codes(known: list[int], values: np.ndarray) -> np.ndarray:
    """Each value's 1-based position in `known` (sorted), 0 where it is not there."""
    if not known:
        return np.zeros(len(values), dtype=np.int32)
    ordered = np.array(known, dtype=np.int64)
    at = np.minimum(np.searchsorted(ordered, values), len(ordered) - 1)
    return np.where(ordered[at] == values, at + 1, 0).astype(np.int32)


def classify(
    sample_no: np.ndarray,
    pid: np.ndarray,
    btype: np.ndarray,
    query_id: np.ndarray,
    leader: np.ndarray,
    named_leader: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's lock group leader (0: none but itself) and query_id, the rows being processes
    at samples: the leader read from its PGPROC, else the one pg_stat_activity named for its
    pid (`named_leader`, 0 if none), else, for a process not in the status array yet (`btype`
    -1: a worker starting), the one its pid has in other rows. A worker whose own query_id is
    not set (0: it is starting) takes its leader's in the same sample, which a parallel worker
    reports once it runs (ParallelQueryMain): its time is its leader's statement's."""
    named_leader = np.where(named_leader == pid, 0, named_leader)  # a leader (PostgreSQL 13)
    leader = np.where(leader != 0, leader, named_leader).astype(np.int32)
    starting = (leader == 0) & (btype == -1)
    if starting.any() and (leader != 0).any():
        led = leader != 0
        workers, at = np.unique(pid[led][::-1], return_index=True)  # each pid's last leader
        leaders = leader[led][::-1][at]
        index = np.minimum(np.searchsorted(workers, pid[starting]), len(workers) - 1)
        found = workers[index] == pid[starting]
        rows = np.flatnonzero(starting)[found]
        leader[rows] = leaders[index[found]]
    need = np.flatnonzero((leader != 0) & (query_id == 0))
    if len(need):
        key = (sample_no.astype(np.int64) << 23) | pid.astype(np.int64)
        order = np.argsort(key, kind="stable")
        sorted_keys = key[order]
        wanted = (sample_no[need].astype(np.int64) << 23) | leader[need].astype(np.int64)
        index = np.minimum(np.searchsorted(sorted_keys, wanted), len(key) - 1)
        found = sorted_keys[index] == wanted
        query_id = query_id.copy()
        query_id[need[found]] = query_id[order[index[found]]]
    return leader, query_id


class Helper:
    """The compiled sampler running on `layout`'s segment at `hz`, a second per batch."""

    def __init__(self, layout: shmem.Layout, hz: float) -> None:
        binary = helper_binary()  # before the descriptor: a refusal leaks nothing
        fd, start, end = shmem.open_segment(layout)
        procs, statuses = layout.procs, layout.statuses
        argv = [
            str(binary),
            *map(
                str,
                (
                    fd,
                    end - start,
                    max(1, round(hz)),
                    max(1, round(hz)),  # a second per batch
                    procs.address - start,
                    procs.count,
                    procs.stride,
                    procs.pid_offset,
                    layout.wait_offset,
                    statuses.address - start,
                    statuses.count,
                    statuses.stride,
                    statuses.pid_offset,
                    layout.state_offset,
                    layout.type_offset,
                    -1 if layout.query_id_offset is None else layout.query_id_offset,
                    -1 if layout.leader_offset is None else layout.leader_offset,
                    procs.address,
                ),
            ),
        ]
        try:
            self.process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(fd,)
            )
        finally:
            os.close(fd)
        self.cpu_ns = 0

    def batches(self, stopping: Callable[[], bool]) -> Any:
        """Each batch as it comes, until `stopping()` (then what the helper still holds)."""
        assert self.process.stdout is not None
        while True:
            if stopping():
                self.stop()
            batch = read_batch(self.process.stdout)
            if batch is None:
                break
            self.cpu_ns = batch.cpu_ns
            yield batch
        code = self.process.wait(timeout=5)
        error = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
        self.process.stdout.close()
        if self.process.stderr:
            self.process.stderr.close()
        if code not in (0, -signal.SIGTERM):
            raise shmem.ShmemError(f"the sampler failed: {error.strip() or f'exit {code}'}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)


class MemorySampler:
    """Samples `collector`'s server through `layout` until the collector is stopped;
    `calibrate()` finds the layout again after a restart."""

    def __init__(
        self,
        collector: Host,
        layout: shmem.Layout,
        calibrate: Callable[[], shmem.Layout],
    ) -> None:
        self.collector = collector
        self.calibrate = calibrate
        # pid: type, database, user, application, leader; `listed`: the pids the last reading
        # listed (the others have ended: forgotten once their samples are written, or
        # parallel workers, tens a second, would pile up).
        self.meta: dict[int, tuple[Any, ...]] = {}
        self.listed: set[int] = set()
        self.names = waitnames.WaitNames({}, "none", collector.store.add_event)
        self.pending: list[tuple[int, Batch]] = []  # (number of its first sample, batch)
        self.raws: set[int] = set()
        self.helper_cpu_ns = 0
        self.last_meta = 0.0
        # Per second not yet written to activity_rate: its samples' lateness and read times.
        self.open_seconds: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        self._use(layout)

    def _use(self, layout: shmem.Layout) -> None:
        self.layout = layout
        # The votes outlive a restart (its numbers mean the same); the list is the new one's.
        self.names.listed, self.names.source = layout.wait_names, layout.wait_names_source
        self.reader = shmem.Reader(layout)
        self.types: dict[int, str] = {layout.client_type: "client backend"}
        self.collector.sampling_postmaster = layout.postmaster
        self.collector.sampling_again.set()

    def run(self) -> None:
        c = self.collector
        while not c.stop_event.is_set():
            helper = Helper(self.layout, c.target_hz)
            restarted = False
            try:
                for batch in helper.batches(c.stop_event.is_set):
                    if restarted or not self._server_alive():
                        # Samples of a segment its server may have left: not kept (the
                        # reconnection records the gap).
                        helper.stop()
                        restarted = True
                        continue
                    self._take_in(batch)
                    # Named before written: the first second's processes too.
                    due = not c.stop_event.is_set() and self._meta_due(batch)
                    if due and not self._read_meta():
                        helper.stop()
                        restarted = True
                        continue
                    if c.flush_due():
                        self.flush()
            finally:
                helper.stop()
                self.helper_cpu_ns += helper.cpu_ns
            if not restarted or c.stop_event.is_set() or c.error:
                return
            self._recalibrate()

    def _server_alive(self) -> bool:
        postmaster = self.layout.postmaster
        return Path(f"/proc/{postmaster}").exists() and (
            self.collector.ctx.postmaster_pid() in (None, postmaster)
        )

    def _recalibrate(self) -> None:
        """After a restart: wait for the connection back, then find the layout again."""
        c = self.collector
        deadline = time.monotonic() + c.reconnect_s
        while not c.stop_event.is_set():
            try:
                c.session.execute("SELECT 1")
                layout = self.calibrate()
            except (psycopg.Error, shmem.ShmemError) as exc:
                if isinstance(exc, psycopg.OperationalError) and not c.reconnect(
                    exc, f"{c.samples} samples"
                ):
                    return
                if time.monotonic() > deadline:
                    raise shmem.ShmemError(f"after the server restarted: {exc}") from None
                c.stop_event.wait(0.5)
                continue
            self.reader.close()
            self._use(layout)
            c.store.add_event(
                "activity-source",
                f"the server restarted: sampling its shared memory again (postmaster "
                f"{layout.postmaster})",
            )
            return

    def _take_in(self, batch: Batch) -> None:
        """A batch, kept for `flush` as it came: its samples numbered, the rate per second;
        the blockers read when a sample had a Lock wait."""
        c = self.collector
        ticks = len(batch.tick_us)
        if not ticks:
            return
        self.pending.append((c.samples + 1, batch))
        c.samples += ticks
        c.taken_until_us = max(c.taken_until_us, int(batch.tick_us.max()))
        self.raws.update(np.unique(batch.wait).tolist())
        seconds = batch.tick_us // 1_000_000 * 1_000_000
        for second in np.unique(seconds).tolist():
            this = seconds == second
            lags, reads = self.open_seconds.setdefault(second, ([], []))
            lags.append(batch.late_us[this] / 1000)
            reads.append(batch.read_ns[this] / 1e6)
        # A batch rarely starts on a second boundary: a second's rate row waits for the
        # batch that moves past it.
        for past in sorted(self.open_seconds)[:-1]:
            self._close_second(past)
        # A heavyweight-lock wait: its blockers are worth reading.
        if c.options.blockers and bool(np.any(batch.wait >> 24 == waitnames.LOCK)):
            c._record_blockers()

    def _close_second(self, second: int) -> None:
        parts = self.open_seconds.pop(second)
        lags, reads = np.concatenate(parts[0]), np.concatenate(parts[1])
        self.collector.pending_rate.append(
            (
                second,
                self.collector.target_hz,
                len(lags),
                float(lags.mean()),
                float(lags.max()),
                float(reads.mean()),
                float(reads.max()),
            )
        )

    def close_seconds(self) -> None:
        for second in sorted(self.open_seconds):
            self._close_second(second)

    def _meta_due(self, batch: Batch) -> bool:
        """Whether to ask the server now: a process, a wait or a query id it has not named
        for us yet, or META_MAX_S since we last asked (applications rename themselves).
        Asking every second cost a sixth of the whole sampler (server and ours)."""
        if time.monotonic() - self.last_meta >= META_MAX_S:
            return True
        return (
            not self.meta.keys() >= set(np.unique(batch.pid).tolist())
            or not self.names.known() >= set(np.unique(batch.wait).tolist()) - {0}
            or not self.collector.known_queries >= set(np.unique(batch.query_id).tolist()) - {0}
        )

    def _read_meta(self) -> bool:
        """Who each process is, and what the server calls the waits it is in; False when the
        connection was lost (and taken back, or given up: `collector.error` says which)."""
        c = self.collector
        self.last_meta = time.monotonic()
        before = self.reader.waits()
        try:
            rows = c.session.execute(META_SQL, {"known": sorted(c.known_queries)}).fetchall()
        except psycopg.OperationalError as exc:
            c.reconnect(exc, f"{c.samples} samples")
            return False
        after = self.reader.waits()
        types_now = dict(
            zip(
                self.reader.column(1, self.layout.statuses.pid_offset),
                self.reader.column(1, self.layout.type_offset),
                strict=True,
            )
        )
        texts: dict[int, str] = {}
        self.listed = {row[0] for row in rows}
        for pid, btype, db, user, app, wtype, event, query_id, query, leader in rows:
            self.meta[pid] = (btype, db, user, app, leader or 0)
            if pid in types_now and btype in CORE_TYPES:
                self.types.setdefault(types_now[pid], btype)
            # The server read this process's wait at some instant between our two reads: when
            # both saw the same wait, of the class the server reports, a vote for its name.
            # Either read alone would do for short waits, but a wait always followed by
            # another of its class then collects the other's votes (waitnames.py).
            raw = before.get(pid, 0)
            same_class = wtype and waitnames.WAIT_CLASSES.get(raw >> 24) == wtype
            if raw and raw == after.get(pid) and same_class:
                self.names.vote(raw, wtype, event)
            if query is not None and query_id is not None:
                texts.setdefault(int(query_id), query)
        if texts:
            texts = {q: masked(t) or "" for q, t in texts.items()}
            c.known_queries.update(texts)
            c.store.db.execute(
                "INSERT OR IGNORE INTO activity_queries SELECT unnest(?), unnest(?), ?",
                [list(texts), list(texts.values()), now_us()],
            )
        return True

    def flush(self) -> None:
        c = self.collector
        if self.pending:
            rows, names, empty = self._rows()
            db = c.store.db
            db.register("_mem_rows", rows)
            try:
                db.execute(WRITE_SQL, names)
            finally:
                db.unregister("_mem_rows")
            if len(empty["ts_us"]):
                db.execute(
                    EMPTY_SQL,
                    {
                        "ts_us": empty["ts_us"].tolist(),
                        "sample_no": empty["sample_no"].tolist(),
                        "own": c.own_pid,
                        "application": c.application_name,
                    },
                )
            self.pending.clear()
            self.raws.clear()
            if self.listed:
                self.meta = {p: m for p, m in self.meta.items() if p in self.listed}
        c._flush()

    def _rows(self) -> tuple[dict[str, np.ndarray], dict[str, list[Any]], dict[str, np.ndarray]]:
        """The batches kept, as WRITE_SQL's table and the lists its codes point into: the
        processes no analysis counts left out as the SQL sampler leaves them out (activity.py
        BATCH_SQL: ours; background processes in their idle main-loop waits, classes
        Activity and Extension); and the samples left with no process."""
        c, layout, pending = self.collector, self.layout, self.pending
        sample_no = np.concatenate([n + b.tick.astype(np.int64) for n, b in pending])
        ts_us = np.concatenate([b.tick_us[b.tick] for _, b in pending])
        pid = np.concatenate([b.pid for _, b in pending])
        wait = np.concatenate([b.wait for _, b in pending])
        state = np.concatenate([b.state for _, b in pending])
        btype = np.concatenate([b.btype for _, b in pending])
        query_id = np.concatenate([b.query_id for _, b in pending])
        leader = np.concatenate([b.leader for _, b in pending])
        meta_pids = sorted(self.meta)
        meta = [self.meta[p] for p in meta_pids]
        # The leaders pg_stat_activity named, where the field that names them is not read (a
        # pid's reading can be up to META_MAX_S old: another process's, since).
        named = [m[4] if layout.leader_offset is None else 0 for m in meta]
        leader, query_id = classify(
            sample_no,
            pid,
            btype,
            query_id,
            leader,
            np.array([0, *named], dtype=np.int32)[_codes(meta_pids, pid)],
        )
        named_ours = {pid: (m[3] or "").startswith("pgscope") for pid, m in self.meta.items()}
        # Ours by name, or by having connected from this process (and not since named as
        # another's session: a pid is reused).
        ours = [p for p, mine in named_ours.items() if mine]
        ours += [p for p in conn.OWN_BACKENDS if p not in named_ours]
        idle_background = (btype != layout.client_type) & np.isin(wait >> 24, IDLE_CLASSES)
        keep = (pid != c.own_pid) & ~np.isin(pid, ours) & ~idle_background
        raws = sorted(self.raws)
        waits = [self.names.name(raw) for raw in raws]
        states = sorted(layout.state_names)
        types = sorted(self.types)
        rows = {
            "ts_us": ts_us[keep],
            "sample_no": sample_no[keep],
            "pid": pid[keep],
            "m": _codes(meta_pids, pid[keep]),
            "bt": _codes(types, btype[keep]),
            "st": _codes(states, state[keep]),
            "w": _codes(raws, wait[keep]),
            "query_id": query_id[keep],
            "leader": leader[keep],
        }
        names = {
            "m_type": [m[0] for m in meta],
            "m_db": [m[1] for m in meta],
            "m_user": [m[2] for m in meta],
            "m_app": [m[3] for m in meta],
            "w_type": [kind for kind, _ in waits],
            "w_event": [event for _, event in waits],
            "st_name": [layout.state_names[v] for v in states],
            "bt_name": [self.types[v] for v in types],
        }
        every = np.concatenate([n + np.arange(len(b.tick_us), dtype=np.int64) for n, b in pending])
        times = np.concatenate([b.tick_us for _, b in pending])
        lonely = ~np.isin(every, rows["sample_no"])
        return rows, names, {"ts_us": times[lonely], "sample_no": every[lonely]}

    def rename(self) -> None:
        """Waits written under their number and named by the server since; what was renamed is
        recorded as an event (`wait-names`), for a copy of the samples taken before (a
        repository the observation is pushed to as it runs) to be renamed the same way."""
        learnt = self.names.learnt()
        if learnt:
            kinds, numbers, events = zip(*learnt, strict=True)
            self.collector.store.db.execute(
                RENAME_SQL, {"kind": list(kinds), "number": list(numbers), "event": list(events)}
            )
            self.collector.store.add_event(
                "wait-names", json.dumps([[k, str(n), e] for k, n, e in learnt])
            )

    def close(self) -> None:
        self.reader.close()
