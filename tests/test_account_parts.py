"""A statement's time on CPU split into planning, JIT compilation and execution in the
proportions pg_stat_statements measured them, on the recorded planted cases whose statements
plan or compile for long (partition-locks: a generic plan's planning beside its locks)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from pgscope.analyze import statements
from pgscope.analyze.account import Node
from pgscope.analyze.load import load_analysis
from pgscope.store import RunStore
from tests.test_recorded import _unpacked

PARTS = {"planning": "plan", "JIT compilation": "jit"}


def _statement_nodes(node: Node) -> Iterator[Node]:
    for child in node.children:
        if child.kind == "statement":
            yield child
        else:
            yield from _statement_nodes(child)


@pytest.mark.parametrize("case", ["planning-time", "jit-compilation", "partition-locks"])
def test_planning_and_jit_parts_keep_the_servers_proportions(case: str, tmp_path: Path) -> None:
    run_dir = _unpacked(case, tmp_path)
    store = RunStore.open(run_dir)  # a store reads as declared, whichever version wrote it
    try:
        steps = store.db.execute("SELECT step_id, variant, clients FROM steps").fetchall()
        measured = statements.read(store.db).statements
    finally:
        store.close()
    # What the server measured of each statement, per cell: planning, JIT, the whole.
    per_cell: dict[tuple[str, int], dict[int, dict[str, float]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(float))
    )
    cell_of = {step_id: (variant, clients) for step_id, variant, clients in steps}
    for s in measured:
        if s.toplevel and s.step_id in cell_of:
            sums = per_cell[cell_of[s.step_id]][s.queryid]
            sums["plan"] += s.plan_ms
            sums["jit"] += s.jit_ms
            sums["whole"] += s.plan_ms + s.exec_ms
    checked = 0
    for account in load_analysis(run_dir, bootstrap=0).accounts:
        if account.scope != "cell" or account.variant is None or account.clients is None:
            continue
        for statement in _statement_nodes(account.root):
            query_id = statement.detail.get("query_id")
            parts = {c.name: c for c in statement.children if c.kind == "part"}
            if query_id is None or not set(parts) & set(PARTS):
                continue
            server = per_cell[(account.variant, account.clients)][int(str(query_id))]
            for name, counter in PARTS.items():
                if name in parts:
                    said = parts[name].share / statement.share
                    assert said == pytest.approx(server[counter] / server["whole"], abs=0.05), (
                        account.variant,
                        account.clients,
                        name,
                    )
                    checked += 1
    assert checked, "no statement's planning or JIT was split"


def test_a_session_waiting_for_its_client_is_not_active_time(tmp_path: Path) -> None:
    """The CPU-saturation recording's samples hold 'active' sessions in ClientRead (a state
    read before the wait): no account counts them, and its time is the server's CPU."""
    run_dir = _unpacked("cpu-saturation", tmp_path)
    db = duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)
    try:
        [(torn,)] = db.execute(
            "SELECT count(*) FROM activity_samples WHERE state = 'active' "
            "AND wait_event = 'ClientRead' AND backend_type = 'client backend'"
        ).fetchall()
    finally:
        db.close()
    assert torn > 100, "the recording holds the tear this test is about"
    accounts = [a for a in load_analysis(run_dir, bootstrap=0).accounts if a.samples]
    assert accounts
    for account in accounts:
        events = {e.name for c in account.root.children for e in c.children}
        assert "Client:ClientRead" not in events, (account.clients, events)
        cpu = next(c for c in account.root.children if c.name == "CPU")
        assert cpu.share > 0.9, (account.clients, cpu.share)
