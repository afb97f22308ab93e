"""The account of active time: where the sessions' time went, as one tree, from the sampled
waits down as far as the evidence reaches.

    active time
    └── wait class (CPU, Lock, IO, ...)                        sampled (activity)
        └── wait event (Lock:transactionid, IO:DataFileRead)   sampled
            └── statement (query id, text)                     sampled
                ├── part of its time the server reports apart  pg_stat_statements
                │   (planning, JIT compilation, execution)
                │   └── plan node, trigger, function, nested   sampled plans (auto_explain),
                │       statement, each with its relation        pg_stat_user_functions;
                │                                                or the estimated plan (EXPLAIN)
                └── for a lock wait: the lock, and its holder  activity (blockers)
                    (its state, its statement, how long)

Every node carries its share of the scope's active time, the session-seconds that share is,
the samples behind it (its sampled ancestor's), and where it came from. A statement's time is
split by what the server measured of it (planning, JIT and execution for its time on CPU; the
plan nodes that read the blocks it waited for; the nodes that wrote its temporary files); a
share below a node is the node's share times the part's fraction. The classes' shares sum to 1.

Active time is the client sessions' (and their parallel workers'): a background process's
pacing wait (the checkpointer's delay between writes) is what the server does beside the
workload, never the workload's time.

Pure functions of the store and the analysed sections.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

import duckdb

from pgscope.analyze import plans as plan_samples
from pgscope.analyze.holders import Holders, lock_holders, lock_holders_by_step
from pgscope.analyze.plans import NestedPlans, PlanNode, StatementPlans, TriggerTime
from pgscope.analyze.statements import Statements
from pgscope.analyze.waits import (
    COMMIT_WAITS,
    IN_WINDOWS,
    SESSIONS,
    WAIT_EVENT,
    WAIT_TYPE,
    unnamed_statement,
)
from pgscope.duck import table_exists

Detail = dict[str, str | float | int | bool | None]
# A node below this share of its parent is not drawn (it is in its parent's time).
MIN_CHILD_SHARE = 0.01
# Samples below which an account is too thin to name anything.
MIN_SAMPLES = 50
# Whose time is the workload's (SESSIONS), the waits a commit makes, which carry no query id
# on the server (COMMIT_WAITS), and the name of time without a query id
# (unnamed_statement): analyze/waits.py's, which the top queries name it by too.
READ_WAITS = {"IO:DataFileRead", "IO:DataFilePrefetch"}
TEMP_WAITS = {"IO:BufFileRead", "IO:BufFileWrite"}
# Where a plan node's share comes from an estimated plan (the explain collector's), not a
# sampled one: the statement's execution split by the planner's costs.
ESTIMATED_SOURCE = "EXPLAIN (estimated)"


@dataclass(frozen=True)
class Node:
    """One place time went."""

    kind: (
        str  # active, class, event, statement, part, plan, trigger, function, nested, lock, holder
    )
    name: str  # what it is, in words
    share: float  # of the scope's active time
    seconds: float  # session-seconds: the share of the active sessions' time
    samples: int  # wait samples behind it (those of its nearest sampled ancestor)
    source: str  # activity, pg_stat_statements, auto_explain, pg_stat_user_functions, ...
    detail: Detail = field(default_factory=dict)
    children: list[Node] = field(default_factory=list)

    def walk(self, path: tuple[Node, ...] = ()) -> list[tuple[Node, ...]]:
        """Every path from this node down, this node first."""
        here = (*path, self)
        return [here, *(p for c in self.children for p in c.walk(here))]


@dataclass(frozen=True)
class Closed:
    """A branch the account could not follow, and what would open it."""

    branch: str  # "planning time", "plan nodes", "functions", ...
    why: str
    opens: str  # the setting or privilege that would


@dataclass(frozen=True)
class Account:
    scope: str  # "cell" (a run's variant at a client count), "window", "whole" (observe)
    variant: str | None
    clients: int | None
    step_id: int | None  # a window's
    root: Node
    samples: int  # active samples
    instants: int  # sampling instants
    seconds: float  # the scope's measured time
    closed: list[Closed] = field(default_factory=list)
    rate: float | None = None  # an open-loop cell's offered rate (a cell is also its rate)

    @property
    def aas(self) -> float:
        return self.samples / self.instants if self.instants else 0.0


@dataclass(frozen=True)
class _Statement:
    """What pg_stat_statements measured of one statement over the scope (top level)."""

    calls: float
    exec_ms: float
    plan_ms: float
    jit_ms: float
    jit_parts: dict[str, float]
    read_ms: float
    temp_ms: float
    rows: float


# A session without steps: its samples, and the time its activity collector ran.
_WHOLE_SESSION = "(SELECT NULL::INTEGER AS step_id, a.* FROM activity_samples a)"
_SESSION_SECONDS = (
    "SELECT coalesce((SELECT (stopped_us - started_us) / 1e6 FROM collectors "
    "WHERE name = 'activity' AND stopped_us > started_us), "
    "(SELECT (max(ts_us) - min(ts_us)) / 1e6 FROM activity_samples))"
)


_Sample = tuple[str, str, int | None, int]  # wait type, event, query id, samples


@dataclass(frozen=True)
class Steps:
    """What a scope reads of the samples, read for many steps in one pass each, by step: an
    hour's observation has 360 windows and the whole, and one reading per scope read all of
    its samples 361 times (analysis and report took 57-62 s, 27-31 s since: docs/benchmarks.md)."""

    samples: dict[int, list[_Sample]]
    instants: dict[int, int]  # a sample is in one step: a scope's instants are its steps' sum
    window_us: dict[int, int]
    blockers: dict[int | None, Holders]

    def of(self, step_ids: list[int]) -> tuple[list[_Sample], int, float]:
        """The samples, instants and seconds of the steps together."""
        counts: dict[tuple[str, str, int | None], int] = defaultdict(int)
        for step in step_ids:
            for t, e, q, n in self.samples.get(step, []):
                counts[(t, e, q)] += n
        samples = [(t, e, q, n) for (t, e, q), n in counts.items()]
        instants = sum(self.instants.get(step, 0) for step in step_ids)
        return samples, instants, sum(self.window_us.get(step, 0) for step in step_ids) / 1e6

    @classmethod
    def read(cls, db: duckdb.DuckDBPyConnection, step_ids: list[int]) -> Steps:
        where = f"step_id IN ({', '.join(map(str, step_ids)) or 'NULL'})"
        samples: dict[int, list[_Sample]] = defaultdict(list)
        for step, t, e, q, n in db.execute(
            f"SELECT step_id, {WAIT_TYPE}, {WAIT_EVENT}, query_id, count(*) FROM {IN_WINDOWS} "
            f"WHERE {where} AND {SESSIONS} GROUP BY ALL ORDER BY 1, 5 DESC, 2, 3, 4"
        ).fetchall():
            samples[int(step)].append((str(t), str(e), None if q is None else int(q), int(n)))
        instants = {
            int(step): int(n)
            for step, n in db.execute(
                f"SELECT step_id, count(DISTINCT sample_no) FROM {IN_WINDOWS} WHERE {where} "
                "GROUP BY 1"
            ).fetchall()
        }
        window_us = {
            int(step): int(us)
            for step, us in db.execute(
                f"SELECT step_id, window_end_us - window_start_us FROM steps "
                f"WHERE {where} AND window_end_us IS NOT NULL AND window_start_us IS NOT NULL"
            ).fetchall()
        }
        return cls(samples, instants, window_us, lock_holders_by_step(db, IN_WINDOWS, where))


class _Scope:
    """The evidence of one scope (a cell, a window, the whole observation)."""

    def __init__(
        self,
        db: duckdb.DuckDBPyConnection,
        step_ids: list[int] | None,
        statements: Statements,
        texts: dict[int, str],
        read: Steps | None = None,
    ) -> None:
        """`step_ids` None: every sample of a session that has no steps (`sample`, `trace`,
        `profile`), over the time its activity collector ran; `read`: Steps.read of the
        scope's steps, from which its samples, instants and seconds are summed (and its lock
        holders taken, for a scope of one step)."""
        self.db = db
        self.step_ids = step_ids or []
        self.section = statements
        self.texts = texts
        if step_ids is None:
            self.source, where = _WHOLE_SESSION, "TRUE"
        else:
            self.source, where = IN_WINDOWS, f"step_id IN ({', '.join(map(str, step_ids))})"
        blockers: Holders | None = None
        if read is not None and step_ids is not None:
            self.samples, self.instants, self.seconds = read.of(step_ids)
            if len(step_ids) == 1:
                blockers = read.blockers.get(step_ids[0], {})
        else:
            self._read(db, step_ids, where)
        self.total = sum(n for *_, n in self.samples)
        self.alias = self._alias()
        self.samples = self._grouped_samples()
        self.statements = self._statements()
        sampled = table_exists(db, "plan_samples")
        plans = plan_samples.read(db, set(self.step_ids)) if sampled else {}
        # One statement's plans: those of the id of its group sampled most often.
        self.plans: dict[int, StatementPlans] = {}
        for q, p in sorted(plans.items(), key=lambda kv: kv[1].executions):
            self.plans[self.alias.get(q, q)] = p
        # Where no plan was sampled (a server pgscope did not start): the estimated plan,
        # its nodes' costs as the share of a call's execution the planner expects them to
        # take (ms per call from pg_stat_statements).
        if table_exists(db, "plan_estimates"):
            for q, p in plan_samples.read_estimated(db).items():
                key = self.alias.get(q, q)
                if key not in self.plans:
                    stats = self.statements.get(key)
                    per_call = stats.exec_ms / stats.calls if stats and stats.calls else None
                    self.plans[key] = plan_samples.in_ms(p, per_call)
        self.functions = self._functions()
        self.blockers = lock_holders(db, self.source, where) if blockers is None else blockers

    def _read(self, db: duckdb.DuckDBPyConnection, step_ids: list[int] | None, where: str) -> None:
        self.samples = [
            (str(t), str(e), None if q is None else int(q), int(n))
            for t, e, q, n in db.execute(
                f"SELECT {WAIT_TYPE}, {WAIT_EVENT}, query_id, count(*) FROM {self.source} "
                f"WHERE {where} AND {SESSIONS} GROUP BY ALL ORDER BY 4 DESC, 1, 2, 3"
            ).fetchall()
        ]
        row = db.execute(
            f"SELECT count(DISTINCT sample_no) FROM {self.source} WHERE {where}"
        ).fetchone()
        self.instants = int(row[0]) if row and row[0] else 0
        row = db.execute(
            _SESSION_SECONDS
            if step_ids is None
            else f"SELECT sum(window_end_us - window_start_us) / 1e6 FROM steps WHERE {where}"
        ).fetchone()
        self.seconds = float(row[0]) if row and row[0] else 0.0

    def _alias(self) -> dict[int, int]:
        """Query ids of one text mapped to one of them (the one sampled most): a statement on
        a temporary table gets a new id in each transaction that creates the table (the id
        hashes the table's oid), and is still one statement to the reader."""
        by_text: dict[str, list[int]] = defaultdict(list)
        counts: dict[int, int] = defaultdict(int)
        for _, _, q, n in self.samples:
            if q is not None:
                counts[q] += n
        ids = {s.queryid for s in self.section.statements if s.step_id in set(self.step_ids)}
        for q in ids | set(counts):
            text = self.texts.get(q)
            if text:
                by_text[" ".join(text.split())].append(q)
        alias = {}
        for members in by_text.values():
            if len(members) > 1:
                first = max(members, key=lambda q: (counts.get(q, 0), -q))
                alias.update({q: first for q in members})
        return alias

    def _grouped_samples(self) -> list[tuple[str, str, int | None, int]]:
        grouped: dict[tuple[str, str, int | None], int] = defaultdict(int)
        for t, e, q, n in self.samples:
            grouped[(t, e, self.alias.get(q, q) if q is not None else None)] += n
        return sorted(
            ((t, e, q, n) for (t, e, q), n in grouped.items()),
            key=lambda r: (-r[3], r[0], r[1], r[2] if r[2] is not None else 0),
        )

    def seconds_of(self, share: float) -> float:
        return share * self.total / self.instants * self.seconds if self.instants else 0.0

    def _statements(self) -> dict[int, _Statement]:
        sums: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        steps = set(self.step_ids)
        for s in self.section.statements:
            if s.step_id not in steps or not s.toplevel:
                continue
            d = sums[self.alias.get(s.queryid, s.queryid)]
            for name in (
                "calls",
                "exec_ms",
                "plan_ms",
                "jit_ms",
                "rows",
                "read_ms",
                "temp_read_ms",
                "temp_write_ms",
                "jit_generation_ms",
                "jit_inlining_ms",
                "jit_optimization_ms",
                "jit_emission_ms",
            ):
                d[name] += float(getattr(s, name))
        return {
            q: _Statement(
                d["calls"],
                d["exec_ms"],
                d["plan_ms"],
                d["jit_ms"],
                {
                    "generation": d["jit_generation_ms"],
                    "inlining": d["jit_inlining_ms"],
                    "optimization": d["jit_optimization_ms"],
                    "emission": d["jit_emission_ms"],
                },
                d["read_ms"],
                d["temp_read_ms"] + d["temp_write_ms"],
                d["rows"],
            )
            for q, d in sums.items()
        }

    def _functions(self) -> dict[str, tuple[float, float, float]]:
        """Per function: (calls, total ms, self ms) over the scope."""
        out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        steps = set(self.step_ids)
        for f in self.section.functions:
            if f.step_id in steps:
                sums = out[f.name]
                sums[0] += f.calls
                sums[1] += f.total_ms
                sums[2] += f.self_ms
        return {name: (c, t, s) for name, (c, t, s) in out.items()}


def account_of(
    accounts: list[Account], variant: str | None, clients: int | None, rate: float | None = None
) -> Account | None:
    """A cell's account (an open-loop cell's by its rate too), or, for an observation's
    cells, the whole observation's."""
    for account in accounts:
        if account.scope == "cell" and (account.variant, account.clients, account.rate) == (
            variant,
            clients,
            rate,
        ):
            return account
    return next((a for a in accounts if a.scope == "whole"), None)


def _quoted(text: str | None, width: int = 70) -> str:
    flat = " ".join((text or "").split())
    return flat[:width] + ("…" if len(flat) > width else "")


def _statement_name(query_id: int | None, text: str | None, event: str) -> str:
    if query_id is None:
        return unnamed_statement(event)
    return f"query {query_id}: {_quoted(text) if text else '(text not kept)'}"


def build(
    db: duckdb.DuckDBPyConnection,
    step_ids: list[int] | None,
    statements: Statements,
    texts: dict[int, str],
    scope: str,
    variant: str | None,
    clients: int | None,
    step_id: int | None = None,
    closed: list[Closed] | None = None,
    rate: float | None = None,
    read: Steps | None = None,
) -> Account:
    """The account of the steps `step_ids` (their measured windows); None: of a whole
    session that has no steps. `read`: Steps.read of steps that several scopes share."""
    s = _Scope(db, step_ids, statements, texts, read)
    classes: dict[str, list[tuple[str, int | None, int]]] = defaultdict(list)
    for wtype, event, query_id, n in s.samples:
        classes[wtype].append((event, query_id, n))
    total = s.total or 1
    class_nodes = []
    for wtype, rows in classes.items():
        events: dict[str, list[tuple[int | None, int]]] = defaultdict(list)
        for event, query_id, n in rows:
            label = "CPU" if wtype == "CPU" else f"{wtype}:{event}"
            events[label].append((query_id, n))
        event_nodes = [_event(s, label, queries, total) for label, queries in events.items()]
        n = sum(r[2] for r in rows)
        class_nodes.append(
            Node(
                "class",
                wtype,
                n / total,
                s.seconds_of(n / total),
                n,
                "activity",
                {"class": wtype},
                _sorted(event_nodes),
            )
        )
    root = Node(
        "active",
        "active time",
        1.0 if s.total else 0.0,
        s.seconds_of(1.0),
        s.total,
        "activity",
        {"aas": s.total / s.instants if s.instants else 0.0},
        _sorted(class_nodes),
    )
    return Account(
        scope, variant, clients, step_id, root, s.total, s.instants, s.seconds, closed or [], rate
    )


def _sorted(nodes: list[Node]) -> list[Node]:
    return sorted(nodes, key=lambda n: (-n.share, n.name))


def _event(s: _Scope, label: str, queries: list[tuple[int | None, int]], total: int) -> Node:
    n_event = sum(n for _, n in queries)
    statement_nodes = []
    for query_id, n in queries:
        share = n / total
        text = s.texts.get(query_id) if query_id is not None else None
        detail: Detail = {
            "query_id": str(query_id) if query_id is not None else None,
            "text": text,
            "event": label,
            # Its first word: select, insert, create, vacuum ... (what kind of statement)
            "statement_kind": (text or "").split(None, 1)[0].lower() if text else None,
        }
        if query_id is None and label in COMMIT_WAITS:
            detail["commit"] = True
        children = (
            _statement_children(s, query_id, label, share, n)
            if query_id is not None
            else _unnamed(s, share, n)
            if label not in COMMIT_WAITS
            else []
        )
        if query_id is not None and label.startswith("Lock:"):
            children += _locks(s, query_id, label, share, n)
        elif query_id is None and label.startswith("Lock:"):
            children += _locks(s, None, label, share, n)
        statement_nodes.append(
            Node(
                "statement",
                _statement_name(query_id, text, label),
                share,
                s.seconds_of(share),
                n,
                "activity",
                detail,
                _sorted(children),
            )
        )
    kind_class, _, event = label.partition(":")
    return Node(
        "event",
        label,
        n_event / total,
        s.seconds_of(n_event / total),
        n_event,
        "activity",
        {"class": kind_class, "event": event or label},
        _sorted(statement_nodes),
    )


def _unnamed(s: _Scope, share: float, samples: int) -> list[Node]:
    """What samples without a query id were running, where the server can tell: statements
    pg_stat_statements timed that no sample ever caught with their id (utility statements,
    which PostgreSQL 15 gives none while they run: CREATE, VACUUM, a COMMIT's ON COMMIT DROP),
    by their share of those statements' time."""
    seen = {q for _, _, q, _ in s.samples if q is not None}
    unseen = {q: st for q, st in s.statements.items() if q not in seen and st.exec_ms > 0}
    whole = sum(st.exec_ms for st in unseen.values())
    active_ms = s.seconds_of(1.0) * 1000
    out = []
    for query_id, stats in sorted(unseen.items(), key=lambda kv: -kv[1].exec_ms):
        # Never more than the time the server measured for it: what it cannot account for
        # stays unnamed (a COMMIT's own work is timed as no statement's).
        below = min(share * stats.exec_ms / whole, stats.exec_ms / active_ms if active_ms else 0)
        if below < share * MIN_CHILD_SHARE or below < 0.005 or query_id not in s.texts:
            continue
        text = s.texts[query_id]
        out.append(
            Node(
                "statement",
                _statement_name(query_id, text, ""),
                below,
                s.seconds_of(below),
                samples,
                "pg_stat_statements",
                {
                    "query_id": str(query_id),
                    "text": text,
                    "statement_kind": text.split(None, 1)[0].lower() if text else None,
                    "inferred": "sampled without a query id; its share of the time "
                    "pg_stat_statements measured for statements no sample caught",
                    "ms_per_call": stats.exec_ms / stats.calls if stats.calls else None,
                },
            )
        )
    return out


def _statement_children(
    s: _Scope, query_id: int, event: str, share: float, samples: int
) -> list[Node]:
    stats = s.statements.get(query_id)
    plans = s.plans.get(query_id)
    if event == "CPU":
        return _cpu_parts(s, query_id, stats, plans, share, samples)
    if event in READ_WAITS and plans is not None:
        return _weighted_nodes(s, plans, share, samples, "shared_read", "blocks it read")
    if event in TEMP_WAITS and plans is not None:
        return _weighted_nodes(s, plans, share, samples, "temp_written", "temporary blocks written")
    return []


def _cpu_parts(
    s: _Scope,
    query_id: int,
    stats: _Statement | None,
    plans: StatementPlans | None,
    share: float,
    samples: int,
) -> list[Node]:
    """A statement's time on CPU, split as the server measured it: planning, JIT compilation,
    execution; the execution by its sampled plans."""
    if stats is None or stats.exec_ms + stats.plan_ms <= 0:
        return _execution(s, plans, share, samples) if plans is not None else []
    # Its time waiting (the samples of it in other events) is not on CPU.
    mine = sum(n for _, _, q, n in s.samples if q == query_id)
    on_cpu = samples / mine if mine else 1.0
    total_ms = (stats.exec_ms + stats.plan_ms) * on_cpu
    # The parts in the proportions the server measured them: planning apart, JIT compilation
    # inside the execution's time. Their whole time taken from a total scaled to the CPU
    # samples overstated them wherever samples outside the measured time shrank the scale.
    planning, jit = stats.plan_ms, min(stats.jit_ms, stats.exec_ms)
    whole = stats.plan_ms + stats.exec_ms
    executing = whole - planning - jit
    per_call = f"{total_ms / stats.calls:.3g} ms per call on CPU" if stats.calls else ""
    parts = []
    if planning > 0:
        fraction = planning / whole
        parts.append(
            Node(
                "part",
                "planning",
                share * fraction,
                s.seconds_of(share * fraction),
                samples,
                "pg_stat_statements",
                {
                    "part": "planning",
                    "fraction": fraction,
                    "ms_per_call": planning / stats.calls if stats.calls else None,
                },
            )
        )
    if jit > 0:
        fraction = jit / whole
        detail: Detail = {
            "part": "jit",
            "fraction": fraction,
            "ms_per_call": jit / stats.calls if stats.calls else None,
        }
        detail.update({f"jit_{k}_ms": v for k, v in stats.jit_parts.items()})
        parts.append(
            Node(
                "part",
                "JIT compilation",
                share * fraction,
                s.seconds_of(share * fraction),
                samples,
                "pg_stat_statements",
                detail,
            )
        )
    fraction = executing / whole
    children = _execution(s, plans, share * fraction, samples) if plans is not None else []
    parts.append(
        Node(
            "part",
            "execution",
            share * fraction,
            s.seconds_of(share * fraction),
            samples,
            "pg_stat_statements",
            {
                "part": "execution",
                "fraction": fraction,
                "calls": stats.calls,
                "per_call": per_call,
                "sampled_plans": plans.executions if plans and not plans.estimated else 0,
            },
            _sorted(children),
        )
    )
    return parts


def _execution(s: _Scope, plans: StatementPlans, share: float, samples: int) -> list[Node]:
    """The sampled executions' time, by trigger, function and plan node (own time)."""
    whole = plans.node_ms + plans.trigger_ms
    if whole <= 0:
        return []
    children: list[Node] = []
    functions = _functions(s, plans, share, samples)
    for trigger in plans.triggers:
        fraction = trigger.ms / whole
        if fraction < MIN_CHILD_SHARE:
            continue
        below = share * fraction
        nested = _nested_of(s, plans, trigger, below, samples)
        detail = _trigger_detail(trigger, plans)
        body = _trigger_body(s, trigger, plans, functions)
        if body is not None:
            # The trigger's own function: the same time as the trigger, counted once, here.
            functions = [f for f in functions if f is not body]
            detail["function"] = body.detail["function"]
        children.append(
            Node(
                "trigger",
                _trigger_name(trigger),
                below,
                s.seconds_of(below),
                samples,
                "auto_explain",
                detail,
                _sorted(nested),
            )
        )
    for node in _by_table(s, plans.nodes):
        fraction = node.self_ms / whole
        if fraction < MIN_CHILD_SHARE:
            continue
        below = share * fraction
        plan = _plan_node(s, node, plans.executions, below, samples, plans.estimated)
        # A function a node calls (in its filter or what it computes) runs in its time.
        called = [f for f in functions if _calls(node, f)]
        if called:
            functions = [f for f in functions if f not in called]
            plan = Node(
                plan.kind,
                plan.name,
                plan.share,
                plan.seconds,
                plan.samples,
                plan.source,
                plan.detail,
                _sorted(called),
            )
        children.append(plan)
    return children + functions


def _by_table(s: _Scope, nodes: list[PlanNode]) -> list[PlanNode]:
    """Nodes of one kind on the partitions of one table as one node of the table: a query
    that touches every partition spends its time in all of them, and the table is what to
    name (an index on one partition would not help)."""
    groups: dict[tuple[str, str, str | None], list[PlanNode]] = defaultdict(list)
    alone: list[PlanNode] = []
    for node in nodes:
        root = s.section.root_of(node.relation) if node.relation else None
        if node.relation and root != node.relation:
            groups[(node.node_type, root or "", node.condition)].append(node)
        else:
            alone.append(node)
    for (_, root, _), parts in groups.items():
        if len(parts) == 1:
            alone.append(parts[0])
            continue
        first = parts[0]
        alone.append(
            replace(
                first,
                relation=root,
                index=None,
                self_ms=sum(p.self_ms for p in parts),
                loops=sum(p.loops for p in parts),
                rows=sum(p.rows for p in parts),
                removed=sum(p.removed for p in parts),
                shared_read=sum(p.shared_read for p in parts),
                shared_hit=sum(p.shared_hit for p in parts),
                temp_written=sum(p.temp_written for p in parts),
                heap_fetches=sum(p.heap_fetches for p in parts),
                estimated_rows=sum(p.estimated_rows for p in parts),
                partitions=len(parts),
            )
        )
    return sorted(alone, key=lambda n: -n.self_ms)


def _calls(node: PlanNode, function: Node) -> bool:
    name = str(function.detail.get("function", "")).rsplit(".", 1)[-1].lower()
    said = f"{node.condition or ''} {node.output or ''}".lower().replace(" (", "(")
    return bool(name) and f"{name}(" in said


def _weighted_nodes(
    s: _Scope, plans: StatementPlans, share: float, samples: int, attribute: str, what: str
) -> list[Node]:
    """The plan nodes that caused a wait, by their share of what the wait was for."""
    weights = [(n, float(getattr(n, attribute))) for n in plans.nodes]
    whole = sum(w for _, w in weights)
    if whole <= 0:
        return []
    out = []
    for node, weight in weights:
        fraction = weight / whole
        if fraction >= MIN_CHILD_SHARE:
            plan = _plan_node(s, node, plans.executions, share * fraction, samples)
            plan.detail["weighted_by"] = what
            out.append(plan)
    return out


def _plan_node(
    s: _Scope,
    node: PlanNode,
    executions: int,
    share: float,
    samples: int,
    estimated: bool = False,
) -> Node:
    per = max(1, executions)
    relation = node.relation
    root = s.section.root_of(relation) if relation else None
    indexes = s.section.indexes_on(relation) if relation else []
    leading = {i.columns[0] for i in indexes if i.columns}
    cast = node.casts
    function = node.function_of_column
    detail: Detail = {
        "node_type": node.node_type,
        "relation": relation,
        "table": root,
        "partition": relation if root and root != relation else None,
        "partitions": node.partitions,
        "index": node.index,
        "condition": node.condition,
        "index_condition": node.index_condition,
        "ms_per_execution": node.self_ms / per,
        "loops_per_execution": node.loops / per,
        "rows_per_execution": node.rows / per,
        "input_rows_per_execution": node.input_rows / per,
        # The share of its input a join keeps (a join that keeps little reads much for it).
        "join_selectivity": node.rows / node.input_rows if node.input_rows else None,
        "removed_per_execution": node.removed / per,
        "removed_share": node.removed_share,
        "estimated_rows": node.estimated_rows,
        "rows_per_loop": node.rows / node.loops if node.loops else 0.0,
        "temp_kb_per_execution": node.temp_written * 8 / per,
        "shared_read_per_execution": node.shared_read / per,
        "sort_method": node.sort_method,
        "sort_space_type": node.sort_space_type,
        "sort_space_kb": node.sort_space_kb,
        "heap_fetches_per_execution": node.heap_fetches / per,
        "lossy_blocks": node.lossy_blocks,
        "hash_batches": node.hash_batches,
        "executions": node.executions,
        "columns": ", ".join(node.columns) or None,
        "cast_column": cast[0] if cast else None,
        "cast_type": cast[1] if cast else None,
        "function": function[0] if function else None,
        "function_column": function[1] if function else None,
        "indexed_columns": ", ".join(sorted(leading)) or None,
        "misestimate": _misestimate(node),
        "above": node.above,
        "sort_key": node.sort_key,
        "join_condition": node.join_condition,
        "leading_wildcard": "~~" in (node.condition or "") and "'%" in (node.condition or ""),
        "column_indexed": bool(
            (cast and cast[0] in leading)
            or (function and function[1] in leading)
            or any(c in leading for c in node.columns)
        ),
    }
    if estimated:
        # Rows the planner expects, not counted ones: no estimate is off from itself (and
        # the rows its filters throw away are not known: 0).
        detail["misestimate"] = None
    source = ESTIMATED_SOURCE if estimated else "auto_explain"
    return Node("plan", _plan_name(node, root), share, s.seconds_of(share), samples, source, detail)


def _misestimate(node: PlanNode) -> float | None:
    """How many times off the planner's row estimate per loop was (at least 1), where it
    read rows at all."""
    if not node.loops or node.estimated_rows <= 0:
        return None
    actual = node.rows / node.loops
    if actual <= 0:
        return None
    return max(actual / node.estimated_rows, node.estimated_rows / actual)


def _plan_name(node: PlanNode, root: str | None) -> str:
    what = node.node_type
    if node.relation:
        on = (
            node.relation
            if not root or root == node.relation
            else f"{root} (partition {node.relation})"
        )
        what += f" on {on}"
    if node.index:
        what += f" using {node.index}"
    if node.condition:
        what += f", {_quoted(node.condition, 60)}"
    return what


def _trigger_name(trigger: TriggerTime) -> str:
    if trigger.constraint:
        return f"foreign key {trigger.constraint}'s check (trigger on {trigger.relation})"
    return f"trigger {trigger.name} on {trigger.relation}"


def _trigger_detail(trigger: TriggerTime, plans: StatementPlans) -> Detail:
    return {
        "trigger": trigger.name,
        "constraint": trigger.constraint,
        "relation": trigger.relation,
        "ms_per_execution": trigger.ms / max(1, plans.executions),
        "calls_per_execution": trigger.calls / max(1, plans.executions),
    }


def _trigger_body(
    s: _Scope, trigger: TriggerTime, plans: StatementPlans, functions: list[Node]
) -> Node | None:
    """The function a trigger runs as its body: one the statement reaches only through the
    statements PL/pgSQL ran inside it (each names its function), never by name in its text or
    plan, with this the statement's only such trigger. pg_stat_user_functions counts its time
    as a function's, auto_explain as the trigger's: one cause, not two."""
    if trigger.constraint is not None:
        return None
    if sum(1 for t in plans.triggers if t.constraint is None) > 1:
        return None  # which trigger ran which function is not known
    text = (s.texts.get(plans.query_id) or plans.text or "").lower().replace(" (", "(")
    for function in functions:
        bare = str(function.detail.get("function", "")).rsplit(".", 1)[-1].lower()
        if f"{bare}(" in text or any(_calls(node, function) for node in plans.nodes):
            continue
        if any((n.function or "").strip('"').lower().endswith(bare) for n in plans.nested):
            return function
    return None


def _nested_of(
    s: _Scope, plans: StatementPlans, trigger: TriggerTime, share: float, samples: int
) -> list[Node]:
    """The statements a trigger ran: a foreign key's checks (SPI statements on ONLY a table)
    for a constraint trigger, the PL/pgSQL ones for another."""
    mine = [
        n
        for n in plans.nested
        if (trigger.constraint is not None) == (n.function is None and " only " in n.shape)
    ]
    if (
        len(
            [
                t
                for t in plans.triggers
                if (t.constraint is not None) == (trigger.constraint is not None)
            ]
        )
        > 1
    ):
        mine = []  # several such triggers: which ran which is not known
    whole = sum(n.duration_ms for n in mine)
    if whole <= 0:
        return []
    scale = min(1.0, whole / trigger.ms) if trigger.ms > 0 else 1.0
    return [
        _nested_node(s, n, share * scale * n.duration_ms / whole, samples)
        for n in mine
        if n.duration_ms / whole >= MIN_CHILD_SHARE
    ]


def _nested_node(s: _Scope, nested: NestedPlans, share: float, samples: int) -> Node:
    whole = sum(n.self_ms for n in nested.nodes)
    children = [
        _plan_node(s, node, nested.executions, share * node.self_ms / whole, samples)
        for node in nested.nodes
        if whole > 0 and node.self_ms / whole >= MIN_CHILD_SHARE
    ]
    return Node(
        "nested",
        f"nested: {_quoted(nested.text, 60)}",
        share,
        s.seconds_of(share),
        samples,
        "auto_explain",
        {
            "text": nested.text,
            "function": nested.function,
            "executions": nested.executions,
            "ms_per_execution": nested.duration_ms / max(1, nested.executions),
        },
        _sorted(children),
    )


def _functions(s: _Scope, plans: StatementPlans, share: float, samples: int) -> list[Node]:
    """The user functions this statement calls (named in its text), by their own time over
    the scope against the statement's execution time; the statements they ran below them."""
    if plans is None:
        return []
    stats = s.statements.get(plans.query_id)
    if stats is None or stats.exec_ms <= 0:
        return []
    said = (
        " ".join(
            [
                s.texts.get(plans.query_id) or plans.text,
                *(f"{n.condition or ''} {n.output or ''}" for n in plans.nodes),
                *(n.function or "" for n in plans.nested),
            ]
        )
        .lower()
        .replace(" (", "(")
    )
    out = []
    for name, (calls, total_ms, self_ms) in s.functions.items():
        bare = name.rsplit(".", 1)[-1].lower()
        if f"{bare}(" not in said and not any(
            (n.function or "").strip('"').lower().endswith(bare) for n in plans.nested
        ):
            continue
        fraction = min(1.0, total_ms / stats.exec_ms)
        if fraction < MIN_CHILD_SHARE:
            continue
        below = share * fraction
        nested = [n for n in plans.nested if n.function and n.function.strip('"').endswith(bare)]
        whole = sum(n.duration_ms for n in nested)
        children = [
            _nested_node(
                s,
                n,
                below * n.duration_ms / whole * (1 - self_ms / total_ms if total_ms else 0),
                samples,
            )
            for n in nested
            if whole > 0
        ]
        out.append(
            Node(
                "function",
                f"function {name}()",
                below,
                s.seconds_of(below),
                samples,
                "pg_stat_user_functions",
                {
                    "function": name,
                    "calls_per_call": calls / stats.calls if stats.calls else None,
                    "self_share": self_ms / total_ms if total_ms else None,
                    "ms_per_call": total_ms / calls if calls else None,
                },
                _sorted(children),
            )
        )
    return out


def _locks(s: _Scope, query_id: int | None, event: str, share: float, samples: int) -> list[Node]:
    """A lock wait's objects and their holders, by the blockers read while it waited."""
    rows = s.blockers.get((query_id, event), [])
    whole = sum(r[-1] for r in rows)
    if not whole:
        return []
    by_lock: dict[tuple[Any, ...], list[tuple[Any, ...]]] = defaultdict(list)
    for row in rows:
        by_lock[row[:3]].append(row)
    out = []
    for (locktype, relation, mode), held in by_lock.items():
        n = sum(r[-1] for r in held)
        lock_share = share * n / whole
        holders = []
        for _, _, _, state, application, query, xact_s, state_s, count in held:
            below = lock_share * count / n
            holders.append(
                Node(
                    "holder",
                    _holder_name(state, application, query, xact_s, state_s),
                    below,
                    s.seconds_of(below),
                    samples,
                    "activity (blockers)",
                    {
                        "state": state,
                        "application": application,
                        "query": query,
                        "xact_s": xact_s,
                        "state_s": state_s,
                        "readings": count,
                    },
                )
            )
        what = f"{mode or 'a'} lock on {relation}" if relation else f"{locktype or '?'} lock"
        out.append(
            Node(
                "lock",
                what,
                lock_share,
                s.seconds_of(lock_share),
                samples,
                "activity (blockers)",
                {"locktype": locktype, "relation": relation, "mode": mode, "readings": n},
                _sorted(holders),
            )
        )
    return out


def _holder_name(
    state: str | None,
    application: str | None,
    query: str | None,
    xact_s: float | None,
    state_s: float | None,
) -> str:
    who = f"a session of {application}" if application else "a session"
    doing = state or "?"
    held = f", in its transaction for {xact_s:.1f} s" if xact_s is not None else ""
    last = f", its statement: {_quoted(query, 50)}" if query else ""
    return f"held by {who} {doing}{held}{last}"


def closed_branches(
    db: duckdb.DuckDBPyConnection, statements: Statements, target_kind: str | None
) -> list[Closed]:
    """The branches no account of this run can follow, each with what would open it: read
    from the server's settings as the statements collector found them."""
    import json

    out: list[Closed] = []
    if not statements.read:
        return [
            Closed(
                "statements",
                "the statements collector did not run",
                "the statements collector (on by default)",
            )
        ]
    if not statements.statements_read:
        out.append(
            Closed(
                "statements",
                "pg_stat_statements is not installed in the database",
                "CREATE EXTENSION pg_stat_statements, with it in shared_preload_libraries",
            )
        )
    row = db.execute(
        "SELECT detail FROM events WHERE kind = 'statements-settings' ORDER BY ts_us LIMIT 1"
    ).fetchone()
    settings: dict[str, str] = json.loads(row[0]) if row else {}
    if not settings:
        return out
    said = {
        "pg_stat_statements.track_planning": (
            "on",
            "planning time",
            "planning is not timed",
            "pg_stat_statements.track_planning = on",
        ),
        "pg_stat_statements.track": (
            "all",
            "nested statements",
            "only top-level statements are counted",
            "pg_stat_statements.track = all",
        ),
        "track_functions": (
            "pl all",
            "functions",
            "functions' time is not counted",
            "track_functions = pl (or all)",
        ),
        "track_io_timing": (
            "on",
            "I/O time",
            "reading and writing blocks is not timed",
            "track_io_timing = on",
        ),
    }
    for name, (good, branch, why, opens) in said.items():
        value = settings.get(name)
        if value is not None and value not in good.split():
            out.append(Closed(branch, f"{why} ({name} = {value})", opens))
    if settings.get("plans sampled") != "on":
        where = (
            "plans are sampled only on clusters pgscope starts"
            if target_kind != "embedded"
            else "auto_explain is not available to this server"
        )
        estimated = (
            table_exists(db, "plan_estimates")
            and db.execute(
                "SELECT count(DISTINCT queryid) FROM plan_estimates WHERE plan IS NOT NULL"
            ).fetchone()
        )
        if estimated and estimated[0]:
            where += (
                f"; the estimated plans (EXPLAIN, without running them) of "
                f"{estimated[0]} of the heaviest statements split their execution by the "
                f"planner's costs instead"
            )
        out.append(
            Closed(
                "plan nodes",
                where,
                "auto_explain (shared_preload_libraries) with log_analyze, log_format = json, "
                "sampled; on a cluster pgscope starts it is on by default",
            )
        )
    return out
