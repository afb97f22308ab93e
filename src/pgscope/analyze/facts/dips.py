"""The variant's dips after actions or checkpoints, over all its steps (a dip is a property
of the variant's settings more than of one client count), and the full-page images around
them."""

from __future__ import annotations

from pgscope.analyze.facts import CellFacts, FactKind, FactSheet, Family
from pgscope.analyze.facts.counters import BLOCK_BYTES

NEEDS = "a checkpoint or action during steps"
DIPS = ("pgbench + server log",)
DEPTH = FactKind(
    "dip.depth",
    "share",
    "mean dip of tps after a checkpoint or action (lowest 3-second mean in the 10 s after "
    "against the median second of the 10 s before)",
    NEEDS,
    DIPS,
)
NOISE = FactKind(
    "dip.noise",
    "share",
    "how low a 3-second mean falls by chance (3 robust σ, from the seconds before)",
    NEEDS,
    ("pgbench",),
)
EXCESS = FactKind("dip.excess", "share", "mean dip beyond that noise", NEEDS, DIPS)
FPI_RATIO = FactKind(
    "dip.fpi_ratio",
    "ratio",
    "full-page images per second after the checkpoint against before",
    NEEDS,
    ("pgstats",),
)
FPI_WAL_SHARE = FactKind(
    "dip.fpi_wal_share",
    "share",
    "full-page images' share of the WAL in the 5 s after the checkpoint (at most: each counted "
    "as a whole 8 kB page)",
    NEEDS,
    ("pgstats",),
)
FPI_PER_S_AFTER = FactKind(
    "dip.fpi_per_s_after",
    "count",
    "full-page images per second in the 5 s after the checkpoint",
    NEEDS,
    ("pgstats",),
)


class DipFamily(Family):
    name = "dips"
    order = 60

    def fill(self, sheet: FactSheet, cell: CellFacts) -> None:
        # The variant's steps of the sweep; an open-loop cell's own: its load does not slow
        # down with the server, so its dip and recovery are another measurement.
        rates = {s.step_id: s.rate for s in cell.analysis.steps}
        ids = cell.step_ids
        dips = [
            d
            for d in cell.analysis.timeline.dips
            if d.variant == cell.variant
            and (d.step_id in ids if cell.rate is not None else rates.get(d.step_id) is None)
        ]
        if not dips:
            return
        worst = max(dips, key=lambda d: d.depth_pct)
        steps = f"over {len(dips)} step(s)"
        sheet.add(
            DEPTH,
            sum(d.depth_pct for d in dips) / len(dips) / 100,
            f"mean dip of tps after {worst.action} (lowest 3-second mean in the 10 s "
            f"after against the median second of the 10 s before), {steps}",
        )
        sheet.add(NOISE, sum(d.noise_pct for d in dips) / len(dips) / 100, NOISE.label)
        sheet.add(
            EXCESS,
            sum(d.excess_pct for d in dips) / len(dips) / 100,
            f"mean dip after {worst.action} beyond that noise, {steps}",
        )
        ratios = []
        for d in dips:
            if d.fpi_per_s_after is None or d.fpi_per_s_before is None:
                continue
            if d.fpi_per_s_before > 0:
                ratios.append(d.fpi_per_s_after / d.fpi_per_s_before)
            else:  # none before: a spike from nothing, or none at all (full_page_writes off)
                ratios.append(100.0 if d.fpi_per_s_after > 0 else 1.0)
        if ratios:
            sheet.add(FPI_RATIO, max(ratios), FPI_RATIO.label)
        shares = [
            min(1.0, d.fpi_per_s_after * BLOCK_BYTES / d.wal_bytes_per_s_after)
            for d in dips
            if d.fpi_per_s_after is not None and d.wal_bytes_per_s_after
        ]
        if shares:
            # Judged by share, not only by jump: on slow storage the wave of images a
            # checkpoint starts can outlast the gap to the next one, and then there is no
            # jump to see.
            sheet.add(FPI_WAL_SHARE, sum(shares) / len(shares), FPI_WAL_SHARE.label)
        fpi_after = [d.fpi_per_s_after for d in dips if d.fpi_per_s_after is not None]
        if fpi_after:
            sheet.add(FPI_PER_S_AFTER, sum(fpi_after) / len(fpi_after), FPI_PER_S_AFTER.label)
