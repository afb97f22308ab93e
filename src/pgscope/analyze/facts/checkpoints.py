"""Checkpoints during the variant's steps: traced phase by phase where the usdt checkpoint
program ran (how long the buffer writes and the fsyncs took), else as the server counted them
(pg_stat_bgwriter before PostgreSQL 17, pg_stat_checkpointer from 17)."""

from __future__ import annotations

import statistics

from pgscope.analyze.facts import CellFacts, FactKind, FactSheet, Family

NEEDS = "the usdt collector's checkpoint program and a checkpoint during steps"
COUNT = FactKind(
    "checkpoint.count", "count", "checkpoints during the steps", NEEDS, ("usdt", "pgstats")
)
WRITE_MS = FactKind(
    "checkpoint.write_ms",
    "ms",
    "mean time of a checkpoint's write phase: writing the dirty buffers (spread over "
    "checkpoint_completion_target)",
    NEEDS,
    ("usdt",),
)
SYNC_MS = FactKind(
    "checkpoint.sync_ms",
    "ms",
    "mean time of a checkpoint's sync phase: the fsyncs of the files written",
    NEEDS,
    ("usdt",),
)
SYNC_SHARE = FactKind(
    "checkpoint.sync_share",
    "share",
    "the fsyncs' share of a checkpoint's duration",
    NEEDS,
    ("usdt",),
)
BUFFERS_WRITTEN = FactKind(
    "checkpoint.buffers_written",
    "count",
    "buffers a checkpoint wrote, on average",
    NEEDS,
    ("usdt", "pgstats"),
)


class CheckpointFamily(Family):
    name = "checkpoints"
    order = 70

    def fill(self, sheet: FactSheet, cell: CellFacts) -> None:
        done = [
            item.checkpoint
            for item in cell.analysis.checkpoints.items
            if item.variant == cell.variant and item.checkpoint.total_ns
        ]
        if not done:
            _counted(sheet, cell)
            return
        sheet.add(COUNT, len(done), "checkpoints traced during the steps")
        for kind, phase in ((WRITE_MS, "write"), (SYNC_MS, "sync")):
            durations = [p.duration_ns for c in done if (p := c.phase(phase)) is not None]
            if durations:
                sheet.add(kind, statistics.fmean(durations) / 1e6, kind.label)
        syncs = [
            p.duration_ns / c.total_ns
            for c in done
            if c.total_ns and (p := c.phase("sync")) is not None
        ]
        if syncs:
            sheet.add(SYNC_SHARE, statistics.fmean(syncs), SYNC_SHARE.label)
        written = [c.buffers_written for c in done if c.buffers_written is not None]
        if written:
            sheet.add(BUFFERS_WRITTEN, statistics.fmean(written), BUFFERS_WRITTEN.label)


def _counted(sheet: FactSheet, cell: CellFacts) -> None:
    """Where no checkpoint was traced (no usdt probes, or the program not run): the
    checkpoints the server counted during the variant's steps, and the buffers they wrote.
    Their phase times are not taken from these: the server adds them only when a checkpoint
    ends, which a spread one often does after the step."""
    steps = [c for c in cell.analysis.counters if c.variant == cell.variant]
    count = sum(s.checkpoints for s in steps)
    if not count:
        return
    sheet.add(
        COUNT,
        count,
        "checkpoints the server counted during the steps (requested and timed)",
        source="pgstats",
    )
    written = [s.checkpoint_buffers for s in steps if s.checkpoint_buffers is not None]
    if written:
        sheet.add(
            BUFFERS_WRITTEN,
            sum(written) / count,
            "buffers checkpoints wrote during the steps, per checkpoint counted (one still "
            "writing at a step's end counts what it had written)",
            source="pgstats",
        )
