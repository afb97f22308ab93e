"""The facts' vocabulary (analyze/facts/): every fact is of a kind declared once, every rule
names only declared facts, and the families add only facts of their own kinds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pgscope.analyze import facts
from pgscope.analyze.diagnose import load_rules
from pgscope.analyze.facts import kind
from pgscope.analyze.model import FactKind

FACTS = Path(__file__).parent / "data" / "facts"
RULES = Path(__file__).parent.parent / "src" / "pgscope" / "analyze" / "causes.toml"


def test_a_rule_naming_an_undeclared_fact_fails_with_its_id_and_the_name(tmp_path: Path) -> None:
    text = RULES.read_text().replace('score = ["wait.syncrep"]', 'score = ["wait.sycnrep"]', 1)
    assert "wait.sycnrep" in text
    broken = tmp_path / "causes.toml"
    broken.write_text(text)
    with pytest.raises(
        ValueError, match=r"cause syncrep-waits: fact wait\.sycnrep is declared by no"
    ):
        load_rules(broken)


def test_a_fact_quoted_in_advice_is_checked_too(tmp_path: Path) -> None:
    text = RULES.read_text().replace("{wal.fpi_byte_share}", "{wal.fpi_bytes_share}", 1)
    broken = tmp_path / "causes.toml"
    broken.write_text(text)
    with pytest.raises(ValueError, match=r"cause wal-volume: fact wal\.fpi_bytes_share"):
        load_rules(broken)


def test_the_bundled_rules_name_declared_facts_only() -> None:
    rules, _ = load_rules()
    assert len(rules) >= 27


@pytest.mark.parametrize("recording", sorted(FACTS.glob("*.json")), ids=lambda p: p.stem)
def test_every_recorded_fact_is_of_a_declared_kind(recording: Path) -> None:
    """The planted cases' recorded facts: each name has its declared kind, unit and source."""
    for sheet in json.loads(recording.read_text())["sheets"]:
        for name, fact in sheet["facts"].items():
            declared = kind(name)
            assert declared is not None, f"{recording.stem}: {name} is not declared"
            assert fact["unit"] == declared.unit, (name, fact["unit"], declared.unit)
            assert fact["source"] in declared.sources, (name, fact["source"], declared.sources)


def test_kinds_are_declared_once_and_found() -> None:
    catalog = facts.catalog()
    assert len(catalog) >= 100
    assert kind("wait.share.IO:WALSync") is catalog["wait.share.<event>"][0]
    assert kind("lwlock.top") is catalog["lwlock.top"][0]
    assert kind("lwlock.top.LockManager") is catalog["lwlock.top.<tranche>"][0]
    assert kind("scan.seq_rows.*") is catalog["scan.seq_rows.<table>"][0]
    assert kind("no.such_fact") is None
    names = [f.name for f in facts.families()]
    assert len(names) == len(set(names)) and names[0] == "cell"


def test_a_sheet_takes_only_facts_of_the_kind_it_is_given() -> None:
    sheet = facts.FactSheet("base", 4)
    share = FactKind("x.share.<thing>", "share", "a share", "a test", ("test",))
    sheet.add(share, 0.5, "half", thing="a")
    assert sheet.facts["x.share.a"].unit == "share" and sheet.facts["x.share.a"].source == "test"
    with pytest.raises(ValueError, match="source 'elsewhere'"):
        sheet.add(share, 0.5, "half", thing="b", source="elsewhere")
    with pytest.raises(ValueError, match="unit 'furlongs'"):
        FactKind("x.y", "furlongs", "a length", "a test", ("test",))
