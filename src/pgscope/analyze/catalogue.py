"""The catalogue of causes (causes.toml): what the diagnosis can name, each cause declared
once (its id, title, refutation and advice), loaded once and checked as it loads.

A cause is triggered by facts (a rule: the facts it scores and requires, analyze/diagnose.py
judges them), by the account's heavy paths (a mechanism: the nodes it interprets,
analyze/paths.py matches them), or by both. Every name a cause uses is declared somewhere
else, once, and checked here: the facts it names (analyze/facts/, each family's `FactKind`s),
the member of a set of facts it names (`wait.share.<event>`: a wait event PostgreSQL has,
`lwlock.top.<tranche>`: an LWLock tranche), the node details its conditions test and its
advice reads (analyze/details.py), the values it compares them with where they are a closed
set (a plan node type, a wait event), and the other causes it supersedes. A name declared
nowhere fails loading with the cause's id and the name, so a misspelt name fails the fast
tests instead of never matching.
"""

from __future__ import annotations

import re
import string
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from pgscope.analyze.details import (
    DETAILS,
    LOCK_TAGS,
    NODE_KINDS,
    NODE_TYPES,
    PATH_FIELDS,
    WAIT_CLASSES,
    lwlock_tranches,
    wait_events,
)
from pgscope.analyze.facts import kind

__all__ = [
    "Advice",
    "Catalogue",
    "CatalogueError",
    "Mechanism",
    "Rule",
    "bundled",
    "check",
    "parse",
]

# The ops a rule's condition compares a fact with.
FACT_OPS = (">=", ">", "<=", "<")
# The ops a mechanism's condition compares a path's field with: == != >= > <= < in notin,
# in_text (the value is part of the field's text), set (the field has a value), unset.
PATH_OPS = ("==", "!=", ">=", ">", "<=", "<", "in", "notin", "in_text", "set", "unset")
# The node kinds a mechanism may interpret (the root and a class are never a path's end).
INTERPRETED_KINDS = tuple(k for k in NODE_KINDS if k not in ("active", "class"))
# The causes of failed transactions (the members of `xact.cause.<kind>`, analyze/facts/
# failures.py).
FAILURE_CAUSES = frozenset({"serialization", "deadlock", "other", "workload_error"})
# Facts quoted in a rule's advice: "{wal.fpi_byte_share}".
FACT_IN_TEXT = re.compile(r"\{([a-z_]+(?:\.[A-Za-z0-9_:]+)+)\}")


# Advice per name a rule's title takes: texts, or tables {text, unless}.
Advice = dict[str, list[str | dict[str, Any]]]


class CatalogueError(ValueError):
    """The catalogue names something declared nowhere: each problem names its cause."""


@dataclass(frozen=True)
class Rule:
    """A cause's facts trigger."""

    id: str
    title: str
    score: list[str]
    medium: float
    high: float
    evidence: list[str]
    refute: str
    # Each: a text, or a table {text, unless}: advice the run already follows (its `unless`
    # holds on the cell's facts) is left out. "{fact.name}" in a text reads as the measured
    # value ("not measured" when the run lacks it).
    recommendations: list[str | dict[str, Any]]
    scope: str = "variant"
    require: list[list[Any]] = field(default_factory=list)
    weaken: list[list[Any]] = field(default_factory=list)
    unless: list[list[Any]] = field(default_factory=list)
    name_from: str | None = None
    symptom: bool = False
    # The finding is about work thrown away (transactions that fail), not work slowed: among
    # findings of the same confidence it comes first, since a commit that waits still commits.
    lost_work: bool = False
    # "{name}" is this fact's label (a cause, in words); its name's suffix picks the advice
    quote_from: str | None = None
    # Findings of other rules that say the same thing less specifically ("id", or "id:name"
    # for a rule whose title has a {name}): dropped on a variant where this rule fires.
    supersedes: list[str] = field(default_factory=list)
    # What would refute it in an observation, where `refute` speaks of pgbench's own record.
    refute_observed: str | None = None


@dataclass(frozen=True)
class Mechanism:
    """A cause's paths trigger."""

    id: str
    node: list[str]
    title: str
    refute: str
    recommendations: list[str]
    when: list[list[Any]] = field(default_factory=list)
    supersedes: list[str] = field(default_factory=list)
    rule: str | None = None
    # Mechanisms naming one cause from different nodes (a join's scan and the join itself):
    # their paths in one statement are one finding.
    group: str | None = None


@dataclass(frozen=True)
class Catalogue:
    rules: tuple[Rule, ...]  # the causes facts trigger, in the order they are judged
    mechanisms: tuple[Mechanism, ...]  # the causes paths trigger, the first match wins
    # Advice per name a rule's title takes (an LWLock tranche, a cause of failure, the caller
    # of a CPU hot spot), put first in its recommendations.
    advice: Advice
    # Advice for a heavy path no mechanism interprets, by its deepest node's type or kind.
    node_advice: dict[str, str]


# Per advice table: the set its keys are members of (None: open, a function's name).
ADVICE_TABLES: dict[str, Callable[[], frozenset[str]] | None] = {
    "lwlock_advice": lwlock_tranches,
    "cause_advice": lambda: FAILURE_CAUSES,
    "caller_advice": None,
}


# The keys a cause, its facts trigger and its paths trigger take.
CAUSE_KEYS = frozenset(
    {
        "id",
        "title",
        "refute",
        "refute_observed",
        "recommendations",
        "supersedes",
        "symptom",
        "lost_work",
        "facts",
        "paths",
    }
)
FACTS_KEYS = frozenset(
    {
        "scope",
        "score",
        "require",
        "weaken",
        "unless",
        "medium",
        "high",
        "evidence",
        "name_from",
        "quote_from",
    }
)
PATHS_KEYS = frozenset({"node", "when", "group", "title", "refute", "recommendations"})
# What only a facts trigger's finding reads.
FACTS_ONLY = ("refute_observed", "symptom", "lost_work")


def parse(text: str) -> Catalogue:
    """The catalogue from its declaration (causes.toml's text), checked."""
    data = tomllib.loads(text)
    rules: list[Rule] = []
    mechanisms: list[Mechanism] = []
    problems: list[str] = []
    ids = [str(entry.get("id", "?")) for entry in data.get("causes", [])]
    problems += [f"cause {i}: declared twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
    for entry in data.get("causes", []):
        cause = str(entry.get("id", "?"))
        facts, paths = entry.get("facts"), entry.get("paths")
        problems += [
            f"cause {cause}: {where}key {key} means nothing"
            for where, keys, known in (
                ("", entry, CAUSE_KEYS),
                ("[facts] ", facts or {}, FACTS_KEYS),
                ("[paths] ", paths or {}, PATHS_KEYS),
            )
            for key in keys
            if key not in known
        ]
        if facts is None and paths is None:
            problems.append(f"cause {cause}: no facts or paths trigger it")
        if facts is None:
            problems += [
                f"cause {cause}: {key} is read only with a facts trigger"
                for key in FACTS_ONLY
                if key in entry
            ]
        try:
            if facts is not None:
                rules.append(_rule(entry, facts))
            if paths is not None:
                mechanisms.append(_mechanism(entry, paths, facts is not None))
        except (KeyError, TypeError) as e:
            problems.append(f"cause {cause}: {type(e).__name__} {e}")
    if problems:
        raise CatalogueError("the catalogue of causes is malformed: " + "; ".join(problems))
    advice_tables = {t: data.get(t, {}) for t in ADVICE_TABLES}
    found = Catalogue(
        tuple(rules),
        tuple(mechanisms),
        {k: list(v) for table in advice_tables.values() for k, v in table.items()},
        dict(data.get("node_advice", {})),
    )
    check(found, advice_tables)
    return found


def _rule(cause: dict[str, Any], facts: dict[str, Any]) -> Rule:
    """A cause's facts trigger."""
    own = {k: cause[k] for k in ("id", "title", "refute", "recommendations") if k in cause}
    shared = {k: cause[k] for k in (*FACTS_ONLY, "supersedes") if k in cause}
    fields = {k: v for k, v in facts.items() if k in FACTS_KEYS}
    return Rule(**own, **shared, **fields)


def _mechanism(cause: dict[str, Any], paths: dict[str, Any], with_facts: bool) -> Mechanism:
    """A cause's paths trigger: what its path's finding says is the cause's, unless it says
    otherwise."""
    kinds = paths["node"]
    return Mechanism(
        id=cause["id"],
        node=[kinds] if isinstance(kinds, str) else list(kinds),
        title=paths.get("title", cause["title"]),
        refute=paths.get("refute", cause["refute"]),
        recommendations=list(paths.get("recommendations", cause["recommendations"])),
        when=list(paths.get("when", [])),
        supersedes=list(cause.get("supersedes", [])),
        rule=cause["id"] if with_facts else None,
        group=paths.get("group"),
    )


@cache
def bundled() -> Catalogue:
    """The catalogue pgscope ships."""
    return parse(resources.files("pgscope.analyze").joinpath("causes.toml").read_text())


def check(catalogue: Catalogue, advice_tables: dict[str, dict[str, Any]] | None = None) -> None:
    """Raise CatalogueError naming every cause that uses a name declared nowhere."""
    problems = [
        *_duplicates(catalogue),
        *(f"cause {r.id}: {p}" for r in catalogue.rules for p in _rule_problems(r)),
        *(
            f"cause {m.id}: {p}"
            for m in catalogue.mechanisms
            for p in _mechanism_problems(m, catalogue)
        ),
        *_supersedes_problems(catalogue),
        *_advice_problems(advice_tables or {}),
        *_node_advice_problems(catalogue.node_advice),
    ]
    if problems:
        raise CatalogueError(
            "the catalogue of causes names what is declared nowhere (facts: analyze/facts/, "
            "node details and wait events: analyze/details.py): " + "; ".join(problems)
        )


def _duplicates(catalogue: Catalogue) -> Iterator[str]:
    for what, ids in (
        ("facts trigger", [r.id for r in catalogue.rules]),
        ("paths trigger", [m.id for m in catalogue.mechanisms]),
    ):
        for twice in sorted({i for i in ids if ids.count(i) > 1}):
            yield f"cause {twice}: declared twice ({what})"


def named_facts(rule: Rule) -> list[str]:
    """Every fact a rule names: what it scores, requires, is weakened or ruled out by, shows,
    takes its title from, and what its advice quotes or is left out for."""
    names = [*rule.score, *rule.evidence]
    names += [cond[0] for cond in (*rule.require, *rule.weaken, *rule.unless)]
    names += [n for n in (rule.name_from, rule.quote_from) if n is not None]
    names += _advice_facts(rule.recommendations)
    return names


def _advice_facts(entries: list[str | dict[str, Any]]) -> list[str]:
    names = []
    for entry in entries:
        text = entry if isinstance(entry, str) else entry["text"]
        names += FACT_IN_TEXT.findall(text)
        if not isinstance(entry, str):
            names += [cond[0] for cond in entry.get("unless", [])]
    return names


def _set_members() -> dict[str, frozenset[str]]:
    """Per set of facts (its name's prefix), the things its members may name, where they are
    a closed set: a table's or a function's name is not."""
    events, tranches = wait_events(), lwlock_tranches()
    return {
        "wait.share.": events,
        "wait.class.": WAIT_CLASSES,
        "wait.growth.": WAIT_CLASSES,
        "wait.lwlock_top.": tranches,
        "lwlock.top.": tranches,
        "lwlock.share.": tranches,
        "lwlock.mean_us.": tranches,
        "lwlock.waits_per_xact.": tranches,
        "lock.share.": LOCK_TAGS,
        "lock.mean_us.": LOCK_TAGS,
        "lock.waits_per_xact.": LOCK_TAGS,
        "xact.cause.": FAILURE_CAUSES,
    }


def _fact_problems(names: list[str]) -> Iterator[str]:
    members = _set_members()
    for name in dict.fromkeys(names):
        declared = kind(name)
        if declared is None:
            yield f"fact {name} is declared by no family (analyze/facts/)"
        elif declared.named and not name.endswith(".*"):
            member = name[len(declared.prefix) :]
            known = members.get(declared.prefix)
            if known is not None and member not in known:
                yield f"fact {name}: {member} is no member of {declared.name}"


def _rule_problems(rule: Rule) -> Iterator[str]:
    yield from _fact_problems(named_facts(rule))
    for cond in (*rule.require, *rule.weaken, *rule.unless):
        if cond[1] not in FACT_OPS:
            yield f"condition on {cond[0]}: op {cond[1]!r} is not one of {', '.join(FACT_OPS)}"
    if rule.scope not in ("variant", "run"):
        yield f"scope {rule.scope!r} is not variant or run"


def _detail(kind_: str, name: str) -> Any:
    return DETAILS.get(kind_, {}).get(name)


def _mechanism_problems(m: Mechanism, catalogue: Catalogue) -> Iterator[str]:
    for node_kind in m.node:
        if node_kind not in INTERPRETED_KINDS:
            yield f"node kind {node_kind} is none of {', '.join(INTERPRETED_KINDS)}"
    kinds = [k for k in m.node if k in INTERPRETED_KINDS]
    for name, op, *value in m.when:
        if op not in PATH_OPS:
            yield f"condition on {name}: op {op!r} is not one of {', '.join(PATH_OPS)}"
            continue
        values: frozenset[str] | None = None
        if name in PATH_FIELDS:
            values = wait_events() if name == "event" else WAIT_CLASSES
        elif "." in name:
            node_kind, _, key = name.partition(".")
            declared = _detail(node_kind, key)
            if node_kind not in NODE_KINDS:
                yield f"condition on {name}: {node_kind} is no node kind"
                continue
            if declared is None:
                yield f"node detail {key} is not declared for {node_kind} nodes"
                continue
            values = declared.values
        else:
            missing = [k for k in kinds if _detail(k, name) is None]
            if missing:
                yield f"node detail {name} is not declared for {', '.join(missing)} nodes"
                continue
            values = _detail(kinds[0], name).values if kinds else None
        if values is None:
            continue
        compared = value[0] if op in ("in", "notin") else [value[0]] if op in ("==", "!=") else []
        for v in compared:
            if isinstance(v, str) and v not in values:
                yield f"condition on {name}: {v} is not a value it takes"
    for name in _placeholders(m.recommendations):
        missing = [k for k in kinds if _detail(k, name) is None]
        if missing:
            yield f"advice reads node detail {name}, not declared for {', '.join(missing)} nodes"
    if m.rule is not None and m.rule not in {r.id for r in catalogue.rules}:
        yield f"rule {m.rule} is no cause with a facts trigger"


def _placeholders(texts: list[str]) -> list[str]:
    """The "{x}" a text reads (its field names, without format specs)."""
    found = []
    for text in texts:
        for _, name, _, _ in string.Formatter().parse(text):
            if name:
                found.append(name)
    return found


def _supersedes_problems(catalogue: Catalogue) -> Iterator[str]:
    rules = {r.id: r for r in catalogue.rules}
    members = _set_members()
    both: list[Rule | Mechanism] = [*catalogue.mechanisms, *catalogue.rules]
    for cause in {c.id: c for c in both}.values():
        for target in cause.supersedes:
            other_id, colon, name = target.partition(":")
            other = rules.get(other_id)
            if other is None:
                yield f"cause {cause.id}: supersedes {other_id}, no cause with a facts trigger"
                continue
            if other_id == cause.id:
                yield f"cause {cause.id}: supersedes itself"
            if not colon:
                continue
            if "{name}" not in other.title or other.name_from is None:
                yield (
                    f"cause {cause.id}: supersedes {target}, but {other_id}'s title names "
                    "nothing from a set"
                )
                continue
            declared = kind(other.name_from)
            if declared is None:
                continue  # the target's own problem
            known = members.get(declared.prefix)
            if known is not None and name not in known:
                yield (
                    f"cause {cause.id}: supersedes {target}: {name} is no member of {declared.name}"
                )


def _advice_problems(tables: dict[str, dict[str, Any]]) -> Iterator[str]:
    for table, entries in tables.items():
        known = ADVICE_TABLES[table]
        members = known() if known is not None else None
        for key, advice in entries.items():
            if members is not None and key not in members:
                yield f"{table}: {key} names nothing it is advice for"
            for p in _fact_problems(_advice_facts(list(advice))):
                yield f"{table}.{key}: {p}"


def _node_advice_problems(advice: dict[str, str]) -> Iterator[str]:
    for key, text in advice.items():
        node_kind = "plan" if key in NODE_TYPES else key if key in NODE_KINDS else None
        if node_kind is None:
            yield f"node_advice: {key} is no plan node type or node kind"
            continue
        for name in _placeholders([text]):
            if name not in PATH_FIELDS and _detail(node_kind, name) is None:
                yield f"node_advice.{key}: node detail {name} is not declared for {node_kind} nodes"
