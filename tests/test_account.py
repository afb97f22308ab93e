"""The account of active time, from a server log's plans to a finding's words: the plans
auto_explain logged are read back with the statement they ran under, summed node by node,
and heavy paths of an account are named by their deepest node and interpreted by the
mechanism that fits it (analyze/plans.py, account.py, paths.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pgscope.analyze import paths
from pgscope.analyze.account import Account, Node
from pgscope.analyze.plans import plan_nodes, shape
from pgscope.collect.statistics.planlog import parse_plans

LOG = Path(__file__).parent / "data" / "plans" / "auto_explain.log"
DELETE, UPDATE, JIT = 6451115561808639846, -8342762666918154035, -1927110332827233377


def test_plans_in_a_server_log_are_read_with_the_statement_they_ran_under() -> None:
    plans = parse_plans(LOG.read_text())
    assert [(p.query_id, p.nested) for p in plans] == [
        (DELETE, True),  # the foreign key's checks, logged before their statement
        (DELETE, True),
        (DELETE, False),
        (UPDATE, True),  # the trigger's statement
        (UPDATE, False),
        (JIT, False),
    ]
    check = plans[1]
    assert check.query_text.startswith('SELECT 1 FROM ONLY "public"."child"')
    assert check.duration_ms == 5.601 and check.function is None
    assert plans[3].function == "audit"  # PL/pgSQL function audit() line 1 at PERFORM
    assert plans[2].plan["Triggers"][0]["Constraint Name"] == "child_parent_id_fkey"
    assert plans[5].plan["JIT"]["Timing"]["Total"] > 5


def test_a_message_still_being_written_is_left_for_the_next_read() -> None:
    text = LOG.read_text()
    cut = text[: text.index('"Node Type": "ModifyTable"')]
    assert [p.nested for p in parse_plans(cut)] == [True, True]


def test_a_nodes_own_time_leaves_its_childrens_out() -> None:
    delete = next(p for p in parse_plans(LOG.read_text()) if p.query_id == JIT)
    nodes = plan_nodes(delete.plan)
    aggregate, scan = nodes
    assert (aggregate.node_type, scan.node_type) == ("Aggregate", "Seq Scan")
    total = delete.plan["Plan"]["Actual Total Time"]
    assert aggregate.self_ms + scan.self_ms == pytest.approx(total, abs=0.01)
    assert scan.casts == ("parent_id", "numeric") and scan.columns == ["parent_id"]
    assert scan.removed == 19979 and scan.removed_share > 0.99


def test_statements_with_other_values_have_one_shape() -> None:
    assert shape("select * from t where id = 5 and name = 'x''y'") == shape(
        "SELECT * FROM t WHERE id = $1 AND name = $2"
    )


def _node(kind: str, name: str, share: float, children: list[Node] | None = None,
          **detail: object) -> Node:  # fmt: skip
    return Node(kind, name, share, share * 10, 500, "test", dict(detail), children or [])  # type: ignore[arg-type]


def _account(*statements: Node, event: str = "CPU", klass: str = "CPU") -> Account:
    total = sum(s.share for s in statements)
    root = _node("active", "active time", 1.0, [
        _node("class", klass, total, [_node("event", event, total, list(statements))]),
    ])  # fmt: skip
    return Account("cell", "base", 4, None, root, 500, 250, 10.0)


def _statement(share: float, *children: Node, text: str = "delete from parent where id = $1",
               event: str = "CPU") -> Node:  # fmt: skip
    return _node("statement", f"query 7: {text}", share, list(children), query_id="7",
                 text=text, event=event, statement_kind=text.split()[0].lower())  # fmt: skip


def test_a_foreign_keys_check_is_named_to_the_table_and_column_an_index_needs() -> None:
    scan = _node("plan", "Seq Scan on child", 0.55, node_type="Seq Scan", table="child",
                 relation="child", condition="($1 = parent_id)", columns="parent_id",
                 removed_per_execution=99_900.0, rows_per_execution=0.0, removed_share=1.0,
                 executions=12)  # fmt: skip
    nested = _node(
        "nested",
        "nested: SELECT 1 FROM ONLY child",
        0.56,
        [scan],
        text='SELECT 1 FROM ONLY "public"."child" x WHERE $1 = "parent_id"',
    )
    trigger = _node(
        "trigger",
        "foreign key child_parent_id_fkey's check (trigger on parent)",
        0.57,
        [nested],
        constraint="child_parent_id_fkey",
        executions=12,
    )
    execution = _node("part", "execution", 0.58, [trigger], part="execution")
    (reading,) = paths.readings(_account(_statement(0.6, execution)))
    assert reading.mechanism is not None and reading.mechanism.id == "foreign-key-check-scan"
    assert "query 7 `delete from parent where id = $1`" in reading.sentence
    assert "child_parent_id_fkey" in reading.sentence and "Seq Scan on child" in reading.sentence
    assert "CREATE INDEX CONCURRENTLY ON child (parent_id)" in reading.recommendations[0]
    assert reading.confidence == "high"


def test_each_part_of_a_statements_time_is_its_own_path() -> None:
    planning = _node("part", "planning", 0.4, part="planning", fraction=0.5, ms_per_call=5.7)
    jit = _node("part", "JIT compilation", 0.3, part="jit", fraction=0.37, ms_per_call=4.0)
    execution = _node("part", "execution", 0.1, part="execution")
    found = paths.readings(_account(_statement(0.8, planning, jit, execution)))
    assert [r.mechanism.id for r in found if r.mechanism] == ["planning-time", "jit-compilation"]
    assert "5.7 ms per call" in found[0].sentence


def test_a_lock_held_by_an_idle_session_is_named_by_its_holder() -> None:
    """Idle in its transaction for the application's own time (2 s): the holder is the cause;
    idle for a round trip between two statements (1.5 ms, the hot-rows case live), the queue
    for the row is."""

    def reading(state_s: float) -> paths.Reading:
        holder = _node(
            "holder",
            "held by a session of app idle in transaction",
            0.5,
            state="idle in transaction",
            application="app",
            xact_s=2.0,
            state_s=state_s,
        )
        lock = _node("lock", "transactionid lock", 0.5, [holder], locktype="transactionid")
        text = "update t set n = n + 1"
        statement = _statement(0.5, lock, text=text, event="Lock:transactionid")
        (found,) = paths.readings(_account(statement, event="Lock:transactionid", klass="Lock"))
        return found

    idle = reading(2.0)
    assert idle.mechanism is not None and idle.mechanism.id == "lock-holder-idle"
    assert "idle in transaction" in idle.sentence and "held by" in idle.sentence
    between = reading(0.0015)
    assert between.mechanism is not None and between.mechanism.id == "hot-row-locks"


def test_an_index_lookup_is_where_time_goes_not_a_cause() -> None:
    lookup = _node("plan", "Index Scan on accounts", 0.9, node_type="Index Scan",
                   table="accounts", rows_per_execution=1.0, ms_per_execution=0.02,
                   executions=40)  # fmt: skip
    execution = _node("part", "execution", 0.95, [lookup], part="execution")
    (reading,) = paths.readings(_account(_statement(0.97, execution, text="select abalance")))
    assert reading.mechanism is None
    assert reading.title.startswith("The statement's time goes to an Index Scan")


# A wait event names its mechanism whichever statement waits (PostgreSQL's own meaning of
# it), and a statement on CPU with nothing deeper names none.
WAIT_MECHANISMS = {
    "LWLock:SubtransSLRU": "subtransactions",
    "LWLock:MultiXactMemberSLRU": "multixacts",
    "LWLock:XactSLRU": "commit-status-lookups",
    "LWLock:WALInsert": "wal-insert",
    "LWLock:BufferContent": "hot-page",
    "LWLock:BufferMapping": "buffer-replacement",
    "LWLock:ProcArray": "procarray",
    "LWLock:SerializableXactHash": "serializable-predicate-locks",
    "LWLock:SInvalRead": "catalog-invalidation",
    "LWLock:pg_stat_statements": "pg-stat-statements-lock",
    "LWLock:LockManager": "lock-manager",
    "LWLock:SomeExtensionTranche": "lwlock-hotspot",
    "Lock:extend": "relation-extension",
    "Lock:object": "notify-queue",
    "Lock:spectoken": "speculative-insert",
    "Lock:transactionid": "hot-row-locks",
    "Lock:advisory": "object-lock-queue",
    "IO:BufFileWrite": "temp-file-io",
    "IO:DataFileWrite": "backend-writes",
    "IO:WALInitWrite": "wal-segment-creation",
    "IO:SLRURead": "slru-io",
    "IPC:BgWorkerStartup": "parallel-query-overhead",
    "IPC:CheckpointDone": "checkpoint-requests",
    "Timeout:SpinDelay": "spinlock-contention",
    "CPU": None,
}


@pytest.mark.parametrize(("event", "expected"), WAIT_MECHANISMS.items())
def test_a_wait_event_names_its_mechanism(event: str, expected: str | None) -> None:
    klass = event.split(":")[0]
    statement = _statement(0.6, text="select f($1)", event=event)
    (reading,) = paths.readings(_account(statement, event=event, klass=klass))
    assert (reading.mechanism.id if reading.mechanism else None) == expected, reading.title
    if expected is None:
        assert reading.title.startswith("One statement takes the time (CPU)")


def test_a_session_waiting_for_its_client_is_not_a_path() -> None:
    """Client:ClientRead beside state 'active' is the client's time (or a sample read across
    a statement's end): the account keeps it, no path follows it; ClientWrite, the server
    sending its results, is the server's and is followed."""
    for event, followed in (("Client:ClientRead", False), ("Client:ClientWrite", True)):
        statement = _statement(0.6, text="select abalance", event=event)
        account = _account(statement, event=event, klass="Client")
        assert account.root.children[0].children[0].share == pytest.approx(0.6)
        assert bool(paths.heavy_paths(account)) == followed, event


def test_a_path_below_the_share_worth_naming_is_not_a_finding() -> None:
    small = _statement(paths.MIN_SHARE / 2)
    assert paths.heavy_paths(_account(small)) == []


def test_every_mechanism_is_well_formed() -> None:
    mechanisms, advice = paths.mechanisms()
    kinds = {
        "part",
        "plan",
        "trigger",
        "nested",
        "function",
        "lock",
        "holder",
        "statement",
        "event",
    }
    assert len({m.id for m in mechanisms}) == len(mechanisms)
    for m in mechanisms:
        assert set(m.node) <= kinds, m.id
        assert all(op in paths._OPS for _, op, *_ in m.when), m.id
        assert m.title and m.refute and m.recommendations, m.id
    assert "Seq Scan" in advice and "statement" in advice
    json.dumps([m.__dict__ for m in mechanisms])  # data, nothing else
