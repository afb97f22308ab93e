"""The generic reading of the account stands without the mechanism written for a cause: each
recorded planted case whose first finding a mechanism (a cause's paths trigger) interprets is
diagnosed again with that mechanism removed, and its first finding must still run through the
statement and the part, node or wait its evidence names (tests/planted.py's `Spent`) — a
cause nobody wrote down is named by where its time goes, ahead of the symptoms."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgscope.analyze import catalogue, diagnose, paths
from pgscope.analyze.load import load_analysis
from tests.evidence import Spent
from tests.planted import CASES, EVIDENCE
from tests.test_recorded import RECORDED, _unpacked

MECHANISMS = {m.id for m in catalogue.bundled().mechanisms}
# The cases whose cause a mechanism names, with the account's path their evidence follows.
ABLATED = sorted(
    case
    for case in RECORDED
    if CASES[case].expected in MECHANISMS and any(isinstance(e, Spent) for e in EVIDENCE[case])
)


def _runs_through(names: list[str], words: tuple[str, ...]) -> bool:
    rest = list(words)
    for name in names:
        if rest and rest[0].lower() in name.lower():
            rest.pop(0)
    return not rest


@pytest.mark.parametrize("case", ABLATED)
def test_without_its_mechanism_the_first_finding_still_names_where_the_time_goes(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    removed = CASES[case].expected
    found, advice = paths.mechanisms()
    monkeypatch.setattr(
        paths, "mechanisms", lambda: (tuple(m for m in found if m.id != removed), advice)
    )
    # A cause with a facts trigger too goes whole: the generic reading stands alone.
    rules, rule_advice = diagnose.load_rules()
    monkeypatch.setattr(
        diagnose, "load_rules", lambda: ([r for r in rules if r.id != removed], rule_advice)
    )
    analysis = load_analysis(_unpacked(case, tmp_path), bootstrap=0)
    assert analysis.diagnosis is not None and analysis.diagnosis.findings
    top = analysis.diagnosis.findings[0]
    assert top.id != removed
    [spent, *_] = [e for e in EVIDENCE[case] if isinstance(e, Spent)]
    # The statement, and the deepest words of the evidence's path: the part, node or wait.
    words = tuple(w for w in spent.words if w != "held by")
    assert _runs_through(top.path or [], words), (top.id, top.title, top.path)


def test_the_ablation_covers_the_cases_mechanisms_name() -> None:
    """At least the unnamed causes (no rule was written for them before the account) that a
    mechanism names."""
    unnamed = {c for c in RECORDED if CASES[c].unnamed and CASES[c].expected in MECHANISMS}
    assert unnamed <= set(ABLATED), sorted(unnamed - set(ABLATED))
