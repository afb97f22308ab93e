"""What a planted cause leaves in a run, read from its JSON document: the proof a live run
gives (tests/test_findings.py, tests/record.py before it keeps a recording). A finding's rank
is not evidence here: it moves with the host's load and is proven on the recording.

Two kinds, each read at the cell of the case's largest client count (of one variant):
- `Fact`: a fact of that cell's sheet lies within bounds;
- `Spent`: the cell's account of active time holds at least a share of it along nodes whose
  names hold the given words, in order (a wait, a statement, a plan node, a lock's holder).
Margins are wide: about half what a quiet host recorded, or a bound the mechanism sets."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Fact:
    """A fact of the cell within [at_least, at_most]."""

    name: str
    at_least: float | None = None
    at_most: float | None = None
    variant: str | None = None  # None: the run's first variant

    def __post_init__(self) -> None:
        assert self.at_least is not None or self.at_most is not None, self.name


@dataclass(frozen=True)
class Spent:
    """At least `at_least` of the cell's active time along nodes named with `words`, in
    order from the root down (case-insensitive substrings)."""

    words: tuple[str, ...]
    at_least: float
    variant: str | None = None


Evidence = Fact | Spent


def _variant(doc: dict[str, Any], wanted: str | None) -> str:
    variants = [s["variant"] for s in doc["facts"] if s["variant"]]
    assert variants, "the run has no fact sheet of a variant"
    if wanted is None:
        return str(variants[0])
    assert wanted in variants, (wanted, sorted(set(variants)))
    return wanted


def _largest(items: list[dict[str, Any]], variant: str) -> dict[str, Any]:
    cells = [i for i in items if i["variant"] == variant and i.get("clients") is not None]
    assert cells, f"no cell of variant {variant}"
    return max(cells, key=lambda i: i["clients"])


def _spent(node: dict[str, Any], words: tuple[str, ...]) -> Iterator[float]:
    """The shares of the shallowest nodes below `node` that complete `words` in order."""
    for child in node.get("children", []):
        rest = words
        if rest[0].lower() in str(child["name"]).lower():
            rest = rest[1:]
        if not rest:
            yield float(child["share"])
        else:
            yield from _spent(child, rest)


def shortfalls(doc: dict[str, Any], evidence: tuple[Evidence, ...]) -> list[str]:
    """What of `evidence` the run does not show, a line each with what it showed instead."""
    missing = []
    for item in evidence:
        variant = _variant(doc, item.variant)
        if isinstance(item, Fact):
            sheet = _largest([s for s in doc["facts"] if s["variant"]], variant)
            fact = sheet["facts"].get(item.name)
            value = None if fact is None else fact["value"]
            low = item.at_least if item.at_least is not None else float("-inf")
            high = item.at_most if item.at_most is not None else float("inf")
            if value is None or not low <= value <= high:
                where = f"{variant} at {sheet['clients']} clients"
                missing.append(f"{item.name} = {value} ({where}), wanted [{low}, {high}]")
        else:
            cells = [a for a in doc["accounts"] if a["scope"] == "cell"]
            account = _largest(cells, variant)
            share = sum(_spent(account["root"], item.words))
            if share < item.at_least:
                where = f"{variant} at {account['clients']} clients"
                missing.append(
                    f"active time along {' > '.join(item.words)}: {share:.3f} ({where}), "
                    f"wanted at least {item.at_least}"
                )
    return missing
