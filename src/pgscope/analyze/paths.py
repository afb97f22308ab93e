"""Findings from the account of active time: follow the heavy branches down, as a DBA does
(analyze/heavy.py), and name each by the deepest node its evidence supports.

Each path is interpreted by the first cause of the catalogue whose paths trigger (its
mechanism) matches its deepest node, else one above it up to the statement
(analyze/catalogue.py): the mechanism names the cause, what would refute it and what to
try. A path no mechanism interprets is still a finding, titled from its
nodes, with the advice its node's kind gives. Its sentence names what the path went through:
the statement (query id and text), its part, the plan node and relation, the trigger, the
function, the nested statement, the lock and its holder.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pgscope.analyze import catalogue
from pgscope.analyze.account import Account, Node
from pgscope.analyze.catalogue import Mechanism
from pgscope.analyze.heavy import BRANCH, MIN_SHARE, NOT_THE_SERVERS, Path, heavy_paths

__all__ = [
    "BRANCH",
    "MIN_SAMPLES",
    "MIN_SHARE",
    "NOT_THE_SERVERS",
    "Mechanism",
    "Path",
    "Reading",
    "describe",
    "heavy_paths",
    "interpret",
    "matched_share",
    "mechanisms",
    "readings",
]

# Samples behind a path below which its finding is at most of low confidence.
MIN_SAMPLES = 50
LEVELS = ("low", "medium", "high")
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    ">=": lambda a, b: a is not None and a >= b,
    ">": lambda a, b: a is not None and a > b,
    "<=": lambda a, b: a is not None and a <= b,
    "<": lambda a, b: a is not None and a < b,
    "in": lambda a, b: a in b,
    "notin": lambda a, b: a not in b,
    "in_text": lambda a, b: isinstance(a, str) and b in a,
    "set": lambda a, _: a is not None,
    "unset": lambda a, _: a is None,
}


@dataclass(frozen=True)
class Reading:
    """A path and what it means."""

    path: Path
    mechanism: Mechanism | None
    interpreted: Node  # the node the mechanism matched (the deepest, without one)
    title: str
    sentence: str
    recommendations: list[str]
    refute: str
    confidence: str


def mechanisms() -> tuple[tuple[Mechanism, ...], dict[str, str]]:
    """The causes the account's paths trigger, in the order they are tried, and the advice
    for a path none interprets, by its deepest node (analyze/catalogue.py)."""
    found = catalogue.bundled()
    return found.mechanisms, found.node_advice


def _field(path: Path, node: Node, name: str) -> Any:
    if name == "event":
        return next((n.name for n in path.nodes if n.kind == "event"), None)
    if name == "class":
        return next((n.name for n in path.nodes if n.kind == "class"), None)
    if "." in name:
        kind, _, key = name.partition(".")
        nearest = path.nearest(kind)
        return nearest.detail.get(key) if nearest is not None else None
    return node.detail.get(name)


def _matches(mechanism: Mechanism, path: Path, node: Node) -> bool:
    if node.kind not in mechanism.node:
        return False
    return all(
        _OPS[op](_field(path, node, name), value[0] if value else None)
        for name, op, *value in mechanism.when
    )


def interpret(path: Path) -> Reading:
    found, advice = mechanisms()
    candidates = list(reversed(path.nodes[path.nodes.index(path.statement) :]))
    if path.statement is None:
        candidates = [path.deepest]
    # A function's time is its own code's: no mechanism of the plan node or statement that
    # calls it interprets it (an Index Only Scan's heap fetches are not a function's loop).
    inner = next((i for i, n in enumerate(candidates) if n.kind == "function"), None)
    if inner is not None:
        candidates = candidates[: inner + 1]
    for node in candidates:
        mechanism = next((m for m in found if _matches(m, path, node)), None)
        if mechanism is not None:
            break
    else:
        mechanism, node = None, path.deepest
    sentence = describe(path)
    if mechanism is not None:
        recommendations = [_filled(r, node.detail) for r in mechanism.recommendations]
        return Reading(
            path,
            mechanism,
            node,
            mechanism.title,
            sentence,
            recommendations,
            mechanism.refute,
            _confidence(path),
        )
    deepest = path.deepest
    key = str(deepest.detail.get("node_type") or deepest.kind)
    hint = advice.get(key) or advice.get(deepest.kind) or advice.get("statement", "")
    title = _generic_title(path)
    return Reading(
        path,
        None,
        deepest,
        title,
        sentence,
        [_filled(hint, {**deepest.detail, "event": ", ".join(path.events)})] if hint else [],
        "A plan or wait profile taken again under the same load would show the time elsewhere.",
        _confidence(path),
    )


def _confidence(path: Path) -> str:
    level = 2 if path.share >= 0.35 else 1 if path.share >= 0.15 else 0
    if path.deepest.samples < MIN_SAMPLES:
        level = min(level, 0)
    if path.deepest.kind in ("plan", "trigger", "nested"):
        executions = path.deepest.detail.get("executions")
        if isinstance(executions, int | float) and executions < 3:
            level -= 1  # a node seen in one or two sampled executions
    return LEVELS[max(0, level)]


class _Detail(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "?"


def _filled(text: str, detail: dict[str, Any]) -> str:
    values = _Detail({k: ("?" if v is None else v) for k, v in detail.items()})
    try:
        return text.format_map(values)
    except (ValueError, TypeError):  # a format for a number given text ("?")
        return text.format_map(_Detail({k: str(v) for k, v in values.items()})).replace(":,.0f", "")


def _generic_title(path: Path) -> str:
    deepest = path.deepest
    if deepest.kind == "plan":
        kind = str(deepest.detail.get("node_type"))
        return f"The statement's time goes to {'an' if kind[:1] in 'AEIOU' else 'a'} {kind}"
    if deepest.kind == "part":
        return f"The statement's time goes to its {deepest.name}"
    if deepest.kind == "statement":
        events = ", ".join(path.events)
        return f"One statement takes the time ({events})"
    if deepest.kind in ("lock", "holder"):
        lock = path.nearest("lock")
        what = lock.name if lock is not None else ", ".join(path.events)
        return f"Sessions queue for a {what} another session holds"
    if deepest.kind == "function":
        return f"The statement's time goes to the function {deepest.name.removeprefix('function ')}"
    if deepest.kind == "trigger":
        return f"The statement's time goes to the {deepest.name}"
    if deepest.kind == "nested":
        return "The statement's time goes to a statement it runs"
    return f"The time goes to {deepest.name}"


def _quoted(text: str | None, width: int = 80) -> str:
    flat = " ".join((text or "").split())
    return "`" + flat[:width] + ("…" if len(flat) > width else "") + "`"


def _statement_words(node: Node) -> str:
    text = node.detail.get("text")
    query_id = node.detail.get("query_id")
    if query_id is None:
        return node.name
    return f"query {query_id} {_quoted(str(text)) if text else '(text not kept)'}"


def describe(path: Path, share: float | None = None) -> str:
    """The path in words: its share of active time (or `share`, of several paths like it),
    then each node from the statement down."""
    words = [f"{path.share if share is None else share:.0%} of active time"]
    statement = path.statement
    if statement is None:
        return f"{words[0]}: {path.deepest.name}"
    clauses = [_statement_words(statement)]
    events = [e for e in path.events if e != "CPU"]
    if events and path.deepest.kind in ("statement", "lock", "holder"):
        clauses.append(f"waiting on {', '.join(events)}")
    below = path.nodes[path.nodes.index(statement) + 1 :]
    for node in below:
        clauses.append(_clause(node, statement))
    return f"{words[0]}: " + ", ".join(c for c in clauses if c)


def _pct(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole > 0 else "?"


def _clause(node: Node, statement: Node) -> str:
    d = node.detail
    of_statement = _pct(node.share, statement.share)
    if node.kind == "part":
        per_call = d.get("ms_per_call")
        each = f" ({per_call:.3g} ms per call)" if isinstance(per_call, float) else ""
        if d.get("part") == "jit":
            return f"which spends {of_statement} of its time compiling JIT code{each}"
        if d.get("part") == "planning":
            return f"which spends {of_statement} of its time planning{each}"
        return ""  # execution: the nodes below say where
    if node.kind == "trigger":
        return f"{of_statement} of it in the {node.name}"
    if node.kind == "nested":
        return f"which runs {_quoted(str(d.get('text')), 70)}"
    if node.kind == "function":
        calls, ms = d.get("calls_per_call"), d.get("ms_per_call")
        how = (
            f" ({calls:,.1f} calls per statement, {ms:.3g} ms each)"
            if isinstance(calls, float) and isinstance(ms, float)
            else ""
        )
        return f"{of_statement} of it in {node.name}{how}"
    if node.kind == "plan":
        return f"{of_statement} of it in {_plan_words(node)}"
    if node.kind == "lock":
        return f"waiting for a {node.name}"
    if node.kind == "holder":
        return node.name
    return node.name


def _plan_words(node: Node) -> str:
    d = node.detail
    what = str(d.get("node_type"))
    table, partition = d.get("table"), d.get("partition")
    if table:
        what += f" on {table}" + (f" (partition {partition})" if partition else "")
    if d.get("index"):
        what += f" using {d['index']}"
    facts = []
    if d.get("condition"):
        facts.append(f"filtering {d['condition']}")
    removed, rows = d.get("removed_per_execution"), d.get("rows_per_execution")
    if isinstance(removed, float) and removed >= 1 and isinstance(rows, float):
        facts.append(f"keeping {rows:,.0f} of {rows + removed:,.0f} rows per call")
    loops = d.get("loops_per_execution")
    if isinstance(loops, float) and loops >= 2:
        facts.append(f"run {loops:,.0f} times per call")
    temp = d.get("temp_kb_per_execution")
    if isinstance(temp, float) and temp > 0:
        facts.append(f"writing {temp:,.0f} kB of temporary files per call")
    if d.get("sort_method"):
        facts.append(f"sort method {d['sort_method']}")
    misestimate = d.get("misestimate")
    if isinstance(misestimate, float) and misestimate >= 100:
        facts.append(
            f"the planner expected {d.get('estimated_rows', 0):,.0f} rows per loop, "
            f"got {d.get('rows_per_loop', 0):,.0f}"
        )
    ms = d.get("ms_per_execution")
    if isinstance(ms, float):
        facts.append(f"{ms:.3g} ms per call")
    return what + (f" ({'; '.join(facts)})" if facts else "")


def matched_share(account: Account, ids: set[str]) -> float | None:
    """The share of the account's active time at the nodes the mechanisms `ids` interpret,
    each counted once (not again below a node already matched); None where the account has
    no node of a kind they interpret (no plan was sampled, say): then it cannot tell."""
    found = [m for m in mechanisms()[0] if m.id in ids]
    kinds = {k for m in found for k in m.node}
    every = account.root.walk()
    if not any(nodes[-1].kind in kinds for nodes in every):
        return None
    matched = [
        nodes
        for nodes in every
        if any(_matches(m, Path(nodes, nodes[-1].share, ()), nodes[-1]) for m in found)
    ]

    def below(inner: tuple[Node, ...], outer: tuple[Node, ...]) -> bool:
        return len(outer) < len(inner) and all(a is b for a, b in zip(outer, inner, strict=False))

    return sum(nodes[-1].share for nodes in matched if not any(below(nodes, o) for o in matched))


def readings(account: Account, limit: int = 5) -> list[Reading]:
    """The account's heaviest paths, interpreted, heaviest first."""
    return [interpret(p) for p in heavy_paths(account)[:limit]]
