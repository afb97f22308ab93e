"""The leading finding of the last seconds, for `observe --live`: the rules that judge a cell
judge the recent wait profile alone, as they judge an observation's worst window.

Only the facts the samples give (waits, AAS, session states) exist here: rules that need
pg_stat counters, statements, the host or tracing are not assessed, so the live finding is a
first reading; the closing summary judges every layer.
"""

from __future__ import annotations

import duckdb

from pgscope.analyze.diagnose import diagnose
from pgscope.analyze.facts.windows import live_sheet
from pgscope.analyze.model import Finding
from pgscope.analyze.waits import CLIENTS, Profile


def client_sessions(db: duckdb.DuckDBPyConnection, start_us: int) -> float:
    """Client sessions present per sample since `start_us` (pgscope's own left out)."""
    row = db.execute(
        f"SELECT count(*) FILTER (WHERE {CLIENTS}) / nullif(count(DISTINCT sample_no), 0) "
        "FROM activity_samples WHERE ts_us >= ?",
        [start_us],
    ).fetchone()
    return float(row[0]) if row and row[0] is not None else 0.0


def leading_finding(profile: Profile, sessions: float) -> Finding | None:
    """The finding the rules rank first over `profile` (at medium confidence or more), or
    None: no sample yet, or nothing a rule recognises."""
    if not profile.samples:
        return None
    diagnosis = diagnose([live_sheet(profile, sessions)])
    top = diagnosis.findings[0] if diagnosis.findings else None
    return top if top is not None and not diagnosis.weak else None
