"""The catalogue of causes (analyze/catalogue.py): every name a cause uses is declared once,
and a name declared nowhere fails loading with the cause's id and the name, one test per kind
of name: a fact, a member of a set of facts, a wait event, a node detail (tested, or read by
the advice), a value a detail takes, another cause it supersedes or joins."""

from __future__ import annotations

import gzip
import shutil
from importlib import resources
from pathlib import Path

import pytest

from pgscope.analyze import catalogue, diagnose, paths
from pgscope.analyze.catalogue import CatalogueError
from pgscope.analyze.details import DETAILS, NODE_KINDS, wait_events
from pgscope.analyze.facts.waits import WAIT_GROUPS
from pgscope.analyze.load import load_analysis

RUNS = Path(__file__).parent / "data" / "runs"


def _text() -> str:
    return resources.files("pgscope.analyze").joinpath("causes.toml").read_text()


def _broken(old: str, new: str) -> str:
    """The bundled catalogue with `old` (found once in it) written `new`."""
    text = _text()
    assert text.count(old) == 1, old
    return text.replace(old, new)


def _fails(old: str, new: str, *said: str) -> None:
    with pytest.raises(CatalogueError) as raised:
        catalogue.parse(_broken(old, new))
    for words in said:
        assert words in str(raised.value), (words, str(raised.value))


def test_the_bundled_catalogue_loads_clean() -> None:
    found = catalogue.parse(_text())
    assert len(found.rules) >= 30 and len(found.mechanisms) >= 50
    assert found == catalogue.bundled()


def test_one_cause_one_id_and_twins_are_one_cause() -> None:
    """A cause facts and paths both trigger is declared once: its path's finding joins its
    facts' (the mechanism's `rule` is its own id)."""
    found = catalogue.bundled()
    facts = {r.id for r in found.rules}
    both = [m for m in found.mechanisms if m.rule is not None]
    assert all(m.rule == m.id and m.id in facts for m in both)
    assert {m.id for m in both} >= {"commit-flush", "seq-scan", "spinlock-contention"}
    rule = next(r for r in found.rules if r.id == "commit-flush")
    path = next(m for m in found.mechanisms if m.id == "commit-flush")
    assert (rule.title, rule.refute) == (path.title, path.refute)
    _fails(
        'id = "sleep"',
        'id = "commit-flush"',
        "cause commit-flush: declared twice",
    )


def test_a_fact_declared_nowhere_fails_with_the_cause_and_the_name() -> None:
    _fails(
        'score = ["wait.syncrep"]',
        'score = ["wait.sycnrep"]',
        "cause syncrep-waits: fact wait.sycnrep is declared by no family",
    )


def test_a_fact_quoted_in_advice_is_checked() -> None:
    _fails("{wal.fpi_byte_share}", "{wal.fpi_bytes_share}", "cause wal-volume: fact wal.fpi_bytes")


def test_a_set_members_name_is_checked() -> None:
    # wait.share.<event> takes a wait event PostgreSQL has, not any suffix.
    _fails(
        'evidence = ["wait.share.IO:WALSync", ',
        'evidence = ["wait.share.IO:WALSnyc", ',
        "cause commit-flush: fact wait.share.IO:WALSnyc: IO:WALSnyc is no member of "
        "wait.share.<event>",
    )
    _fails(
        '["wait.class.Lock", ">=", 0.15,',
        '["wait.class.Locks", ">=", 0.15,',
        "cause cpu-saturation: fact wait.class.Locks: Locks is no member",
    )


def test_a_wait_event_a_path_condition_names_is_checked() -> None:
    _fails(
        '[["event", "==", "LWLock:CheckpointerComm"]]',
        '[["event", "==", "LWLock:CheckpointerCom"]]',
        "cause fsync-request-queue: condition on event: LWLock:CheckpointerCom is not a value",
    )
    _fails(
        '[["event", "in", ["IO:WALSync", "IO:WALWrite", "LWLock:WALWrite"]]]',
        '[["event", "in", ["IO:WALSync", "IO:WAL_Write", "LWLock:WALWrite"]]]',
        "cause commit-flush: condition on event: IO:WAL_Write",
    )
    _fails('[["class", "==", "LWLock"]]', '[["class", "==", "LWlock"]]', "cause lwlock-hotspot")


def test_a_node_detail_a_condition_tests_is_checked() -> None:
    _fails(
        '["temp_kb_per_execution", ">", 0]',
        '["temp_kb_per_exec", ">", 0]',
        "cause temp-spill: node detail temp_kb_per_exec is not declared for plan nodes",
    )
    # Of the nearest node of a kind above.
    _fails(
        '[["trigger.constraint", "set"]',
        '[["trigger.constrain", "set"]',
        "cause foreign-key-check-scan: node detail constrain is not declared for trigger nodes",
    )
    # A detail the node kind interpreted does not carry: it could never match.
    _fails(
        '[["statement_kind", "in",',
        '[["node_type", "in",',
        "cause ddl-in-hot-path: node detail node_type is not declared for statement nodes",
    )


def test_a_node_detail_the_advice_reads_is_checked() -> None:
    _fails(
        "compiling costs {ms_per_call:.3g} ms per call",
        "compiling costs {ms_per_cal:.3g} ms per call",
        "cause jit-compilation: advice reads node detail ms_per_cal",
    )
    _fails(
        '"Seq Scan" = "An index on the columns its filter reads ({columns})',
        '"Seq Scan" = "An index on the columns its filter reads ({column})',
        "node_advice.Seq Scan: node detail column",
    )


def test_a_value_from_a_closed_set_is_checked() -> None:
    # A plan node type as EXPLAIN (FORMAT JSON) names it: "Parallel Seq Scan" never is one.
    _fails(
        '[["node_type", "==", "Index Only Scan"]',
        '[["node_type", "==", "Index-Only Scan"]',
        "cause heap-fetches: condition on node_type: Index-Only Scan is not a value",
    )
    _fails('[["part", "==", "jit"]]', '[["part", "==", "JIT"]]', "cause jit-compilation")
    _fails(
        '"Index Scan" = "The index is used',
        '"Index Scans" = "The index is used',
        "node_advice: Index Scans is no plan node type or node kind",
    )


def test_a_cause_superseded_or_joined_must_exist() -> None:
    _fails(
        'supersedes = ["rollbacks"]',
        'supersedes = ["rolbacks"]',
        "cause failing-transactions: supersedes rolbacks, no cause",
    )
    _fails(
        'supersedes = ["seq-scan", "index-write-amplification"]',
        'supersedes = ["seq-scan", "index-write-amplifcation"]',
        "cause trigger-time: supersedes index-write-amplifcation",
    )
    _fails(
        'supersedes = ["lwlock-hotspot:LockManager"]',
        'supersedes = ["lwlock-hotspot:LockManagr"]',
        "cause lock-manager: supersedes lwlock-hotspot:LockManagr: LockManagr is no member",
    )


def test_a_key_that_means_nothing_is_said() -> None:
    _fails(
        'when = [["event", "==", "Timeout:PgSleep"]]',
        'wehn = [["event", "==", "Timeout:PgSleep"]]',
        "cause sleep: [paths] key wehn means nothing",
    )
    _fails(
        'id = "sleep"',
        'id = "sleep"\nsymptom = true',
        "cause sleep: symptom is read only with a facts trigger",
    )


def test_an_advice_tables_key_is_checked() -> None:
    _fails(
        'ProcArray = ["Snapshots and commits contend',
        'ProcArrays = ["Snapshots and commits contend',
        "lwlock_advice: ProcArrays names nothing",
    )


def test_every_problem_is_said_at_once() -> None:
    text = _broken('score = ["wait.syncrep"]', 'score = ["wait.sycnrep"]').replace(
        '[["event", "==", "Timeout:PgSleep"]]', '[["event", "==", "Timeout:PgSlep"]]'
    )
    with pytest.raises(CatalogueError, match=r"cause syncrep-waits: .*; .*cause sleep: "):
        catalogue.parse(text)


def test_the_ops_checked_are_the_ops_applied() -> None:
    assert set(paths._OPS) == set(catalogue.PATH_OPS)
    assert set(diagnose.OPS) == set(catalogue.FACT_OPS)


def test_the_wait_groups_facts_sum_name_known_events() -> None:
    known = wait_events()
    assert {g: [e for e in events if e not in known] for g, events in WAIT_GROUPS.items()} == {
        g: [] for g in WAIT_GROUPS
    }


# Cases whose accounts hold every kind of node: a trigger and its nested statements, a
# function, locks and their holders, JIT and planning parts, partitions, sorts.
COVERING = (
    "trigger-time",
    "function-time",
    "idle-lock-holder",
    "jit-compilation",
    "partition-locks",
    "sort-spill",
    "foreign-key-check",
    "hot-rows",
)


@pytest.mark.parametrize("case", COVERING)
def test_the_accounts_carry_only_declared_node_details(case: str, tmp_path: Path) -> None:
    """What analyze/account.py puts on a node is declared in analyze/details.py for its
    kind: a cause can only test what is declared, so a detail left out could not be named."""
    run_dir = tmp_path / f"20260101-000000-{case}-0000"
    run_dir.mkdir()
    with (
        gzip.open(RUNS / case / "run.duckdb.gz", "rb") as src,
        (run_dir / "run.duckdb").open("wb") as dst,
    ):
        shutil.copyfileobj(src, dst)
    analysis = load_analysis(run_dir, bootstrap=5)
    seen: set[tuple[str, str]] = set()
    for account in analysis.accounts:
        for nodes in account.root.walk():
            seen |= {(nodes[-1].kind, key) for key in nodes[-1].detail}
    assert seen
    assert {k for k, _ in seen} <= set(NODE_KINDS)
    assert sorted(k for k in seen if k[1] not in DETAILS[k[0]]) == []
