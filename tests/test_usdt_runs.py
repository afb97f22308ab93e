"""The usdt collector inside `pgscope run`: on by default, across a server restart, and
absent with its reason when tracing cannot work (no root, no bpftrace)."""

from __future__ import annotations

import importlib
import json
import os
import pwd
import shutil
import tempfile
from pathlib import Path

import duckdb
import pytest

from pgscope.analyze.usdt import average_waiting, by_step, checkpoints
from pgscope.collect import default_selection, registry
from pgscope.collect.roles import postmasters_of
from pgscope.proc import child_pids
from pgscope.runner.plan import PlannedStep
from pgscope.runner.run import RunOptions, execute
from pgscope.spec import load_spec
from pgscope.target.embedded import EmbeddedCluster
from pgscope.target.pgbin import PgBinaries
from tests.cli import pgscope as run_cli
from tests.test_usdt import needs_tracing


class Quiet:
    def phase(self, message: str) -> None: ...
    def step_started(self, step: PlannedStep, total: int, seconds: float) -> None: ...
    def progress(self, *args: object) -> None: ...
    def step_finished(self, *args: object) -> None: ...


def store_of(run_dir: Path) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)


def test_usdt_is_on_by_default_in_runs() -> None:
    assert default_selection().get("usdt") == {}


# -- It must show (3): lock waits of a tpcb-like run at scale 1 -------------------------------


@pytest.mark.load
@needs_tracing
def test_a_tpcb_run_shows_lock_waits_on_transactionid_and_tuple(tmp_path: Path) -> None:
    result = run_cli(
        "run", "--workload", "tpcb-like", "--scale", "1", "--clients", "8", "--duration", "6",
        "--warmup", "1", "--repeats", "1", "--collectors", "usdt", "--json",
        "--results-dir", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    run_dir = Path(json.loads(result.stdout)["run_dir"])
    db = store_of(run_dir)
    try:
        assert db.execute(
            "SELECT status, error FROM collectors WHERE name = 'usdt'"
        ).fetchone() == (
            "complete",
            None,
        )
        (step,) = by_step(db, "lock_wait")
        waits = {(s.object, s.mode): s for s in step.events}
        # 8 clients updating the one pgbench_branches row: they queue behind each other's
        # transaction (ShareLock on its transactionid) and for the row (tuple ExclusiveLock)
        assert waits[("transactionid", "ShareLock")].count > 10, waits
        assert waits[("tuple", "ExclusiveLock")].count > 0, waits
        assert all(s.hist_count == s.count for s in step.events)
        # Little's law: at most the 8 clients can be waiting at any moment
        waiting = average_waiting(db, "lock_wait", step.start_us, step.end_us)
        assert 0 < waiting[("transactionid", "ShareLock")] <= 8, waiting
        assert sum(waiting.values()) <= 8, waiting
        lwlock = by_step(db, "lwlock_wait")[0].events
        assert {s.object for s in lwlock} & {"LockManager", "BufferContent", "WALWrite"}
        # the CHECKPOINT the runner issues before the step is traced too
        traced = checkpoints(db)
        assert any(
            c.status == "complete" and c.flags_text == "immediate force wait" for c in traced
        )
        assert all(c.start_us < step.start_us for c in traced)
    finally:
        db.close()
    # The LWLock and lock facts come from these kernel-side histograms: the cell's traced
    # wait time over the clients' session time (no activity sampling in this run).
    doc = json.loads(result.stdout)
    (cell,) = doc["locks"]["by_cell"]
    facts = next(s["facts"] for s in doc["facts"] if s["clients"] == 8)
    session_ns = 8 * cell["seconds"] * 1e9
    for prefix, key in (("lwlock", "lwlocks"), ("lock", "lock_waits")):
        traced_ns = sum(s["total_ns"] for s in cell[key])
        share = facts[f"{prefix}.traced_share"]
        assert share["source"] == "usdt" and "clients' session time" in share["label"], share
        assert share["value"] == pytest.approx(min(1.0, traced_ns / session_ns), rel=1e-9)
    assert facts["lock.share.transactionid"]["value"] > 0
    top = facts["lwlock.top"]
    assert top["source"] == "usdt" and "traced in the kernel" in top["label"], top
    tranche = next(n for n in facts if n.startswith("lwlock.top.")).rsplit(".", 1)[-1]
    assert top["value"] == facts[f"lwlock.share.{tranche}"]["value"]
    for finding in doc["findings"]:
        if finding["id"] == "lwlock-hotspot":
            assert finding["evidence"][0]["source"] == "usdt", finding


# -- a restart between variants: the collector re-attaches to the new postmaster ---------------


@pytest.mark.load
@needs_tracing
def test_the_collector_follows_a_server_restart(tmp_path: Path) -> None:
    loaded = load_spec(
        "scaling",
        overrides={
            "clients": [2],
            "duration": 2,
            "warmup": 0,
            "repeats": 1,
            "scale": 1,
            "order": "sequential",
            "variants": {"a": {"shared_buffers": "128MB"}, "b": {"shared_buffers": "160MB"}},
            "collectors": {"usdt": {"programs": ["checkpoint", "locks"]}},
        },
    )
    outcome = execute(loaded, RunOptions(tmp_path, "pytest"), Quiet())
    assert outcome.status == "complete", outcome.error
    db = store_of(outcome.run_dir)
    try:
        assert db.execute("SELECT status, error FROM collectors").fetchone() == ("complete", None)
        gaps = db.execute("SELECT reason FROM collector_gaps WHERE name = 'usdt'").fetchall()
        assert len(gaps) == 1 and "server restarted" in gaps[0][0], gaps
        rows = db.execute(
            "SELECT pid, flags_text, status FROM usdt_checkpoints ORDER BY start_us"
        ).fetchall()
    finally:
        db.close()
    # before step 1 (old checkpointer), the shutdown checkpoint of the restart (old), before
    # step 2 (the new server's checkpointer, traced by the re-attached programs)
    assert [(flags, status) for _, flags, status in rows] == [
        ("immediate force wait", "complete"),
        ("shutdown immediate", "complete"),
        ("immediate force wait", "complete"),
    ], rows
    assert rows[0][0] == rows[1][0] != rows[2][0]


# -- It must show (4): no root, no bpftrace: the run completes and says why -------------------


def _usdt_row(run_dir: Path) -> tuple[object, ...]:
    db = store_of(run_dir)
    try:
        row = db.execute(
            "SELECT available, reason, status FROM collectors WHERE name = 'usdt'"
        ).fetchone()
        status = db.execute("SELECT status FROM run").fetchone()
    finally:
        db.close()
    assert row is not None and status == ("complete",)
    return tuple(row)


RUN_MODULES = (
    "pgscope.cli",
    "pgscope.runner",
    "pgscope.spec",
    "pgscope.analyze.load",
    "pgscope.cli.progress",
    "pgscope.render.console",
    "pgscope.render.json_doc",
    "pgscope.render.outputs",
)
RUN_ARGS = (
    "run", "--workload", "select-only", "--scale", "1", "--clients", "1", "--duration", "1",
    "--warmup", "0", "--repeats", "1", "--collectors", "usdt",
)  # fmt: skip


@pytest.mark.server
def test_a_run_without_bpftrace_completes_and_says_why(pg: PgBinaries, tmp_path: Path) -> None:
    result = run_cli(
        *RUN_ARGS, "--results-dir", str(tmp_path), env={"PATH": str(pg.bindir)}
    )  # a PATH without bpftrace
    assert result.returncode == 0, result.stderr
    assert "collector usdt unavailable: " in result.stderr
    (run_dir,) = tmp_path.iterdir()
    available, reason, status = _usdt_row(run_dir)
    assert (available, status) == (False, "off")
    assert "bpftrace is not installed (fix: apt-get install bpftrace)" in str(reason)


@pytest.mark.server
def test_a_run_without_root_completes_and_says_why(tmp_path: Path) -> None:
    """As root, the run happens in a child that becomes the `postgres` account. The child is
    forked after importing what a run needs: this interpreter lives under /root, which that
    account cannot read."""
    if os.geteuid() != 0:
        result = run_cli(*RUN_ARGS, "--results-dir", str(tmp_path))
        assert result.returncode == 0, result.stderr
        (run_dir,) = tmp_path.iterdir()
        reason = _usdt_row(run_dir)
    else:
        work = Path(tempfile.mkdtemp(prefix="usdt-nonroot-"))  # in the suite's 0755 TMPDIR
        try:
            reason = _usdt_row(_run_as_postgres(work))
        finally:
            shutil.rmtree(work)
    available, why, status = reason
    assert (available, status) == (False, "off")
    assert str(why).startswith("tracing needs root"), why


def _run_as_postgres(work: Path) -> Path:
    from pgscope.cli import main

    account = pwd.getpwnam("postgres")
    os.chown(work, account.pw_uid, account.pw_gid)
    # What `pgscope run` imports, including what its functions import lazily; a new lazy
    # import on that path shows here as a ModuleNotFoundError to add to the list.
    for module in (*RUN_MODULES, "importlib.readers", "doctest"):
        importlib.import_module(module)
    registry()  # every collector module
    from pgscope.analyze.model import _adapter

    _adapter()  # pydantic builds the run document's schema lazily, importing as it goes
    child = os.fork()
    if child == 0:
        code = 99
        try:
            os.setgroups([])
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
            os.environ["HOME"] = str(work)
            code = main(
                [*RUN_ARGS, "--results-dir", str(work / "results"), "--work-dir", str(work)]
            )
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    (run_dir,) = (work / "results").iterdir()
    return run_dir


# -- another cluster of the same binary pays the probe traps: the run says so -----------------


@pytest.mark.load
@needs_tracing
def test_a_traced_run_names_the_other_clusters_of_its_binary(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    bystander = cluster.postmaster_pid
    assert bystander is not None
    assert bystander in postmasters_of(cluster.pg.path("postgres"))
    assert not set(child_pids(bystander)) & set(postmasters_of(cluster.pg.path("postgres")))
    result = run_cli(
        "run", "--workload", "select-only", "--scale", "1", "--clients", "1", "--duration", "1",
        "--warmup", "0", "--repeats", "1", "--collectors", "usdt",
        "--results-dir", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "other cluster(s) run" in line]
    assert said and str(bystander) in said[0], result.stderr
    untraced = run_cli(
        "run", "--workload", "select-only", "--scale", "1", "--clients", "1", "--duration", "1",
        "--warmup", "0", "--repeats", "1", "--collectors", "activity",
        "--results-dir", str(tmp_path / "untraced"),
    )  # fmt: skip
    assert untraced.returncode == 0, untraced.stderr
    assert "other cluster(s) run" not in untraced.stderr, "no tracing: nothing to warn about"
