"""Checkpoints during the variant's steps: traced phase by phase where the usdt checkpoint
program ran (how long the buffer writes and the fsyncs took), else as the server counted them
(pg_stat_bgwriter before PostgreSQL 17, pg_stat_checkpointer from 17)."""

from __future__ import annotations

import statistics

from pgscope.analyze.facts import CellFacts, FactKind, FactSheet, Family
from pgscope.analyze.waits import covered

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


IN_PROGRESS = FactKind(
    "checkpoint.in_progress",
    "share",
    "share of the measured time a checkpoint was in progress (the server log's start and "
    "end, or the checkpointer's samples): what the server did beside the workload",
    "the activity collector (or the server log of a cluster pgscope starts)",
    ("activity",),
)


class CheckpointFamily(Family):
    name = "checkpoints"
    order = 70

    def fill(self, sheet: FactSheet, cell: CellFacts) -> None:
        self._in_progress(sheet, cell)
        self._checkpoints(sheet, cell)

    @staticmethod
    def _in_progress(sheet: FactSheet, cell: CellFacts) -> None:
        waits = cell.analysis.waits
        if waits is None:
            return
        windows = [
            (s.window_start_us, s.window_end_us)
            for s in cell.steps()
            if s.window_start_us is not None and s.window_end_us is not None
        ]
        measured = sum(end - start for start, end in windows)
        if not measured:
            return
        inside = sum(covered(waits.checkpoints, a, b) * (b - a) for a, b in windows)
        sheet.add(
            IN_PROGRESS,
            inside / measured,
            f"share of the measured time a checkpoint was in progress {cell.where}",
        )

    def _checkpoints(self, sheet: FactSheet, cell: CellFacts) -> None:
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
