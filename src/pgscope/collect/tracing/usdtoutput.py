"""What a USDT program's printed lines become in the store.

A program prints its BPF maps cumulatively at every wall-clock second (`pgscope-flush`), at
exit (`pgscope-end`), and a line per checkpoint event (`pgscope-ckpt`); this turns them into
each second's differences (usdt_seconds, usdt_latency, usdt_latency_hist, usdt_counters) and
checkpoint records (usdt_checkpoints and its phases and flush histogram). Costs one JSON parse
per printed line and one batch of rows per program per second, in the tracer's reader thread.
docs/collector-usdt.md documents the tables.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pgscope.collect.tracing.bpf import (
    LatencySeries,
    Program,
    checkpoint_flags_text,
    checkpoint_phases,
    lock_mode_name,
    lock_type_name,
    lwlock_mode_name,
)
from pgscope.store import RunStore, now_us


@dataclass
class Cumulative:
    """bpftrace prints each map's running total; the store wants each second's share."""

    last: dict[tuple[str, tuple[str, ...], tuple[int, int] | None], int] = field(
        default_factory=dict
    )

    def delta(
        self, name: str, key: tuple[str, ...], bucket: tuple[int, int] | None, value: int
    ) -> int:
        slot = (name, key, bucket)
        change = value - self.last.get(slot, 0)
        self.last[slot] = value
        return change


Buckets = dict[tuple[int, int], int]  # (min, max) inclusive -> count


def _buckets(printed: Any) -> Buckets:
    """A printed bpftrace histogram: [{"min": lo, "max": hi, "count": n}, ...]."""
    if not isinstance(printed, list):
        return {}
    return {(int(b["min"]), int(b["max"])): int(b["count"]) for b in printed}


def _split_key(key: str, parts: int) -> tuple[str, ...]:
    """bpftrace joins a map's key fields with commas; only the first may hold text."""
    return (key,) if parts <= 1 else tuple(key.rsplit(",", parts - 1))


class _Rows:
    """Column-wise rows for RunStore.append."""

    def __init__(self, *columns: str) -> None:
        self.columns: dict[str, list[Any]] = {c: [] for c in columns}

    def add(self, *values: Any) -> None:
        for column, value in zip(self.columns.values(), values, strict=True):
            column.append(value)


@dataclass
class CheckpointTrace:
    """The events of one checkpoint, in nanoseconds of the monotonic clock."""

    pid: int
    flags: int
    events: dict[str, int] = field(default_factory=dict)
    buffers_total: int | None = None
    buffers_to_write: int | None = None
    buffers_written: int | None = None


class UsdtOutput:
    """The rows of one bpftrace process running one program, as its lines arrive."""

    def __init__(self, program: Program, store: RunStore, server_version_num: int) -> None:
        self.program = program
        self.store = store
        self.server_version_num = server_version_num
        self.cumulative = Cumulative()
        self.maps: dict[str, Any] = {}  # latest print of each map since the last flush
        self.ended = False
        self.checkpoint: CheckpointTrace | None = None
        self.offset_ns = 0
        self.last_flush_us = now_us()

    def attached(self, offset_ns: int) -> None:
        """The process starts: printed times are nsecs (the monotonic clock) and become
        epoch microseconds with this offset."""
        self.offset_ns = offset_ns
        self.last_flush_us = now_us()

    def handle_line(self, line: bytes) -> None:
        self._handle(json.loads(line))

    def _handle(self, message: dict[str, Any]) -> None:
        kind, data = message.get("type"), message.get("data")
        if kind in ("map", "hist") and isinstance(data, dict):
            self.maps.update(data)
        elif kind == "printf" and isinstance(data, str):
            self._handle_text(data.split())
        elif kind == "lost_events" and isinstance(data, dict):
            now = now_us()
            self.store.add_gap(
                "usdt",
                self.last_flush_us,
                now,
                f"bpftrace ({self.program.name}) lost {data.get('events')} output events",
            )

    def _handle_text(self, words: list[str]) -> None:
        if not words:
            return
        if words[0] == "pgscope-ready":
            self.last_flush_us = self._epoch_us(int(words[1]))
        elif words[0] in ("pgscope-flush", "pgscope-end"):
            self._flush(int(words[1]) * 1_000_000, self._epoch_us(int(words[2])))
            if words[0] == "pgscope-end":
                self.ended = True
        elif words[0] == "pgscope-ckpt":
            self._checkpoint_event(words[1], int(words[2]), int(words[3]), words[4:])

    def _epoch_us(self, nsecs: int) -> int:
        return (nsecs + self.offset_ns) // 1000

    def _flush(self, second_us: int, at_us: int) -> None:
        latency = _Rows("second_us", "event", "object", "mode", "count", "total_ns")
        hist = _Rows("second_us", "event", "object", "mode", "lo_ns", "hi_ns", "count")
        for series in self.program.latency:
            for key, buckets in self._hist_entries(series).items():
                obj, mode = self._names(series.event, key)
                count = 0
                for (lo, hi), value in sorted(buckets.items()):
                    change = self.cumulative.delta(series.hist_map, key, (lo, hi), value)
                    if change:
                        count += change
                        unit = series.hist_unit_ns
                        hist.add(
                            second_us, series.event, obj, mode, lo * unit, (hi + 1) * unit, change
                        )
                total = self.cumulative.delta(
                    series.sum_map, key, None, self._sum_entry(series, key)
                )
                if count or total:
                    latency.add(second_us, series.event, obj, mode, count, total)
        counters = _Rows("second_us", "counter", "value")
        for counter in self.program.counters:
            printed = self.maps.get(counter.map_name)
            if isinstance(printed, int):
                change = self.cumulative.delta(counter.map_name, (), None, printed)
                if change:
                    counters.add(second_us, counter.counter, change)
        self.store.append("usdt_latency", latency.columns)
        self.store.append("usdt_latency_hist", hist.columns)
        self.store.append("usdt_counters", counters.columns)
        seconds = _Rows("second_us", "program", "start_us", "end_us")
        seconds.add(second_us, self.program.name, self.last_flush_us, at_us)
        self.store.append("usdt_seconds", seconds.columns)
        self.last_flush_us = at_us

    def _hist_entries(self, series: LatencySeries) -> dict[tuple[str, ...], Buckets]:
        raw = self.maps.get(series.hist_map)
        if raw is None:
            return {}
        keyed = {"": raw} if series.key_parts == 0 else raw
        out: dict[tuple[str, ...], Buckets] = {}
        for key, buckets in keyed.items():
            out[_split_key(key, series.key_parts)] = _buckets(buckets)
        return out

    def _sum_entry(self, series: LatencySeries, key: tuple[str, ...]) -> int:
        raw = self.maps.get(series.sum_map)
        if series.key_parts == 0:
            return int(raw) if isinstance(raw, int) else 0
        if not isinstance(raw, dict):
            return 0
        return int(raw.get(",".join(key), 0))

    def _names(self, event: str, key: tuple[str, ...]) -> tuple[str | None, str | None]:
        if event in ("lwlock_wait", "lwlock_hold"):
            return key[0], lwlock_mode_name(int(key[1]))
        if event == "lock_wait":
            kind, mode = int(key[0]), int(key[1])
            return (
                lock_type_name(kind, self.server_version_num),
                lock_mode_name(mode),
            )
        return None, None

    # -- checkpoints ------------------------------------------------------------------------

    def _checkpoint_event(self, event: str, nsecs: int, pid: int, args: list[str]) -> None:
        if event == "start":
            if self.checkpoint is not None:  # no done for the last one: its process died
                self.finish_checkpoint(None)
            self.checkpoint = CheckpointTrace(pid, int(args[0]))
        ckpt = self.checkpoint
        if ckpt is None or ckpt.pid != pid:
            return
        ckpt.events[event] = nsecs
        if event == "sync_start":
            ckpt.buffers_total, ckpt.buffers_to_write = int(args[0]), int(args[1])
        elif event == "sync_done":
            ckpt.buffers_written = int(args[0])
        elif event == "done":
            self.finish_checkpoint(nsecs)

    def finish_checkpoint(self, done: int | None) -> None:
        """Store the checkpoint in progress: complete at its done event, else as far as it
        got (the trace ended first). Its flush histogram was printed just before."""
        ckpt, self.checkpoint = self.checkpoint, None
        if ckpt is None:
            return
        buckets = _buckets(self.maps.pop("@flush_us", None))
        flush_ns = self.maps.pop("@flush_ns", None)
        start = ckpt.events["start"]
        start_us = self._epoch_us(start)
        phases = checkpoint_phases(ckpt.events)
        record = _Rows(
            "start_us",
            "end_us",
            "status",
            "pid",
            "flags",
            "flags_text",
            "total_ns",
            "phases_ns",
            "buffers_total",
            "buffers_to_write",
            "buffers_written",
            "flushes",
            "flush_ns",
        )
        record.add(
            start_us,
            self._epoch_us(done) if done is not None else None,
            "complete" if done is not None else "incomplete",
            ckpt.pid,
            ckpt.flags,
            checkpoint_flags_text(ckpt.flags),
            done - start if done is not None else None,
            sum(end - begin for _, begin, end in phases),
            ckpt.buffers_total,
            ckpt.buffers_to_write,
            ckpt.buffers_written,
            sum(buckets.values()),
            flush_ns if isinstance(flush_ns, int) else 0,
        )
        self.store.append("usdt_checkpoints", record.columns)
        rows = _Rows("checkpoint_start_us", "seq", "phase", "start_us", "end_us", "duration_ns")
        for seq, (name, begin, end) in enumerate(phases, 1):
            rows.add(start_us, seq, name, self._epoch_us(begin), self._epoch_us(end), end - begin)
        self.store.append("usdt_checkpoint_phases", rows.columns)
        flushes = _Rows("checkpoint_start_us", "lo_ns", "hi_ns", "count")
        for (lo, hi), count in sorted(buckets.items()):
            if count:
                flushes.add(start_us, lo * 1000, (hi + 1) * 1000, count)
        self.store.append("usdt_checkpoint_flush_hist", flushes.columns)
