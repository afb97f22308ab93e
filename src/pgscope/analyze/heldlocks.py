"""Relation locks held by the workload's sessions per step, from the `pglocks` collector's
readings of `pg_locks` within each step's measured window (warm-up excluded).

A reading sees the sessions that hold relation locks at that instant: a session between
transactions holds none and is not counted, one caught while taking or releasing its locks
counts the part it holds. Pure functions of the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from pgscope.duck import table_exists

FASTPATH_SLOTS = 16  # FP_LOCK_SLOTS_PER_BACKEND, PostgreSQL 15 to 17


@dataclass(frozen=True)
class HeldStep:
    """What the readings in one step's window saw, summed over the sessions they caught."""

    step_id: int
    readings: int
    sessions: int  # (reading, session) pairs with at least one relation lock held
    relations: int  # relations those sessions had locked, summed over the pairs
    fastpath: int  # lock entries taken by fast path, summed
    shared: int  # lock entries in the shared lock table, summed
    read_ms_mean: float  # a reading's round trip
    read_ms_max: float


@dataclass(frozen=True)
class HeldTable:
    """One table (a partition tree by its root) in one step's readings."""

    step_id: int
    relname: str
    partitions: int  # leaf partitions in its tree (0: not partitioned)
    sessions: int  # (reading, session) pairs holding locks in it
    relations: int  # relations of it they had locked (itself, partitions, indexes), summed


@dataclass(frozen=True)
class HeldLocks:
    """The section: per step, the locks the readings saw; per step and table, where."""

    read: bool = False  # the collector ran
    steps: list[HeldStep] = field(default_factory=list)
    tables: list[HeldTable] = field(default_factory=list)


# Half-open, [start, end): windows that share an edge count a row there once (the next's).
_IN_WINDOW = "JOIN steps s ON x.ts_us >= s.window_start_us AND x.ts_us < s.window_end_us"


def read(db: duckdb.DuckDBPyConnection) -> HeldLocks:
    if not table_exists(db, "pglocks_readings"):
        return HeldLocks()
    timing = {
        int(r[0]): (int(r[1]), float(r[2]), float(r[3]))
        for r in db.execute(
            f"SELECT s.step_id, count(*), avg(x.read_ms), max(x.read_ms) "
            f"FROM pglocks_readings x {_IN_WINDOW} GROUP BY ALL"
        ).fetchall()
    }
    held: dict[int, tuple[int, int, int, int]] = {
        int(r[0]): (int(r[1]), int(r[2]), int(r[3]), int(r[4]))
        for r in db.execute(
            "SELECT step_id, count(*), sum(relations), sum(fastpath), sum(shared) FROM ("
            "  SELECT s.step_id, x.ts_us, x.pid, sum(x.relations) AS relations, "
            "         sum(x.fastpath) AS fastpath, sum(x.shared) AS shared "
            f"  FROM pglocks_held x {_IN_WINDOW} GROUP BY ALL"
            ") GROUP BY ALL"
        ).fetchall()
    }
    steps = [
        HeldStep(step_id, readings, *held.get(step_id, (0, 0, 0, 0)), mean_ms, max_ms)
        for step_id, (readings, mean_ms, max_ms) in sorted(timing.items())
    ]
    tables = [
        HeldTable(int(r[0]), str(r[1]), int(r[2]), int(r[3]), int(r[4]))
        for r in db.execute(
            "SELECT s.step_id, x.relname, max(x.partitions), count(*), sum(x.relations) "
            f"FROM pglocks_held x {_IN_WINDOW} GROUP BY ALL ORDER BY ALL"
        ).fetchall()
    ]
    return HeldLocks(True, steps, tables)
