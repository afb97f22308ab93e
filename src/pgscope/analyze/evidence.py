"""Per variant, the measurements that explain it: one row per (variant, clients), pooled over
repeats, from whichever collectors ran (None where one did not)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, fields
from typing import Any

from pgscope.analyze.pgstats import StepStats
from pgscope.analyze.scaling import Cell
from pgscope.analyze.waits import WaitAnalysis


@dataclass(frozen=True)
class VariantEvidence:
    variant: str
    clients: int
    tps: float | None
    p95_ms: float | None
    syncrep_share: float | None  # of active time, waiting on IPC:SyncRep
    lock_share: float | None  # of active time, waiting on heavyweight locks
    walsender_cpu: float | None  # walsenders on CPU, on average
    wal_bytes_per_xact: float | None
    fpi_per_xact: float | None
    rows_per_commit: float | None
    log_bytes_per_s: float | None

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def per_variant(
    cells: list[Cell],
    waits: WaitAnalysis | None,
    counters: list[StepStats],
    walsender_cpu: dict[tuple[str, int], float],
) -> list[VariantEvidence]:
    profiles = {(p.variant, p.clients): p.profile for p in (waits.by_clients if waits else [])}
    out = []
    for cell in cells:
        key = (cell.variant, cell.clients)
        profile = profiles.get(key)
        steps = [c for c in counters if (c.variant, c.clients) == key]
        out.append(
            VariantEvidence(
                cell.variant,
                cell.clients,
                cell.tps_mean,
                cell.p95_ms,
                profile.share("IPC", "SyncRep") if profile else None,
                profile.share("Lock") if profile else None,
                walsender_cpu.get(key),
                _mean([s.wal_bytes_per_xact for s in steps]),
                _mean([s.fpi_per_xact for s in steps]),
                _mean([s.rows_per_commit for s in steps]),
                _mean([s.log_bytes_per_s for s in steps]),
            )
        )
    return out
