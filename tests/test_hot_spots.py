"""User-space hot spots in CPU profiles: PostgreSQL's spin loops and GetSnapshotData, found
in folded stacks, named by their caller, judged by the spinlock-contention and snapshot-cost
rules. The profiles are built (a 2-core VM does not make PostgreSQL 15 spin as the seeds'
Power8 did), then go the recorded runs' way: stored as the perf collector stores a recording,
loaded, turned into facts, diagnosed. No server."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from pgscope.analyze.diagnose import Finding, diagnose, evaluate, load_rules
from pgscope.analyze.load import load_analysis
from pgscope.analyze.model import Fact, FactSheet, RunAnalysis
from pgscope.analyze.profile import (
    SNAPSHOT_FUNCTIONS,
    SPIN_FUNCTIONS,
    CallSite,
    HotSpot,
    Profile,
    hot_spot,
)
from pgscope.collect.profiles.profilestore import store_folded
from pgscope.store import RunMeta, RunStore

FACTS = Path(__file__).parent / "data" / "facts"
RULES, ADVICE = load_rules()

# Frames as the perf collector folded them from Debian's stripped postgres 15 (a recorded
# select on a one-row table, 64 clients): exported functions by name, static ones
# (exec_execute_message, SeqNext, ReadBuffer_common, PinBuffer, LWLockWaitListLock...) as
# `postgres+0x…`, kernel frames ending in `_[k]`.
MAIN = "__libc_start_call_main;main;PostmasterMain;postgres+0x3efcbc;PostgresMain"
SCAN = f"{MAIN};PortalRun;postgres+0x474db9;standard_ExecutorRun;ExecScan;postgres+0x32c162"
# An index scan moving to the row's heap page: the seeds' gdb stack, whose s_lock was in
# UnpinBuffer (static) under ReleaseAndReadBuffer.
FETCH = f"{SCAN};index_getnext_slot;index_fetch_heap;postgres+0x1c8a70"
PIN = f"{FETCH};ReleaseAndReadBuffer;postgres+0x43f7e0"
SNAPSHOT = f"{MAIN};GetTransactionSnapshot;GetSnapshotData"
SYSCALL = "entry_SYSCALL_64_after_hwframe_[k];do_syscall_64_[k]"
RECV = f"{MAIN};pq_getbyte;postgres+0x34b407;secure_read;epoll_wait;{SYSCALL}"
SEND = f"{MAIN};postgres+0x34b52d;postgres+0x34b06c;__send;{SYSCALL}"
# What such a backend does on CPU when nothing spins (the shares of the recording, rounded).
QUIET = {
    f"{RECV};__x64_sys_epoll_wait_[k];do_epoll_wait_[k]": 260,
    f"{MAIN};pq_getbyte;postgres+0x34b407;__libc_recv;{SYSCALL}": 80,
    f"{SEND};__x64_sys_sendto_[k];unix_stream_sendmsg_[k]": 90,
    f"{SCAN};heap_beginscan;postgres+0x19123a;RelationGetNumberOfBlocksInFork": 40,
    f"{PIN}": 20,
    f"{MAIN};GetCachedPlan;postgres+0x591e00;LockRelationOid;LockAcquireExtended": 30,
    f"{MAIN};PortalStart;standard_ExecutorStart;ExecInitNode;ExecInitSeqScan": 50,
    f"{MAIN};postgres+0x4706e5;CommitTransactionCommand;ProcReleaseLocks;LockReleaseAll": 25,
    f"{MAIN};CreatePortal;hash_search_with_hash_value": 30,
    SNAPSHOT: 6,
    f"{SNAPSHOT};postgres+0x4616d3": 3,
    MAIN: 36,
}
# The seeds' talk before buffer pins were a compare-and-swap: a third of the CPU spins on the
# hot page's buffer header, in s_lock, its delays and its sleeps, and a little on
# ProcArrayLock's wait list (LWLockWaitListLock, static) under the snapshot.
SPINNING = {
    **QUIET,
    f"{PIN};s_lock": 200,
    f"{PIN};s_lock;perform_spin_delay": 70,  # one spin: counted once
    f"{PIN};s_lock;perform_spin_delay;pg_usleep;__select;{SYSCALL}": 40,
    f"{SNAPSHOT};LWLockAcquire;postgres+0x4617a3;perform_spin_delay": 20,
}
# Many connections: every statement's snapshot walks them all (the seeds' 14% of the CPU).
SNAPSHOTS = {
    **QUIET,
    SNAPSHOT: 110,
    f"{SNAPSHOT};postgres+0x4616d3": 20,
    f"{MAIN};PortalStart;GetCatalogSnapshot;GetNonHistoricCatalogSnapshot;GetSnapshotData": 10,
}


def folded(stacks: dict[str, int]) -> Profile:
    return Profile("cpu", {("backend", None, tuple(s.split(";"))): v for s, v in stacks.items()})


def test_a_spin_is_counted_once_and_named_by_the_function_that_called_it() -> None:
    spin = hot_spot(folded(SPINNING), SPIN_FUNCTIONS)
    assert spin.value == 200 + 70 + 40 + 20  # s_lock over perform_spin_delay: one stack, once
    sites = {s.caller: s for s in spin.sites}
    # UnpinBuffer and LWLockWaitListLock are static: the caller named is the exported
    # function that called them, and above it the one that called that.
    assert (sites["ReleaseAndReadBuffer"].value, sites["ReleaseAndReadBuffer"].via) == (
        310,
        "index_fetch_heap",
    )
    assert (sites["LWLockAcquire"].value, sites["LWLockAcquire"].via) == (20, "GetSnapshotData")
    assert spin.sites[0].caller == "ReleaseAndReadBuffer"
    snapshot = hot_spot(folded(SPINNING), SNAPSHOT_FUNCTIONS)
    assert snapshot.value == 6 + 3 + 20  # the spin under GetSnapshotData is the snapshot's too
    assert [(s.caller, s.via) for s in snapshot.sites] == [
        ("GetTransactionSnapshot", "PostgresMain")
    ]
    assert hot_spot(folded(QUIET), SPIN_FUNCTIONS) == HotSpot(sorted(SPIN_FUNCTIONS), 0, [])
    # A kernel function of the same name is not PostgreSQL's; a spin with no frame above it
    # has no caller to name.
    kernel = folded({f"{SEND};s_lock_[k]": 5, "perform_spin_delay": 1})
    assert hot_spot(kernel, SPIN_FUNCTIONS).sites == [CallSite("[unknown]", None, 1)]


def recorded_run(
    run_dir: Path, stacks: dict[str, int], clients: tuple[int, ...] = (2, 64)
) -> RunAnalysis:
    """A run store as a run with the perf collector leaves it: steps measured, each step's
    folded profile stored by the collector's own writer; then loaded as any run is."""
    store = RunStore.create(
        run_dir,
        RunMeta(run_dir.name, "hotpage", "test", "", json.dumps({"clients": list(clients)}),
                "pgscope run hotpage.toml --collectors perf", "0", "embedded", "", {}),
    )  # fmt: skip
    store.create_tables("profiles")
    for step_id, n in enumerate(clients, start=1):
        store.begin_step(step_id, "base", n, 1, min(n, 2), 10.0, 2.0, False)
        start = store.query("SELECT started_us FROM steps WHERE step_id = ?", [step_id])[0]
        window = start["started_us"] + 2_000_000
        store.finish_step(
            step_id,
            "ok",
            None,
            {
                "window_start_us": window,
                "window_end_us": window + 10_000_000,
                "tps": 20_000.0 + n,
                "xacts": 200_000 + n,
                "failed": 0,
            },
        )
        # The lowest client count spins little: the same shape, a tenth of the spinning.
        scaled = Counter(
            {
                ("backend", None, stack): value
                if n == max(clients) or "spin" not in stack
                else max(1, value // 10)
                for stack, value in stacks.items()
            }
        )
        store_folded(
            store,
            step_id,
            "cpu",
            scaled,
            started_us=window,
            ended_us=window + 10_000_000,
            hz=99,
            processes=Counter({(4711 + n, "backend"): sum(scaled.values())}),
            unknown_share=0.3,
            note=None,
        )
    store.finish_run("complete")
    store.close()
    return load_analysis(run_dir, bootstrap=0)


def peak(analysis: RunAnalysis) -> FactSheet:
    return next(s for s in analysis.facts if s.peak)


def findings(analysis: RunAnalysis, rule: str) -> list[Finding]:
    assert analysis.diagnosis is not None
    return [f for f in analysis.diagnosis.findings if f.id == rule]


def test_spinning_on_a_hot_page_is_found_and_names_its_caller(tmp_path: Path) -> None:
    analysis = recorded_run(tmp_path / "spin", SPINNING)
    facts = peak(analysis).facts
    assert facts["cpu.samples"].value == 1000
    assert facts["cpu.spin"].value == pytest.approx(0.33)
    assert "94% of them called from ReleaseAndReadBuffer, under index_fetch_heap" in (
        facts["cpu.spin"].label
    )
    caller = facts["cpu.spin_caller.ReleaseAndReadBuffer"]
    assert caller.value == pytest.approx(310 / 330) and caller.source == "perf"
    (spin,) = findings(analysis, "spinlock-contention")
    assert (spin.clients, spin.confidence) == (64, "high")
    assert spin.title.endswith("for a lock taken in ReleaseAndReadBuffer"), spin.title
    assert spin.score == pytest.approx(0.33)
    assert "index's root" in spin.recommendations[0], "the caller's advice comes first"
    shown = {f.name for f in spin.evidence}
    assert {"cpu.spin", "cpu.spin_caller.ReleaseAndReadBuffer", "cpu.samples"} <= shown
    # GetSnapshotData is on 3% of the stacks, the spin under it included: no snapshot finding.
    assert facts["cpu.snapshot"].value == pytest.approx(0.029)
    assert not findings(analysis, "snapshot-cost")


def test_the_same_work_without_spinning_finds_no_hot_spot(tmp_path: Path) -> None:
    analysis = recorded_run(tmp_path / "quiet", QUIET)
    facts = peak(analysis).facts
    assert facts["cpu.spin"].value == 0
    assert not any(name.startswith("cpu.spin_caller.") for name in facts)
    assert facts["cpu.snapshot"].value == pytest.approx(9 / 670)
    assert not findings(analysis, "spinlock-contention")
    assert not findings(analysis, "snapshot-cost")


def test_snapshots_taken_per_statement_are_found_and_name_their_caller(tmp_path: Path) -> None:
    analysis = recorded_run(tmp_path / "snap", SNAPSHOTS, clients=(4, 256))
    facts = peak(analysis).facts
    assert facts["cpu.snapshot"].value == pytest.approx(140 / 801)
    assert facts["cpu.snapshot_caller.GetTransactionSnapshot"].value == pytest.approx(130 / 140)
    (snapshot,) = findings(analysis, "snapshot-cost")
    assert snapshot.title.endswith("GetSnapshotData, called from GetTransactionSnapshot")
    assert (snapshot.clients, snapshot.confidence) == (256, "high")
    assert "REPEATABLE READ" in snapshot.recommendations[0], "the caller's advice comes first"
    assert not findings(analysis, "spinlock-contention")


def sheet(**facts: float) -> FactSheet:
    made = FactSheet("base", 64, peak=True)
    for name, value in facts.items():
        unit = "count" if name == "cpu__samples" else "share"
        made.put(Fact(name.replace("__", "."), value, unit, "test", name))
    return made


@pytest.mark.parametrize(
    ("rule_id", "hot", "against", "reason"),
    [
        ("spinlock-contention", {"cpu__spin": 0.33}, {"host__server_cpus_busy": 0.3}, "half idle"),
        ("spinlock-contention", {"cpu__spin": 0.33}, {"cpu__samples": 60}, "few samples"),
        ("snapshot-cost", {"cpu__snapshot": 0.14}, {"host__server_cpus_busy": 0.3}, "half idle"),
        ("snapshot-cost", {"cpu__snapshot": 0.14}, {"cpu__samples": 60}, "few samples"),
    ],
)
def test_a_hot_spot_on_cpus_that_do_not_limit_throughput_is_weaker(
    rule_id: str, hot: dict[str, float], against: dict[str, float], reason: str
) -> None:
    rule = next(r for r in RULES if r.id == rule_id)
    busy = {"host__server_cpus_busy": 0.97, "wait__class__CPU": 0.9, "cpu__samples": 2000.0}
    strong = evaluate(rule, sheet(**hot, **busy), ADVICE)
    weak = evaluate(rule, sheet(**hot, **{**busy, **against}), ADVICE)
    assert isinstance(strong, Finding) and strong.confidence == "high", strong
    assert isinstance(weak, Finding) and weak.confidence == "medium", weak
    assert reason in weak.weakened_by[0], weak.weakened_by


@pytest.mark.parametrize("path", sorted(FACTS.glob("*.json")), ids=lambda p: p.stem)
def test_recorded_runs_show_no_hot_spot_they_do_not_have(path: Path) -> None:
    data = json.loads(path.read_text())
    found = {f.id for f in diagnose([FactSheet.from_json(s) for s in data["sheets"]]).findings}
    planted = data["expected_top"]
    assert not {"spinlock-contention", "snapshot-cost"} - {planted} & found, (planted, found)


def test_every_profile_fact_the_hot_spot_rules_name_is_made(tmp_path: Path) -> None:
    """What test_diagnose checks on recordings, for facts no recorded run shows (no run here
    spun often enough to name a caller each time): the built profiles make every one."""
    made = {
        *peak(recorded_run(tmp_path / "spin", SPINNING)).facts,
        *peak(recorded_run(tmp_path / "snap", SNAPSHOTS)).facts,
    }
    for rule in (r for r in RULES if r.id in ("spinlock-contention", "snapshot-cost")):
        names = [*rule.score, *rule.evidence, *(c[0] for c in rule.weaken), rule.name_from]
        for name in (n for n in names if n and n.startswith("cpu.")):
            known = (
                any(m.startswith(name[:-1]) for m in made) if name.endswith("*") else name in made
            )
            assert known, f"rule {rule.id} names fact {name!r}, which no built profile makes"
