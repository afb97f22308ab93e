"""The words pgscope writes: plurals, plain numbers, text files without hard wraps. No server."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pgscope.words import counted, n_clients
from tests.conftest import pgscope
from tests.stores import measured_run

SRC = Path(__file__).parent.parent / "src" / "pgscope"
SWEEP = [(1, 100.0), (2, 190.0), (4, 340.0), (8, 500.0), (1, 101.0), (2, 188.0), (4, 345.0)]


@pytest.mark.parametrize(
    ("n", "expected"),
    [(1, "1 client"), (1.0, "1 client"), (0, "0 clients"), (2, "2 clients"), (64.0, "64 clients")],
)
def test_a_count_agrees_with_its_noun(n: float, expected: str) -> None:
    assert n_clients(n) == expected
    assert n_clients(None) == "every client count"
    assert counted(1, "query", "queries") == "1 query"
    assert counted(3, "query", "queries") == "3 queries"


# Counts that are never 1: the ceiling of --clients, and the USL's fitted (fractional) peak.
ALWAYS_PLURAL = ("{MAX_CLIENTS} clients", "N*≈{self.n_star:.1f} clients")


def test_no_text_builds_a_client_count_by_hand() -> None:
    """Every "{n} clients" goes through n_clients, so 1 reads "1 client"."""
    by_hand = [
        f"{path.relative_to(SRC)}:{number}: {line.strip()}"
        for path in sorted(SRC.rglob("*"))
        if path.suffix in (".py", ".j2", ".toml")
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if re.search(r"(\{[^{}]*\}|\}\}) clients\b", line)
        and not any(allowed in line for allowed in ALWAYS_PLURAL)
    ]
    assert not by_hand, "\n".join(by_hand)


def test_a_run_at_one_client_says_1_client(tmp_path: Path) -> None:
    run = measured_run(tmp_path / "20261124-000000-scaling-0000", SWEEP)
    document = pgscope("report", str(run), "--json")
    assert document.returncode == 0, document.stderr
    labels = [
        fact["label"]
        for sheet in json.loads(document.stdout)["facts"]
        for fact in sheet["facts"].values()
    ]
    assert "mean tps at 1 client" in labels
    assert "mean tps at 2 clients" in labels
    html = pgscope("report", str(run), "--format", "html")
    assert html.returncode == 0, html.stderr
    for text in (document.stdout, (run / "report.html").read_text()):
        assert not re.search(r"\b1 clients\b", text)
