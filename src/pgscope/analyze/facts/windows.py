"""Sheets of a few seconds rather than a cell: an observation's worst window, and the last
seconds of a live view. Their facts are those their samples give (the wait profile, with the
LWLock hot spot from it), so the rules that judge a cell judge them too."""

from __future__ import annotations

from pgscope.analyze.facts.cell import CLIENTS, TPS
from pgscope.analyze.facts.tracedlocks import lwlock_top
from pgscope.analyze.facts.waits import profile_facts
from pgscope.analyze.model import FactSheet, RunAnalysis
from pgscope.analyze.observation import VARIANT as VARIANT_OBSERVED
from pgscope.analyze.waits import Profile


def live_sheet(profile: Profile, sessions: float) -> FactSheet:
    """The last seconds of a live view as a sheet: their wait profile's facts alone."""
    n = max(1, round(sessions))
    sheet = FactSheet(VARIANT_OBSERVED, n)
    sheet.add(CLIENTS, n, "client sessions present, last seconds", source="activity")
    profile_facts(sheet, profile, n, "in the last seconds")
    lwlock_top(sheet, n, traced=False)
    return sheet


def worst_window_sheet(analysis: RunAnalysis) -> FactSheet | None:
    """An observation's worst window as a sheet of its own: its commits/s, sessions and wait
    profile, which the rules judge as they judge the whole observation (None: not an
    observation, or no window with sampled activity)."""
    observed = analysis.observation
    if observed is None or observed.worst_profile is None or not observed.worst_profile.samples:
        return None
    window = next(w for w in observed.windows if w.step_id == observed.worst_window)
    n = max(1, round(window.concurrency or 1))
    where = f"in window {window.step_id}"
    sheet = FactSheet(VARIANT_OBSERVED, n)
    sheet.add(TPS, window.tps, f"commits/s {where}", source="pgstats")
    sheet.add(CLIENTS, n, f"client sessions present {where}", source="activity")
    profile_facts(sheet, observed.worst_profile, n, where)
    lwlock_top(sheet, n, traced=False)
    return sheet
