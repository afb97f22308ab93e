"""Retention: runs older than the team keeps, removed whole.

A run goes when it started before the cutoff: its row, its analysis, its push log and its
rows in every table. A time series' monthly partition that ends by the cutoff and holds only
such runs' rows (no run kept has series rows in its month: `runs.series_from_us` and
`series_to_us` say when each run's are) is dropped whole, which is what keeps months of
history cheap to let go of; their rows elsewhere (a run across a month's end, a partition
that also holds a run kept, the tables that are not series) are deleted. One transaction,
as the repository's owner (the push and reader roles may do neither).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgscope.errors import TargetError
from pgscope.repository import schema


@dataclass(frozen=True)
class Pruned:
    cutoff_us: int
    runs: list[str]  # their ids
    partitions: list[str]  # dropped
    rows: int  # deleted from the tables left (not counting the partitions dropped)
    dry_run: bool


def prune(session: psycopg.Connection[Any], cutoff_us: int, *, dry_run: bool) -> Pruned:
    try:
        with session.transaction():
            runs = session.execute(
                "SELECT server_id, run_key, run_id FROM pgscope.runs "
                "WHERE started_us < %s OR (started_us IS NULL AND first_pushed_at < "
                "to_timestamp(%s / 1e6)) ORDER BY started_us, run_id FOR UPDATE",
                [cutoff_us, cutoff_us],
            ).fetchall()
            keys = [int(r[1]) for r in runs]
            partitions = [
                name
                for name, lo, hi in _old_partitions(session, cutoff_us)
                if not _kept_runs_in(session, keys, lo, hi)
            ]
            rows = 0
            if not dry_run:
                for name in partitions:
                    drop = sql.SQL("DROP TABLE {}").format(sql.Identifier("pgscope", name))
                    session.execute(drop)
                if keys:
                    for t in schema.store_tables():
                        deleted = session.execute(
                            sql.SQL("DELETE FROM {} WHERE run_key = ANY(%s)").format(
                                sql.Identifier("pgscope", t.name)
                            ),
                            [keys],
                        )
                        rows += max(deleted.rowcount, 0)
                    for own in ("documents", "push_log", "runs"):
                        session.execute(
                            sql.SQL("DELETE FROM {} WHERE run_key = ANY(%s)").format(
                                sql.Identifier("pgscope", own)
                            ),
                            [keys],
                        )
    except psycopg.errors.InsufficientPrivilege as exc:
        raise TargetError(
            f"cannot prune the repository: {' '.join(str(exc).split())}; prune as the role "
            f"that owns it (the one that ran `pgscope repository init`)"
        ) from None
    return Pruned(cutoff_us, [str(r[2]) for r in runs], partitions, rows, dry_run)


BOUND = re.compile(r"FROM \('?(-?\d+)'?\) TO \('?(-?\d+)'?\)")


def _kept_runs_in(session: psycopg.Connection[Any], going: list[int], lo: int, hi: int) -> bool:
    """Whether a run that stays has series rows in [lo, hi)."""
    row = session.execute(
        "SELECT EXISTS (SELECT 1 FROM pgscope.runs WHERE NOT (run_key = ANY(%s)) "
        "AND series_from_us < %s AND series_to_us >= %s)",
        [going, hi, lo],
    ).fetchone()
    return bool(row and row[0])


def _old_partitions(session: psycopg.Connection[Any], cutoff_us: int) -> list[tuple[str, int, int]]:
    """The series' monthly partitions whose range ends at or before the cutoff, with it."""
    found = []
    for name, bound in session.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent "
        "JOIN pg_namespace n ON n.oid = p.relnamespace "
        "WHERE n.nspname = 'pgscope' AND p.relname = ANY(%s) ORDER BY c.relname",
        [[t.name for t in schema.series_tables()]],
    ).fetchall():
        matched = BOUND.search(str(bound))
        if matched and int(matched[2]) <= cutoff_us:
            found.append((str(name), int(matched[1]), int(matched[2])))
    return found
