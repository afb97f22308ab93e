"""Actual plans sampled while the load ran (auto_explain, the statements collector's
`plan_samples`), summed per statement: where its execution time went, node by node (each
node's own time, without its children's), to which triggers, and to the statements nested in
it (a function's, a trigger's, a foreign key's check), each with its own nodes.

A node's own time is its total time over its loops less its children's; a plan's duration is
the whole execution, triggers included (they run after the plan's nodes), planning not.

On a server pgscope did not start nothing samples actual plans: the explain collector keeps
the estimated plans of the heaviest statements (`plan_estimates`, EXPLAIN without ANALYZE).
`read_estimated` reads them as the same nodes, each node's own time standing for its
estimated own cost (its total cost over its estimated loops less its children's), so the
account can split a statement's execution by where the planner expects it to go; the nodes
of such a plan count no actual rows, so nothing is said of rows a filter threw away.
Pure functions of the store.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import duckdb

from pgscope.analyze.queryid import QueryId

# A column a filter reads through a cast or a function: `((code)::numeric = ...)`,
# `(lower((email)::text) = ...)`. Such a filter cannot use a plain index on the column.
_CAST_COLUMN = re.compile(
    r"\(\(?(?:\w+\.)?(?P<column>[a-z_]\w*)\)?::(?P<type>\w+(?: \w+)*?(?:\[\])?)[ )]"
)
_FUNCTION_OF_COLUMN = re.compile(r"\b(?P<function>\w+)\(\(?(?:\w+\.)?(?P<column>\w+)\)?[,)]")
# A column in a condition: a name (perhaps after its table's alias) not after `::` (a type),
# not before `(` (a function), not a parameter, a literal or a keyword.
_NAME = re.compile(r"(?<![:$'\w.])(?:([a-z_]\w*)\.)?([a-z_]\w*)\b(?![.(])")
_KEYWORDS = frozenset(
    {
        *("and", "or", "not", "is", "null", "true", "false", "any", "all", "array", "in"),
        *("like", "ilike", "between", "distinct", "from", "operator", "pg_catalog"),
        *("text", "numeric", "integer", "bigint"),
    }
)
_LITERAL = re.compile(r"'(?:[^']|'')*'|\$\d+|\b\d+(?:\.\d+)?\b")


@dataclass(frozen=True)
class PlanNode:
    """One node of a statement's plan, summed over the sampled executions that had it."""

    position: str  # its place in the plan: "0", "0.1", "0.1.0" (the root is "0")
    node_type: str  # "Seq Scan", "Sort", "Hash Join", ...
    relation: str | None  # the table it reads (schema-qualified outside public)
    index: str | None
    condition: str | None  # its filter (Filter, Join Filter, Hash Cond...), as EXPLAIN says
    index_condition: str | None
    self_ms: float  # its own time, children's left out, over all loops and executions
    loops: float
    rows: float  # rows it returned, over all loops
    removed: float  # rows its filter (or join filter, or index recheck) threw away
    estimated_rows: float  # the planner's estimate per loop
    shared_read: float  # blocks read into shared buffers (not found there)
    shared_hit: float
    temp_written: float  # temporary file blocks written
    sort_method: str | None
    sort_space_kb: float | None
    sort_space_type: str | None  # "Memory" or "Disk"
    heap_fetches: float  # index-only scans that had to visit the heap
    lossy_blocks: float  # bitmap heap scans that lost exactness (work_mem)
    hash_batches: float  # hash tables split to disk (more than 1)
    executions: int  # sampled executions that had it
    above: str = ""  # the node types above it, outermost first: "Limit > Sort"
    sort_key: str | None = None  # the nearest Sort above it (or its own): its key
    output: str | None = None  # what it computes (EXPLAIN VERBOSE's Output), where logged
    partitions: int = 1  # the partitions of one table it stands for (the account's grouping)
    join_condition: str | None = None  # the nearest join above it: its condition
    alias: str | None = None  # the name its relation has in the statement
    input_rows: float = 0.0  # rows its children gave it, over all loops

    @property
    def removed_share(self) -> float:
        """Of the rows its filter saw, the share it threw away."""
        seen = self.rows + self.removed
        return self.removed / seen if seen > 0 else 0.0

    @property
    def casts(self) -> tuple[str, str] | None:
        """(column, type) where its condition reads a column through a cast."""
        found = _CAST_COLUMN.search(self.condition or "")
        return (found["column"], found["type"]) if found else None

    @property
    def function_of_column(self) -> tuple[str, str] | None:
        """(function, column) where its condition applies a function to a column."""
        for found in _FUNCTION_OF_COLUMN.finditer(self.condition or ""):
            if found["function"].lower() not in ("any", "all", "array"):
                return found["function"], found["column"]
        return None

    @property
    def columns(self) -> list[str]:
        """The columns of its own relation its condition reads: unqualified, or qualified by
        its alias (a correlated subquery's `u.id` is the outer query's column)."""
        text = re.sub(r"'(?:[^']|'')*'", "''", self.condition or "")
        own = (None, "", self.alias, self.relation)
        return list(
            dict.fromkeys(
                c for q, c in _NAME.findall(text) if c not in _KEYWORDS and (q or None) in own
            )
        )


@dataclass(frozen=True)
class TriggerTime:
    name: str
    constraint: str | None  # a foreign key's (RI_ConstraintTrigger_*) or constraint trigger's
    relation: str | None
    ms: float
    calls: float


@dataclass(frozen=True)
class NestedPlans:
    """A statement nested in the sampled executions (in a trigger, a function, a check)."""

    shape: str  # its text with constants and parameters as '?' (how executions are grouped)
    text: str
    function: str | None  # the PL/pgSQL function it ran in, where the log's context says
    executions: int
    duration_ms: float
    nodes: list[PlanNode]


@dataclass(frozen=True)
class StatementPlans:
    """A top-level statement's sampled executions, summed."""

    query_id: QueryId
    executions: int
    duration_ms: float  # their whole executions (nodes and triggers)
    nodes: list[PlanNode]  # most own time first
    triggers: list[TriggerTime] = field(default_factory=list)
    jit_ms: float = 0.0
    nested: list[NestedPlans] = field(default_factory=list)
    text: str = ""  # one execution's text, with its constants
    # An estimated plan (EXPLAIN without ANALYZE): node times are estimated costs, in the
    # planner's units; only their proportions mean anything.
    estimated: bool = False

    @property
    def node_ms(self) -> float:
        return sum(n.self_ms for n in self.nodes)

    @property
    def trigger_ms(self) -> float:
        return sum(t.ms for t in self.triggers)


def shape(text: str) -> str:
    """A statement's text with constants and parameters as '?', spaces folded: the same
    statement with other values has the same shape."""
    return " ".join(_LITERAL.sub("?", text).split()).lower()


def _relation(node: dict[str, Any]) -> str | None:
    name = node.get("Relation Name")
    if not name:
        return None
    schema = node.get("Schema")
    return f"{schema}.{name}" if schema and schema != "public" else str(name)


def _condition(node: dict[str, Any]) -> str | None:
    for key in ("Filter", "Join Filter", "Hash Cond", "Merge Cond", "Recheck Cond"):
        if node.get(key):
            return str(node[key])
    return None


def _nodes(
    plan: dict[str, Any], position: str = "0", above: tuple[dict[str, Any], ...] = ()
) -> Iterable[tuple[str, dict[str, Any], float, tuple[dict[str, Any], ...]]]:
    """Each node, its position, its own time in ms over its loops, and the nodes above it."""
    loops = float(plan.get("Actual Loops") or 0)
    total = float(plan.get("Actual Total Time") or 0) * loops
    children = plan.get("Plans") or []
    below = sum(
        float(c.get("Actual Total Time") or 0) * float(c.get("Actual Loops") or 0) for c in children
    )
    yield position, plan, max(0.0, total - below), above
    for i, child in enumerate(children):
        yield from _nodes(child, f"{position}.{i}", (*above, plan))


def _node(
    position: str, node: dict[str, Any], own_ms: float, above: tuple[dict[str, Any], ...] = ()
) -> PlanNode:
    loops = float(node.get("Actual Loops") or 0)
    removed = sum(
        float(node.get(k) or 0)
        for k in (
            "Rows Removed by Filter",
            "Rows Removed by Join Filter",
            "Rows Removed by Index Recheck",
        )
    )
    return PlanNode(
        position=position,
        node_type=str(node.get("Node Type", "?")),
        relation=_relation(node),
        index=node.get("Index Name"),
        condition=_condition(node),
        index_condition=node.get("Index Cond"),
        self_ms=own_ms,
        loops=loops,
        rows=float(node.get("Actual Rows") or 0) * loops,
        removed=removed * loops,
        estimated_rows=float(node.get("Plan Rows") or 0),
        shared_read=float(node.get("Shared Read Blocks") or 0),
        shared_hit=float(node.get("Shared Hit Blocks") or 0),
        temp_written=float(node.get("Temp Written Blocks") or 0),
        sort_method=node.get("Sort Method"),
        sort_space_kb=node.get("Sort Space Used"),
        sort_space_type=node.get("Sort Space Type"),
        heap_fetches=float(node.get("Heap Fetches") or 0) * loops,
        lossy_blocks=float(node.get("Lossy Heap Blocks") or 0),
        hash_batches=float(node.get("Hash Batches") or 0),
        executions=1,
        above=" > ".join(str(a.get("Node Type")) for a in above),
        sort_key=next(
            (
                ", ".join(map(str, a["Sort Key"]))
                for a in (node, *reversed(above))
                if a.get("Sort Key")
            ),
            None,
        ),
        output=", ".join(map(str, node["Output"])) if node.get("Output") else None,
        alias=node.get("Alias"),
        input_rows=sum(
            float(c.get("Actual Rows") or 0) * float(c.get("Actual Loops") or 0)
            for c in node.get("Plans") or []
        ),
        join_condition=next(
            (
                str(a.get("Hash Cond") or a.get("Merge Cond") or a.get("Join Filter"))
                for a in reversed(above)
                if a.get("Hash Cond") or a.get("Merge Cond") or a.get("Join Filter")
            ),
            None,
        ),
    )


def _summed(nodes: list[PlanNode]) -> list[PlanNode]:
    """Nodes of several executions added up, by place and kind."""
    by_key: dict[tuple[str, str, str | None], PlanNode] = {}
    for n in nodes:
        key = (n.position, n.node_type, n.relation)
        was = by_key.get(key)
        if was is None:
            by_key[key] = n
            continue
        by_key[key] = replace(
            was,
            self_ms=was.self_ms + n.self_ms,
            loops=was.loops + n.loops,
            rows=was.rows + n.rows,
            input_rows=was.input_rows + n.input_rows,
            removed=was.removed + n.removed,
            shared_read=was.shared_read + n.shared_read,
            shared_hit=was.shared_hit + n.shared_hit,
            temp_written=was.temp_written + n.temp_written,
            heap_fetches=was.heap_fetches + n.heap_fetches,
            lossy_blocks=was.lossy_blocks + n.lossy_blocks,
            hash_batches=max(was.hash_batches, n.hash_batches),
            sort_space_kb=max(was.sort_space_kb or 0, n.sort_space_kb or 0) or None,
            sort_space_type="Disk"
            if "Disk" in (was.sort_space_type, n.sort_space_type)
            else was.sort_space_type,
            executions=was.executions + 1,
        )
    return sorted(by_key.values(), key=lambda n: -n.self_ms)


def plan_nodes(document: dict[str, Any]) -> list[PlanNode]:
    plan = document.get("Plan")
    if not isinstance(plan, dict):
        return []
    return [_node(p, n, ms, above) for p, n, ms, above in _nodes(plan)]


def _estimated(
    plan: dict[str, Any],
    position: str = "0",
    above: tuple[dict[str, Any], ...] = (),
    loops: float = 1.0,
) -> Iterable[tuple[str, dict[str, Any], float, tuple[dict[str, Any], ...], float]]:
    """Each node of an estimated plan, its position, its own estimated cost over its
    estimated loops, the nodes above it, and those loops: a Nested Loop's inner side runs once
    per row of its outer side, every other child once per run of its parent."""
    children = plan.get("Plans") or []
    child_loops = [
        loops * max(1.0, float(children[0].get("Plan Rows") or 1))
        if i == 1 and plan.get("Node Type") == "Nested Loop"
        else loops
        for i in range(len(children))
    ]
    below = sum(
        float(c.get("Total Cost") or 0) * n / loops
        for c, n in zip(children, child_loops, strict=True)
    )
    own = max(0.0, float(plan.get("Total Cost") or 0) - below) * loops
    yield position, plan, own, above, loops
    for i, (child, n) in enumerate(zip(children, child_loops, strict=True)):
        yield from _estimated(child, f"{position}.{i}", (*above, plan), n)


def estimated_nodes(document: Any) -> list[PlanNode]:
    """The nodes of an estimated plan (EXPLAIN without ANALYZE's JSON document, or the list
    EXPLAIN returns), most estimated own cost first: `self_ms` holds the cost, `rows` and
    `input_rows` the planner's row estimates over the estimated loops."""
    if isinstance(document, list):
        document = document[0] if document and isinstance(document[0], dict) else {}
    plan = document.get("Plan")
    if not isinstance(plan, dict):
        return []
    out = []
    for position, node, cost, above, loops in _estimated(plan):
        rows = float(node.get("Plan Rows") or 0)
        out.append(
            replace(
                _node(position, node, cost, above),
                loops=loops,
                rows=rows * loops,
                input_rows=sum(float(c.get("Plan Rows") or 0) for c in node.get("Plans") or [])
                * loops,
            )
        )
    return sorted(out, key=lambda n: -n.self_ms)


def read_estimated(db: duckdb.DuckDBPyConnection) -> dict[int, StatementPlans]:
    """The estimated plans the explain collector kept (`plan_estimates`), per statement: the
    latest of each. An estimate stands for the statement whatever window it was asked in."""
    rows = db.execute(
        "SELECT queryid, query_text, plan FROM plan_estimates "
        "WHERE plan IS NOT NULL AND queryid IS NOT NULL "
        "QUALIFY row_number() OVER (PARTITION BY queryid ORDER BY ts_us DESC) = 1"
    ).fetchall()
    out: dict[int, StatementPlans] = {}
    for queryid, text, plan in rows:
        try:
            document = json.loads(plan)
        except json.JSONDecodeError:
            continue
        nodes = estimated_nodes(document)
        if not nodes:
            continue
        out[int(queryid)] = StatementPlans(
            query_id=int(queryid),
            executions=1,
            duration_ms=sum(n.self_ms for n in nodes),
            nodes=nodes,
            text=text or "",
            estimated=True,
        )
    return out


def in_ms(plans: StatementPlans, ms_per_call: float | None) -> StatementPlans:
    """An estimated plan with its nodes' costs as milliseconds of one call: each node's share
    of the plan's cost times `ms_per_call` (a call's execution time, as pg_stat_statements
    measured it). Without it the costs are kept (only their proportions are read)."""
    whole = plans.node_ms
    if not plans.estimated or ms_per_call is None or whole <= 0:
        return plans
    scale = ms_per_call / whole
    return replace(
        plans,
        duration_ms=ms_per_call,
        nodes=[replace(n, self_ms=n.self_ms * scale) for n in plans.nodes],
    )


def _triggers(documents: list[dict[str, Any]]) -> list[TriggerTime]:
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    about: dict[str, tuple[str | None, str | None]] = {}
    for document in documents:
        for t in document.get("Triggers") or []:
            name = str(t.get("Trigger Name", "?"))
            by_name[name][0] += float(t.get("Time") or 0)
            by_name[name][1] += float(t.get("Calls") or 0)
            about[name] = (t.get("Constraint Name"), t.get("Relation"))
    return sorted(
        (TriggerTime(n, about[n][0], about[n][1], ms, calls) for n, (ms, calls) in by_name.items()),
        key=lambda t: -t.ms,
    )


def read(db: duckdb.DuckDBPyConnection, step_ids: set[int]) -> dict[int, StatementPlans]:
    """The sampled plans of these steps, per top-level statement (by query id)."""
    if not step_ids:
        return {}
    rows = db.execute(
        "SELECT queryid, step_id, execution, nested, duration_ms, query_text, context, plan "
        "FROM plan_samples WHERE step_id IN (SELECT unnest(?::INTEGER[])) AND queryid IS NOT NULL "
        "ORDER BY step_id, execution, nested DESC, ts_us",
        [sorted(step_ids)],
    ).fetchall()
    top: dict[int, list[tuple[float, str, dict[str, Any]]]] = defaultdict(list)
    nested: dict[int, dict[str, list[tuple[float, str, str, dict[str, Any]]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for queryid, _step, _execution, is_nested, ms, text, context, plan in rows:
        document = json.loads(plan)
        if is_nested:
            nested[int(queryid)][shape(text or "")].append(
                (float(ms), text or "", context or "", document)
            )
        else:
            top[int(queryid)].append((float(ms), text or "", document))
    out: dict[int, StatementPlans] = {}
    for queryid, executions in top.items():
        documents = [d for _, _, d in executions]
        out[queryid] = StatementPlans(
            query_id=queryid,
            executions=len(executions),
            duration_ms=sum(ms for ms, _, _ in executions),
            nodes=_summed([n for d in documents for n in plan_nodes(d)]),
            triggers=_triggers(documents),
            jit_ms=sum(
                float(((d.get("JIT") or {}).get("Timing") or {}).get("Total") or 0)
                for d in documents
            ),
            nested=_nested(nested.get(queryid, {})),
            text=executions[0][1],
        )
    return out


_FUNCTION = re.compile(r"function (?P<name>[\w.\"]+)\(")


def _nested(groups: dict[str, list[tuple[float, str, str, dict[str, Any]]]]) -> list[NestedPlans]:
    out = []
    for key, executions in groups.items():
        context = executions[0][2]
        function = _FUNCTION.search(context)
        out.append(
            NestedPlans(
                shape=key,
                text=executions[0][1],
                function=function["name"] if function else None,
                executions=len(executions),
                duration_ms=sum(ms for ms, _, _, _ in executions),
                nodes=_summed([n for _, _, _, d in executions for n in plan_nodes(d)]),
            )
        )
    return sorted(out, key=lambda n: -n.duration_ms)
