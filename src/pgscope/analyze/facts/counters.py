"""The server's cumulative statistics over the cell's steps (the pgstats collector): WAL per
transaction and per second, full-page images, the WAL buffers found full, the server log's
rate, rows per commit; and the
WAL rate against what the WAL's device took when probed before the load (the waldevice
collector): near it, the device's bandwidth is the limit, whatever the commits do."""

from __future__ import annotations

import statistics

from pgscope.analyze.facts import CellFacts, FactKind, FactSheet, Family

PGSTATS = "the pgstats collector"
SOURCES = ("pgstats",)
# PostgreSQL's default block size: a full-page image is at most one block of WAL.
BLOCK_BYTES = 8192

WAL_PER_XACT = FactKind(
    "wal.bytes_per_xact", "bytes", "WAL bytes per transaction", PGSTATS, SOURCES
)
FPI_PER_XACT = FactKind(
    "wal.fpi_per_xact", "count", "full-page images per transaction", PGSTATS, SOURCES
)
LOG_RATE = FactKind(
    "log.bytes_per_s",
    "bytes/s",
    "server log written per second",
    "the pgstats collector (and a server log directory)",
    SOURCES,
)
ROWS_PER_COMMIT = FactKind("rows_per_commit", "count", "rows inserted per commit", PGSTATS, SOURCES)
SYNCS_PER_XACT = FactKind(
    "wal.syncs_per_xact",
    "count",
    "WAL fsyncs per transaction (1: each commit flushes on its own)",
    PGSTATS,
    SOURCES,
)
FPI_BYTE_SHARE = FactKind(
    "wal.fpi_byte_share", "share", "full-page images' share of the WAL (at most)", PGSTATS, SOURCES
)
WAL_RATE = FactKind("wal.bytes_per_s", "bytes/s", "WAL written per second", PGSTATS, SOURCES)
BUFFERS_FULL = FactKind(
    "wal.buffers_full_per_xact",
    "count",
    "times per transaction a session found the WAL buffers full and wrote WAL out itself",
    PGSTATS,
    SOURCES,
)
DEVICE = "the waldevice collector (clusters pgscope starts)"
DEVICE_RATE = FactKind(
    "wal.device_bytes_per_s",
    "bytes/s",
    "WAL the server alone wrote and flushed per second before the load, in 1 MiB commits",
    DEVICE,
    ("waldevice",),
)
DEVICE_SHARE = FactKind(
    "wal.device_share",
    "share",
    "WAL written per second as a share of what the server alone could write before the load",
    DEVICE,
    ("pgstats + waldevice",),
)


class CounterFamily(Family):
    name = "counters"
    order = 50

    def fill(self, sheet: FactSheet, cell: CellFacts) -> None:
        ids = cell.step_ids
        steps = [c for c in cell.analysis.counters if c.step_id in ids]
        if not steps:
            return
        for kind, values in (
            (WAL_PER_XACT, [s.wal_bytes_per_xact for s in steps]),
            (FPI_PER_XACT, [s.fpi_per_xact for s in steps]),
            (LOG_RATE, [s.log_bytes_per_s for s in steps]),
            (ROWS_PER_COMMIT, [s.rows_per_commit for s in steps]),
            (SYNCS_PER_XACT, [s.wal_syncs_per_xact for s in steps]),
            (BUFFERS_FULL, [s.wal_buffers_full_per_xact for s in steps]),
        ):
            sheet.add(kind, _mean(values), kind.label)
        rate = _mean([s.wal_bytes / s.seconds if s.seconds > 0 else None for s in steps])
        if rate is None:
            return
        wal = sum(s.wal_bytes for s in steps)
        if wal > 0:
            sheet.add(
                FPI_BYTE_SHARE,
                min(1.0, sum(s.wal_fpi for s in steps) * BLOCK_BYTES / wal),
                f"full-page images' share of the WAL {cell.where} (each counted as a whole "
                f"{BLOCK_BYTES // 1024} kB block: at most this)",
            )
        sheet.add(WAL_RATE, rate, f"WAL written per second {cell.where}")
        device = cell.analysis.environment.wal_device
        if device is None or device.write_bytes_per_s <= 0:
            return
        sheet.add(
            DEVICE_RATE,
            device.write_bytes_per_s,
            f"{DEVICE_RATE.label}{f' (device {device.device})' if device.device else ''}",
        )
        sheet.add(
            DEVICE_SHARE,
            rate / device.write_bytes_per_s,
            f"WAL written per second {cell.where}, as a share of what the server alone could "
            f"write before the load",
        )


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None
