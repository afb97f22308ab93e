"""The activity sampler's loop when it reads the server's shared memory (collect/shmem.py)
instead of asking it: same tables, same rows, no work for the server per sample.

Each sample copies the PGPROC and status arrays in one system call and keeps, per process
slot in use, its pid, wait_event_info, state, backend type and query_id as numbers. Once a
second (`META_SQL`, one statement) the server names what numbers cannot say: each process's
backend type, database, user and application, and the texts of new query ids; and, from
the processes whose wait did not change across that statement, which wait event each
wait_event_info is (a wait the server has not yet named is written as its class and number,
renamed at the end). The numbers become rows in DuckDB when written (every `flush_s`).

What it costs (docs/benchmarks.md, "A sampler that reads shared memory"): no server CPU per
sample; ours is a wake-up, one copy of both arrays (~0.1 ms per MB) and a few list
operations per sample, and the 1-Hz statement. It needs root and the server on this host.
"""

from __future__ import annotations

import time
from array import array
from collections import Counter
from itertools import compress, repeat
from typing import TYPE_CHECKING, Any

import numpy as np
import psycopg

from pgscope.collect import shmem
from pgscope.store import now_us

if TYPE_CHECKING:
    from pgscope.collect.activity import ActivityCollector

META_S = 1.0
LOCK_CLASS = 0x03  # a heavyweight-lock wait: its blockers are worth reading
META_SQL = """
SELECT pid, backend_type, datname, usename, application_name, wait_event_type, wait_event,
       query_id, CASE WHEN query_id <> ALL(%(known)s::bigint[]) THEN query END
FROM pg_stat_activity
"""
# The samples taken in (three registered tables of numbers: per sample, per process slot,
# per status slot) turned into activity_samples' rows: named through the lists given (per
# pid, per wait number, per state and backend type number), with the same processes left out
# as the SQL sampler leaves out (activity.py BATCH_SQL), and a row of the sampler's own for
# an empty sample.
WRITE_SQL = """
INSERT INTO activity_samples
WITH named AS (
    SELECT s.ts_us, p.sample_no, p.pid, coalesce(m.backend_type, types.name) AS backend_type,
           states.name AS state, waits.wtype, waits.wevent, nullif(b.qid, 0) AS query_id,
           m.datname, m.usename, m.app
    FROM _mem_procs p JOIN _mem_samples s USING (sample_no)
    LEFT JOIN _mem_statuses b USING (sample_no, pid)
    LEFT JOIN (SELECT unnest($m_pid) AS pid, unnest($m_type) AS backend_type,
                      unnest($m_db) AS datname, unnest($m_user) AS usename,
                      unnest($m_app) AS app) m USING (pid)
    LEFT JOIN (SELECT unnest($w_raw) AS raw, unnest($w_type) AS wtype,
                      unnest($w_event) AS wevent) waits USING (raw)
    LEFT JOIN (SELECT unnest($st_value) AS value, unnest($st_name) AS name) states
           ON states.value = b.state
    LEFT JOIN (SELECT unnest($bt_value) AS value, unnest($bt_name) AS name) types
           ON types.value = b.btype
    WHERE p.pid <> $own AND coalesce(m.app, '') NOT LIKE 'pgscope%'),
kept AS (
    SELECT * FROM named
    WHERE backend_type = 'client backend' OR wtype IS NULL
          OR wtype NOT IN ('Activity', 'Extension'))
SELECT * FROM kept
UNION ALL
SELECT ts_us, sample_no, $own, 'client backend', 'active', NULL, NULL, NULL, NULL, NULL,
       $application
FROM _mem_samples WHERE sample_no NOT IN (SELECT sample_no FROM kept)
"""
RENAME_SQL = """
UPDATE activity_samples SET wait_event = n.event
FROM (SELECT unnest($kind) AS kind, unnest($number) AS number, unnest($event) AS event) AS n
WHERE wait_event_type = n.kind AND wait_event = n.number
"""


class MemorySampler:
    """Samples `collector`'s server through `layout` until the collector is stopped."""

    def __init__(self, collector: ActivityCollector, layout: shmem.Layout) -> None:
        self.collector = collector
        self.layout = layout
        self.reader = shmem.Reader(layout)
        self.meta: dict[int, tuple[Any, ...]] = {}  # pid: type, database, user, application
        self.votes: dict[int, Counter[tuple[str, str]]] = {}
        self.types: dict[int, str] = {layout.client_type: "client backend"}
        self.numbered: set[int] = set()  # waits written under their number, not their name
        self.columns = {
            "_mem_samples": {"sample_no": array("q"), "ts_us": array("q")},
            "_mem_procs": {"sample_no": array("q"), "pid": array("i"), "raw": array("I")},
            "_mem_statuses": {
                "sample_no": array("q"),
                "pid": array("i"),
                "state": array("i"),
                "btype": array("i"),
                "qid": array("q"),
            },
        }
        self.raws: set[int] = set()

    def run(self) -> None:
        """Per sample only the reads, kept as they come: after a 10-ms sleep on a busy host
        everything the interpreter touches is cache-cold, so a sample costs per object it
        touches (measured: decoding each sample as it came tripled its CPU); the rest is
        done once a second, in `_take_in`."""
        c = self.collector
        fields = self.reader.fields()
        taken: list[tuple[Any, ...]] = []
        interval = 1.0 / c.target_hz
        monotonic, sleep, clock = time.monotonic, time.sleep, time.time_ns
        start = last_meta = monotonic()
        n = 0
        while not c.stop_event.is_set():
            due = start + n * interval
            now = monotonic()
            if due > now:
                sleep(min(due - now, 0.2))
                now = monotonic()
                if now < due:
                    continue
            taken.append((clock(), now - due, *[field.tolist() for field in fields]))
            n += 1
            if now - due > interval:  # fell behind: skip, do not burst
                n = int((now - start) / interval) + 1
            if now - last_meta >= META_S:
                last_meta = now
                self._take_in(taken)
                taken = []
                if not self._read_meta():
                    return
        self._take_in(taken)

    def _take_in(self, taken: list[tuple[Any, ...]]) -> None:
        """The samples read since the last call, into the columns `flush` writes: the slots
        in use, the rate per second; the blockers when a sample had a Lock wait."""
        c = self.collector
        cols = self.columns
        samples, procs, statuses = cols["_mem_samples"], cols["_mem_procs"], cols["_mem_statuses"]
        locked = False
        for ns, late_s, pids, waits, spids, states, types, *qids in taken:
            c.samples += 1
            no, ts_us = c.samples, ns // 1000
            samples["sample_no"].append(no)
            samples["ts_us"].append(ts_us)
            live = list(compress(pids, pids))
            waiting = list(compress(waits, pids))
            procs["sample_no"].extend(repeat(no, len(live)))
            procs["pid"].extend(live)
            procs["raw"].extend(waiting)
            self.raws.update(waiting)
            locked = locked or any(w >> 24 == LOCK_CLASS for w in waiting)
            live = list(compress(spids, spids))
            statuses["sample_no"].extend(repeat(no, len(live)))
            statuses["pid"].extend(live)
            statuses["state"].extend(compress(states, spids))
            statuses["btype"].extend(compress(types, spids))
            statuses["qid"].extend(compress(qids[0], spids) if qids else repeat(0, len(live)))
            second = ts_us // 1_000_000 * 1_000_000
            c.open_seconds.setdefault(second, {})[no] = (late_s * 1000, 0.0)
        for past in sorted(c.open_seconds)[:-1]:
            c._close_second(past, c.open_seconds.pop(past))
        if time.monotonic() - c.last_flush >= c.options.flush_s:
            self.flush()
        if locked and c.options.blockers:
            c._record_blockers()

    def _read_meta(self) -> bool:
        """Who each process is, and what the server calls the waits it is in; False when the
        connection is lost for good."""
        c = self.collector
        before = self._waits_now()
        try:
            rows = c.session.execute(META_SQL, {"known": sorted(c.known_queries)}).fetchall()
        except psycopg.OperationalError as exc:
            return c.reconnect(exc, f"{c.samples} samples")
        after = self._waits_now()
        types_now = dict(
            zip(
                self.reader.column(1, self.layout.statuses.pid_offset),
                self.reader.column(1, self.layout.type_offset),
                strict=True,
            )
        )
        texts: dict[int, str] = {}
        for pid, btype, db, user, app, wtype, event, query_id, query in rows:
            self.meta[pid] = (btype, db, user, app)
            if pid in types_now and btype:
                self.types.setdefault(types_now[pid], btype)
            raw = before.get(pid, 0)
            steady = raw != 0 and raw == after.get(pid)  # one wait all through the statement
            if steady and wtype and shmem.WAIT_CLASSES.get(raw >> 24) == wtype:
                self.votes.setdefault(raw, Counter())[(wtype, event)] += 1
            if query is not None and query_id is not None:
                texts.setdefault(int(query_id), query)
        if texts:
            c.known_queries.update(texts)
            c.store.db.execute(
                "INSERT OR IGNORE INTO activity_queries SELECT unnest(?), unnest(?), ?",
                [list(texts), list(texts.values()), now_us()],
            )
        return True

    def _waits_now(self) -> dict[int, int]:
        return dict(
            zip(
                self.reader.column(0, self.layout.procs.pid_offset),
                self.reader.column(0, self.layout.wait_offset, "I"),
                strict=True,
            )
        )

    def name(self, raw: int) -> tuple[str | None, str | None]:
        votes = self.votes.get(raw)
        if votes:
            return votes.most_common(1)[0][0]
        self.numbered.add(raw)
        return shmem.wait_name(raw)

    def flush(self) -> None:
        c = self.collector
        if self.columns["_mem_samples"]["sample_no"]:
            raws = sorted(self.raws)
            names = [self.name(raw) for raw in raws]
            meta = list(self.meta.items())
            db = c.store.db
            for table, columns in self.columns.items():
                db.register(
                    table,
                    {
                        name: np.frombuffer(values, dtype=np.dtype(values.typecode))
                        for name, values in columns.items()
                    },
                )
            try:
                db.execute(
                    WRITE_SQL,
                    {
                        "m_pid": [pid for pid, _ in meta],
                        "m_type": [m[0] for _, m in meta],
                        "m_db": [m[1] for _, m in meta],
                        "m_user": [m[2] for _, m in meta],
                        "m_app": [m[3] for _, m in meta],
                        "w_raw": raws,
                        "w_type": [kind for kind, _ in names],
                        "w_event": [event for _, event in names],
                        "st_value": list(self.layout.state_names),
                        "st_name": list(self.layout.state_names.values()),
                        "bt_value": list(self.types),
                        "bt_name": list(self.types.values()),
                        "own": c.own_pid,
                        "application": c.application_name,
                    },
                )
            finally:
                for table in self.columns:
                    db.unregister(table)
            for columns in self.columns.values():
                for name, values in columns.items():
                    columns[name] = array(values.typecode)
            self.raws.clear()
        c._flush()

    def rename(self) -> None:
        """Waits written under their number and named by the server since."""
        learnt = [raw for raw in sorted(self.numbered) if raw in self.votes]
        if not learnt:
            return
        self.collector.store.db.execute(
            RENAME_SQL,
            {
                "kind": [shmem.wait_name(raw)[0] for raw in learnt],
                "number": [shmem.wait_name(raw)[1] for raw in learnt],
                "event": [self.votes[raw].most_common(1)[0][0][1] for raw in learnt],
            },
        )
