"""The names a cause may read on the account's nodes, declared once: each node kind's details
(what analyze/account.py puts in `Node.detail`), with its unit and meaning, and the closed
sets some of them take their values from (a plan node's type, a statement's part, a lock
holder's state). The catalogue of causes (analyze/catalogue.py) checks every field a cause's
paths trigger tests, and every "{x}" its advice reads, against these when it loads; a test
checks the accounts of the recorded runs carry no detail left out here
(tests/test_catalogue.py).

Also the names PostgreSQL gives its waits, as the analysis reads them (PostgreSQL 15 and 16's
names: analyze/wait_names.toml maps 17's and 18's renames to them): the events of every
version the sampler's wait_numbers.toml lists, and the heavyweight locks' tags.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources


@dataclass(frozen=True)
class Detail:
    unit: str  # share, ms, count, rows, kB, blocks, s, text, bool, id
    meaning: str
    # The values it takes, where they are a closed set a cause may name (None: open).
    values: frozenset[str] | None = None


# Plan nodes as EXPLAIN (FORMAT JSON) names them ("Node Type", which auto_explain logs): a
# parallel scan is a "Seq Scan" marked parallel-aware, a hashed aggregate an "Aggregate"
# with its strategy beside it (the text format's "Parallel Seq Scan" and "HashAggregate" are
# never a node type). From PostgreSQL's explain.c, 15 to 18.
NODE_TYPES = frozenset(
    {
        "Result",
        "ProjectSet",
        "ModifyTable",
        "Append",
        "Merge Append",
        "Recursive Union",
        "BitmapAnd",
        "BitmapOr",
        "Nested Loop",
        "Merge Join",
        "Hash Join",
        "Seq Scan",
        "Sample Scan",
        "Gather",
        "Gather Merge",
        "Index Scan",
        "Index Only Scan",
        "Bitmap Index Scan",
        "Bitmap Heap Scan",
        "Tid Scan",
        "Tid Range Scan",
        "Subquery Scan",
        "Function Scan",
        "Table Function Scan",
        "Values Scan",
        "CTE Scan",
        "Named Tuplestore Scan",
        "WorkTable Scan",
        "Foreign Scan",
        "Custom Scan",
        "Materialize",
        "Memoize",
        "Sort",
        "Incremental Sort",
        "Group",
        "Aggregate",
        "WindowAgg",
        "Unique",
        "SetOp",
        "LockRows",
        "Limit",
        "Hash",
    }
)
PARTS = frozenset({"planning", "jit", "execution"})
# pg_stat_activity.state
STATES = frozenset(
    {
        "active",
        "idle",
        "idle in transaction",
        "idle in transaction (aborted)",
        "fastpath function call",
        "disabled",
    }
)
# The heavyweight locks' tags (storage/lock.h LockTagType, pg_locks.locktype's names): the
# event of a Lock wait.
LOCK_TAGS = frozenset(
    {
        "relation",
        "extend",
        "frozenid",
        "page",
        "tuple",
        "transactionid",
        "virtualxid",
        "spectoken",
        "object",
        "userlock",
        "advisory",
        "applytransaction",
    }
)
# LWLock tranches an extension names at run time (RequestNamedLWLockTranche): in no list of
# the server's, so declared here.
EXTENSION_TRANCHES = frozenset({"pg_stat_statements"})
# The wait classes (utils/wait_event.h), and CPU: a sample in no wait.
WAIT_CLASSES = frozenset(
    {
        "CPU",
        "LWLock",
        "Lock",
        "BufferPin",
        "Activity",
        "Client",
        "Extension",
        "IPC",
        "Timeout",
        "IO",
        "InjectionPoint",
    }
)

_PLAN_NODE = "plan"
# Every node kind of the account, root first.
NODE_KINDS = (
    "active",
    "class",
    "event",
    "statement",
    "part",
    _PLAN_NODE,
    "trigger",
    "function",
    "nested",
    "lock",
    "holder",
)

_PER_EXECUTION = "per sampled execution of the statement"

DETAILS: dict[str, dict[str, Detail]] = {
    "active": {"aas": Detail("count", "average active sessions")},
    "class": {"class": Detail("text", "the wait class", WAIT_CLASSES)},
    "event": {
        "class": Detail("text", "the wait class", WAIT_CLASSES),
        "event": Detail("text", "the wait event, without its class (CPU for no wait)"),
    },
    "statement": {
        "query_id": Detail("id", "pg_stat_statements' query id (None: time without one)"),
        "text": Detail("text", "the statement's text as pg_stat_statements kept it"),
        "event": Detail("text", "the wait it is under, Class:Event (CPU for no wait)"),
        "statement_kind": Detail("text", "its first word, lower case: select, insert, create..."),
        "commit": Detail("bool", "a commit's wait, which the server gives no query id"),
        "inferred": Detail("text", "why its share is inferred (time sampled without a query id)"),
        "ms_per_call": Detail("ms", "execution time per call (pg_stat_statements)"),
    },
    "part": {
        "part": Detail("text", "which part of the statement's time", PARTS),
        "fraction": Detail("share", "the part's share of the statement's time"),
        "ms_per_call": Detail("ms", "the part's time per call"),
        "calls": Detail("count", "the statement's calls over the scope"),
        "per_call": Detail("text", "the statement's CPU time per call, in words"),
        "sampled_plans": Detail("count", "executions whose plan auto_explain sampled"),
        "jit_generation_ms": Detail("ms", "JIT code generation, over the scope"),
        "jit_inlining_ms": Detail("ms", "JIT inlining, over the scope"),
        "jit_optimization_ms": Detail("ms", "JIT optimization, over the scope"),
        "jit_emission_ms": Detail("ms", "JIT emission, over the scope"),
    },
    _PLAN_NODE: {
        "node_type": Detail("text", "EXPLAIN (FORMAT JSON)'s Node Type", NODE_TYPES),
        "relation": Detail("text", "the relation it reads (a partition, where one)"),
        "table": Detail("text", "the table: a partition's root, else the relation"),
        "partition": Detail("text", "the partition read, where the table is partitioned"),
        "partitions": Detail("count", "partitions whose like nodes it stands for"),
        "index": Detail("text", "the index it uses"),
        "condition": Detail("text", "its filter (or join filter, recheck)"),
        "index_condition": Detail("text", "its index condition"),
        "ms_per_execution": Detail("ms", f"its own time {_PER_EXECUTION}"),
        "loops_per_execution": Detail("count", f"times it ran {_PER_EXECUTION}"),
        "rows_per_execution": Detail("rows", f"rows it returned {_PER_EXECUTION}"),
        "input_rows_per_execution": Detail("rows", f"rows its inputs gave {_PER_EXECUTION}"),
        "join_selectivity": Detail("share", "the share of its input a join keeps"),
        "removed_per_execution": Detail("rows", f"rows its filters removed {_PER_EXECUTION}"),
        "removed_share": Detail("share", "the share of the rows read that its filters removed"),
        "estimated_rows": Detail("rows", "the planner's rows per loop"),
        "rows_per_loop": Detail("rows", "rows it returned per loop"),
        "temp_kb_per_execution": Detail("kB", f"temporary files written {_PER_EXECUTION}"),
        "shared_read_per_execution": Detail("blocks", f"blocks read in {_PER_EXECUTION}"),
        "sort_method": Detail(
            "text", "a sort's method (quicksort, top-N heapsort, external merge)"
        ),
        "sort_space_type": Detail("text", "where a sort sorted: Memory or Disk"),
        "sort_space_kb": Detail("kB", "the space a sort used"),
        "heap_fetches_per_execution": Detail(
            "count", f"an index-only scan's heap fetches {_PER_EXECUTION}"
        ),
        "lossy_blocks": Detail("blocks", "a bitmap heap scan's lossy blocks"),
        "hash_batches": Detail("count", "a hash's batches"),
        "executions": Detail("count", "sampled executions it was seen in"),
        "columns": Detail("text", "the columns its filter reads"),
        "cast_column": Detail("text", "a column its filter casts"),
        "cast_type": Detail("text", "the type the filter casts that column to"),
        "function": Detail("text", "a function its filter applies to a column"),
        "function_column": Detail("text", "the column that function is applied to"),
        "indexed_columns": Detail("text", "the leading columns of its relation's indexes"),
        "misestimate": Detail("count", "how many times off the planner's rows per loop were"),
        "above": Detail("text", "the node types above it, in words"),
        "sort_key": Detail("text", "the sort key of a sort above it"),
        "join_condition": Detail("text", "the join condition of a join above it"),
        "leading_wildcard": Detail("bool", "its filter is a LIKE pattern starting with %"),
        "column_indexed": Detail("bool", "a column its filter reads leads an index"),
        "weighted_by": Detail("text", "what the wait it stands under was weighted by"),
    },
    "trigger": {
        "trigger": Detail("text", "the trigger's name"),
        "constraint": Detail("text", "the foreign key it checks, for a constraint trigger"),
        "relation": Detail("text", "the table it is on"),
        "ms_per_execution": Detail("ms", f"its time {_PER_EXECUTION}"),
        "calls_per_execution": Detail("count", f"its calls {_PER_EXECUTION}"),
        "function": Detail("text", "the function it runs as its body"),
    },
    "function": {
        "function": Detail("text", "the function, schema-qualified"),
        "calls_per_call": Detail("count", "its calls per call of the statement"),
        "self_share": Detail("share", "the share of its time in itself, not the statements it ran"),
        "ms_per_call": Detail("ms", "its time per call"),
    },
    "nested": {
        "text": Detail("text", "the nested statement's text"),
        "function": Detail("text", "the function that ran it"),
        "executions": Detail("count", "its sampled executions"),
        "ms_per_execution": Detail("ms", "its time per execution"),
    },
    "lock": {
        "locktype": Detail("text", "the lock's type (pg_locks.locktype)", LOCK_TAGS),
        "relation": Detail("text", "the relation locked"),
        "mode": Detail("text", "the lock mode waited for"),
        "readings": Detail("count", "blocker readings behind it"),
    },
    "holder": {
        "state": Detail("text", "the holder's state (pg_stat_activity.state)", STATES),
        "application": Detail("text", "the holder's application_name"),
        "query": Detail("text", "the holder's statement"),
        "xact_s": Detail("s", "how long its transaction had been open"),
        "state_s": Detail("s", "how long it had been in its state"),
        "readings": Detail("count", "blocker readings behind it"),
    },
}
# What a paths trigger's condition may read besides a node's details: the path's wait event
# (Class:Event, or CPU) and wait class.
PATH_FIELDS = ("event", "class")


@cache
def wait_events() -> frozenset[str]:
    """Every wait event the analysis can name, Class:Event (and CPU): the events
    wait_numbers.toml lists for any version, under the names of 15 and 16 where 17 renamed
    them, and the Lock tags."""
    root = resources.files("pgscope")
    numbers = tomllib.loads(root.joinpath("collect", "sampling", "wait_numbers.toml").read_text())
    renames = tomllib.loads(
        resources.files("pgscope.analyze").joinpath("wait_names.toml").read_text()
    )
    found = {"CPU"} | {f"Lock:{tag}" for tag in LOCK_TAGS}
    found |= {f"LWLock:{tranche}" for tranche in EXTENSION_TRANCHES}
    for classes in numbers.values():
        for klass, table in classes.items():
            mapped = renames.get(klass, {})
            found |= {f"{klass}:{mapped.get(n, n)}" for n in table["names"] if n}
    return frozenset(found)


def lwlock_tranches() -> frozenset[str]:
    """The LWLock tranches, as LWLock wait events name them."""
    return frozenset(e.split(":", 1)[1] for e in wait_events() if e.startswith("LWLock:"))
