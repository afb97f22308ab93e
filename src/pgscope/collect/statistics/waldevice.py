"""How fast can the server write and flush WAL, alone? Measured once, before the load, on a
cluster pgscope owns.

Why: a bulk load is limited by the WAL device's bandwidth once the server writes WAL about as
fast as the device takes it, and no advice about commits helps then. pg_stat_wal says how much
WAL the server wrote per second; only a measurement says how much it could have written.
iostat's %util cannot say it (a device with parallel queues is "100% busy" long before it is
full, and neither a cloud volume's bandwidth cap nor a cgroup's I/O limit shows in it).

How: one session asks the server itself to write WAL, so the measurement takes the server's
own path (its WAL device, wal_sync_method, and any I/O limit on its processes): 1 MiB
transactional logical-decoding messages (pg_logical_emit_message), each committed and so
flushed, until 32 MiB or 0.5 s of them are timed (a commit that enters a new WAL segment is
not: it also creates the segment, which a load on recycled segments does not pay); then 20
one-byte ones, each a commit's flush alone. The
messages are WAL records only: no table changes, nothing replays them on a cluster without
logical decoding.

What it costs: up to 36 MiB of WAL once per run, 0.1-0.6 s before the first step (up to 3 s
on a device slower than 64 MB/s). Only on clusters pgscope starts: it writes WAL.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from pgscope.collect.base import (
    Availability,
    Collector,
    CollectorContext,
    CollectorEnv,
    CollectorError,
)
from pgscope.errors import PgscopeError
from pgscope.store import now_us

CHUNK = 1 << 20
MAX_BYTES = 32 << 20
MAX_SECONDS = 0.5
FLUSHES = 20
# One commit slower than this: the device is too slow to measure in the time a probe may take.
TIMEOUT = "5s"
EMIT = "SELECT pg_logical_emit_message(true, 'pgscope-wal-probe', %s)::text"


@dataclass(frozen=True)
class Probe:
    write_bytes_per_s: float
    write_bytes: int
    write_seconds: float
    flush_seconds: float


def _lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def probe(session: psycopg.Connection[Any]) -> Probe:
    """Time WAL written and flushed by the server on `session` (autocommit)."""
    session.execute(f"SET statement_timeout = '{TIMEOUT}'")
    row = session.execute("SELECT pg_size_bytes(current_setting('wal_segment_size'))").fetchone()
    segment = int(row[0]) if row else 16 << 20
    chunk = "x" * CHUNK  # WAL records are not compressed: any bytes will do

    def emit(payload: str) -> int:
        row = session.execute(EMIT, [payload]).fetchone()
        return _lsn(str(row[0])) if row else 0

    # A commit whose WAL enters a new segment also pays for creating it (16 MB written as
    # zeros, on a young cluster), which a load on recycled segments does not: not timed.
    end = emit(chunk)
    written = 0
    timed = 0.0
    began = time.perf_counter()
    while (
        written < MAX_BYTES
        and timed < MAX_SECONDS
        and time.perf_counter() - began < 6 * MAX_SECONDS
    ):
        start = time.perf_counter()
        previous, end = end, emit(chunk)
        if previous // segment == end // segment:
            written += CHUNK
            timed += time.perf_counter() - start
    flushes = []
    for _ in range(FLUSHES):
        start = time.perf_counter()
        emit("x")
        flushes.append(time.perf_counter() - start)
    if not written:
        raise CollectorError("the WAL device took no 1 MiB commit within a segment in 3 s")
    return Probe(written / timed, written, timed, statistics.median(flushes))


def _device(data_dir: Path | None) -> tuple[str | None, str | None]:
    if data_dir is None:
        return None, None
    try:
        folder = (data_dir / "pg_wal").resolve()
        dev = os.stat(folder).st_dev
    except OSError:
        return None, None
    return str(folder), f"{os.major(dev)}:{os.minor(dev)}"


class WalDeviceCollector(Collector):
    name = "waldevice"
    summary = "how fast the server alone writes and flushes WAL, probed once before the load"
    cost = "up to 33 MiB of WAL once per run, 0.1-0.6 s (clusters pgscope starts)"
    default_in_runs = True
    embedded_only = True

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        if env.target_kind != "embedded":
            return Availability.no(
                "it writes WAL to measure the device, which pgscope does only on clusters it "
                "starts itself"
            )
        return Availability.yes()

    def start(self, ctx: CollectorContext) -> None:
        try:
            with ctx.conn.connect(application_name="pgscope-waldevice") as session:
                result = probe(session)
        except psycopg.Error as exc:
            reason = exc.diag.message_primary or str(exc)
            raise CollectorError(f"cannot probe the WAL's device: {reason}") from None
        except PgscopeError as exc:  # unreachable
            raise CollectorError(str(exc)) from None
        folder, device = _device(ctx.data_dir)
        ctx.store.create_tables(self.name)
        ctx.store.append(
            "wal_device",
            {
                "ts_us": [now_us()],
                "folder": [folder],
                "device": [device],
                "write_bytes_per_s": [result.write_bytes_per_s],
                "write_bytes": [result.write_bytes],
                "write_seconds": [result.write_seconds],
                "flush_seconds": [result.flush_seconds],
            },
        )
        ctx.say(
            f"WAL device: {result.write_bytes_per_s / 1e6:.0f} MB/s written and flushed by the "
            f"server alone, {result.flush_seconds * 1e3:.2f} ms per commit"
        )

    def stop(self) -> str | None:
        return None
