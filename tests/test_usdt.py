"""Tracing PostgreSQL's static probes with bpftrace, for real: `pgscope trace` and the usdt
collector against embedded clusters under load (root and bpftrace required)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pytest
from elftools.elf.elffile import ELFFile

from pgscope.collect.base import CollectorEnv
from pgscope.collect.tracing.elfprobes import list_probes
from pgscope.collect.tracing.usdt import UsdtCollector
from pgscope.proc import server_account
from pgscope.session import SessionTarget, collect
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.local import LocalServer
from pgscope.target.pgbin import PgBinaries, find_binaries
from tests.cli import one_line_error, pgscope, wait_for_line
from tests.poll import elapse, wait_until
from tests.servers import SMALL_SERVER, wait_for_sessions

_ENV = CollectorEnv(find_binaries(), "embedded", None, os.geteuid() == 0)
_AVAILABLE = UsdtCollector.check(_ENV)
_SKIP = pytest.mark.skipif(
    not _AVAILABLE.ok, reason=f"usdt tracing is unavailable here: {_AVAILABLE.reason}"
)
T = TypeVar("T")


def needs_tracing(test: T) -> T:
    """Marked `tracing`, and skipped where usdt tracing is unavailable."""
    return pytest.mark.tracing(_SKIP(test))


def pgbench(pg: PgBinaries, cluster: EmbeddedCluster, *args: str) -> list[str]:
    c = cluster.conn.params
    return [str(pg.path("pgbench")), "-h", c["host"], "-p", c["port"], "-U", c["user"], *args]


def init_pgbench(pg: PgBinaries, cluster: EmbeddedCluster) -> None:
    subprocess.run(
        pgbench(pg, cluster, "-i", "-q", "-s", "1", "postgres"), check=True, capture_output=True
    )


def open_store(run_dir: str | Path) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(str(Path(run_dir) / "run.duckdb"), read_only=True)


def semaphore(pid: int, binary: Path, probe: str) -> int:
    """A USDT probe's semaphore in a live process: the note's address, located through the
    process's mapping of the binary's file (PIE), read from /proc/PID/mem."""
    (address,) = {p.semaphore for p in list_probes(binary) if p.name == probe}
    with binary.open("rb") as handle:
        for segment in ELFFile(handle).iter_segments():
            start = segment["p_vaddr"]
            if segment["p_type"] == "PT_LOAD" and start <= address < start + segment["p_filesz"]:
                file_offset = address - start + segment["p_offset"]
                break
        else:
            raise AssertionError(f"semaphore of {probe} is in no loaded segment")
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5] == str(binary):
            low, high = (int(x, 16) for x in fields[0].split("-"))
            offset = int(fields[2], 16)
            if offset <= file_offset < offset + high - low:
                with open(f"/proc/{pid}/mem", "rb") as mem:
                    mem.seek(low + file_offset - offset)
                    return int(struct.unpack("<H", mem.read(2))[0])
    raise AssertionError(f"PID {pid} does not map {binary}")


def foreign_tracers() -> list[int]:
    """bpftrace processes on the host that this test session did not start."""
    mark = f"PGSCOPE_TEST_SESSION={os.environ['PGSCOPE_TEST_SESSION']}".encode()
    found = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if (
                comm.read_text().strip() == "bpftrace"
                and mark not in (comm.parent / "environ").read_bytes()
            ):
                found.append(int(comm.parent.name))
        except OSError:
            continue
    return found


@pytest.fixture
def other_cluster(pg: PgBinaries, tmp_path: Path) -> Iterator[EmbeddedCluster]:
    """Another engineer's cluster, running the same binary."""
    with EmbeddedCluster(
        pg, server_account(None), tmp_path / "other.log", {**benchmark_defaults(16), **SMALL_SERVER}
    ) as running:
        yield running


# -- It must show (1): LWLock waits under a tpcb-like load ------------------------------------


@pytest.mark.load
@needs_tracing
def test_trace_lwlock_lists_tranches_whose_histograms_add_up(
    pg: PgBinaries, cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    init_pgbench(pg, cluster)
    load = subprocess.Popen(
        pgbench(pg, cluster, "-c", "8", "-j", "2", "-T", "40", "postgres"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_sessions(cluster, 8)
        result = pgscope(
            "trace", "lwlock", "--data-dir", str(cluster.data_dir), "--duration", "6",
            "--json", "--results-dir", str(tmp_path),
        )  # fmt: skip
    finally:
        load.terminate()
        load.wait(30)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["status"] == "complete" and doc["program"] == "lwlock"
    assert doc["covered_s"] >= 5.5
    waits = doc["latency"]
    tranches = {w["object"] for w in waits}
    # one branch row, 8 clients: every transaction queues on the same locks
    assert "LockManager" in tranches, tranches
    assert len(tranches & {"LockManager", "BufferContent", "WALWrite", "WALInsert"}) >= 2
    for w in waits:
        assert w["event"] == "lwlock_wait"
        assert w["mode"] in ("exclusive", "shared", "wait_until_free"), w
        assert w["count"] > 0
        assert sum(b["count"] for b in w["histogram"]) == w["count"], w
        # total time comes from its own map (sum of nanoseconds): it must fit the histogram
        lowest, highest = w["histogram"][0]["lo_ns"], w["histogram"][-1]["hi_ns"]
        assert lowest * w["count"] <= w["total_ns"] <= highest * w["count"], w
    db = open_store(doc["run_dir"])
    try:
        per_second = db.execute(
            "SELECT l.second_us, l.object, l.mode, l.count, h.n FROM usdt_latency l JOIN "
            "(SELECT second_us, object, mode, sum(count) AS n FROM usdt_latency_hist "
            "GROUP BY ALL) h USING (second_us, object, mode)"
        ).fetchall()
        assert per_second and all(count == n for _, _, _, count, n in per_second)
        seconds = {s for s, *_ in per_second}
        assert len(seconds) >= 5, "one row per second per tranche, not one lump"
        by_key = db.execute(
            "SELECT object, mode, sum(count) FROM usdt_latency GROUP BY ALL"
        ).fetchall()
        assert {(o, m): n for o, m, n in by_key} == {
            (w["object"], w["mode"]): w["count"] for w in waits
        }
        flushes = db.execute(
            "SELECT second_us, end_us FROM usdt_seconds WHERE program = 'lwlock' ORDER BY 1"
        ).fetchall()
        # flushes fall on wall-clock seconds, like pgbench's per-second figures
        assert all(0 <= end - (s + 1_000_000) < 300_000 for s, end in flushes[:-1]), flushes
    finally:
        db.close()


# -- It must show (2): one CHECKPOINT, its phases, its buffers --------------------------------


def _buffers_checkpoint(cluster: EmbeddedCluster) -> int:
    with cluster.conn.connect() as session:
        row = session.execute("SELECT buffers_checkpoint FROM pg_stat_bgwriter").fetchone()
    assert row is not None
    return int(row[0])


@needs_tracing
def test_a_checkpoint_during_trace_checkpoint_is_one_record_that_adds_up(
    pg: PgBinaries, cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    init_pgbench(pg, cluster)
    with cluster.conn.connect() as session:
        session.execute("CHECKPOINT")
        session.execute("UPDATE pgbench_accounts SET abalance = abalance + 1")  # ~1640 pages
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgscope", "trace", "checkpoint", "--data-dir",
         str(cluster.data_dir), "--duration", "6", "--json", "--results-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for_line(proc, "usdt: tracing", timeout=90)
    before = _buffers_checkpoint(cluster)
    with cluster.conn.connect() as session:
        session.execute("CHECKPOINT")
    # The checkpointer reports its statistics after the checkpoint.
    with contextlib.suppress(AssertionError):
        wait_until(lambda: _buffers_checkpoint(cluster) != before, "the checkpoint's report", 10)
    after = _buffers_checkpoint(cluster)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    doc = json.loads(out)
    complete = [c for c in doc["checkpoints"] if c["status"] == "complete"]
    assert len(complete) == 1, doc["checkpoints"]
    ckpt = complete[0]
    assert ckpt["flags"] == "immediate force wait"
    phases = [p["phase"] for p in ckpt["phases"]]
    for name in ("clog", "subtrans", "multixact", "marking", "write", "sync"):
        assert name in phases, phases
    assert phases.index("marking") < phases.index("write") < phases.index("sync")
    assert abs(ckpt["total_ns"] - ckpt["phases_ns"]) <= 0.05 * ckpt["total_ns"], ckpt
    assert ckpt["buffers_written"] == after - before > 1000, (ckpt, before, after)
    assert ckpt["buffers_to_write"] == ckpt["buffers_written"]
    # every buffer written was flushed once: the histogram counts the same buffers
    assert ckpt["flushes"] == ckpt["buffers_written"]
    assert sum(b["count"] for b in ckpt["flush_histogram"]) == ckpt["flushes"]
    write = next(p for p in ckpt["phases"] if p["phase"] == "write")
    assert 0 < ckpt["flush_ns"] <= write["duration_ns"]
    assert doc["counters"]["checkpoint_buffers_written"] == ckpt["buffers_written"]
    log = (cluster.log_path).read_text()
    assert "checkpoint complete: wrote" in log


# -- the whole cluster, later backends included, and nothing of other clusters ----------------


def _collect_while(
    target: LocalServer,
    programs: list[str],
    seconds: float,
    results: Path,
    workload: Callable[[], None],
) -> Path:
    """Trace for `seconds` in this (main) thread; run `workload` in another thread once the
    collector is attached. Returns the run folder; re-raises the workload's failure."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            workload()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run)

    def say(message: str) -> None:
        if message.startswith("usdt: tracing"):
            thread.start()

    result = collect(
        name="usdt-test",
        selection={"usdt": {"programs": programs}},
        target=SessionTarget(None, target),
        pg=find_binaries(),
        duration_s=seconds,
        results_dir=results,
        command_line="pytest",
        say=say,
    )
    thread.join(60)
    if failure:
        raise failure[0]
    assert result.status == "complete" and not result.collectors_failed, result
    return result.run_dir


def _lock_wait(conn_params: Any, first: str, second: str, release: str, hold_s: float) -> int:
    """Session 1 runs `first` and holds; session 2, a backend started now, runs `second` and
    waits; once pg_locks shows it waiting, session 1 holds on `hold_s` more, then runs
    `release`: the wait lasts `hold_s` at least, however late session 2 got to its lock.
    Returns session 2's PID."""
    holder = conn_params.connect()
    holder.execute(first)
    waiter = conn_params.connect()
    pid = int(waiter.execute("SELECT pg_backend_pid()").fetchone()[0])

    def hold_then_release() -> None:
        # The holder looks itself: no backend more, and inside the row lock's transaction
        # its reads commit nothing (the test counts the cluster's commits).
        wait_until(
            lambda: holder.execute(
                "SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted", (pid,)
            ).fetchone(),
            f"session {pid} waiting for its lock",
        )
        holder.execute("SELECT pg_sleep(%s)", (hold_s,))
        holder.execute(release)

    releaser = threading.Thread(target=hold_then_release)
    releaser.start()
    waiter.execute(second)
    releaser.join()
    waiter.close()
    holder.close()
    return pid


@needs_tracing
def test_traces_backends_that_start_later_and_nothing_of_another_cluster(
    pg: PgBinaries, cluster: EmbeddedCluster, other_cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    binary = pg.path("postgres")
    for c in (cluster, other_cluster):
        with c.conn.connect() as session:
            session.execute(
                "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0)"
            )
    # sessions open across the whole trace: their semaphores must come back down afterwards
    lingering = [cluster.conn.connect(), other_cluster.conn.connect()]
    lingering_pids = [int(s.execute("SELECT pg_backend_pid()").fetchone()[0]) for s in lingering]
    before = [semaphore(pid, binary, "lock__wait__start") for pid in lingering_pids]
    quiet_before = not foreign_tracers()
    seen: dict[str, Any] = {}

    def workload() -> None:
        with cluster.conn.connect() as late:  # a backend forked after the trace attached
            seen["late_semaphore"] = semaphore(
                int(late.execute("SELECT pg_backend_pid()").fetchone()[0]),
                binary,
                "transaction__start",
            )
            for _ in range(211):
                late.execute("SELECT 1")
        seen["waiter"] = _lock_wait(
            cluster.conn,
            "BEGIN; UPDATE t SET v = v + 1 WHERE id = 1",
            "UPDATE t SET v = v + 1 WHERE id = 1",
            "COMMIT",
            0.3,
        )
        # the other cluster: a different kind of wait, and many more transactions
        seen["other_semaphore"] = semaphore(lingering_pids[1], binary, "lock__wait__start")
        _lock_wait(
            other_cluster.conn,
            "SELECT pg_advisory_lock(42)",
            "SELECT pg_advisory_lock(42)",
            "SELECT pg_advisory_unlock(42)",
            0.3,
        )
        with other_cluster.conn.connect() as busy:
            for _ in range(1000):
                busy.execute("SELECT 1")

    target = LocalServer.from_data_dir(cluster.data_dir)
    run_dir = _collect_while(target, ["locks", "io"], 6, tmp_path, workload)
    db = open_store(run_dir)
    try:
        waits = db.execute(
            "SELECT object, mode, sum(count), sum(total_ns) FROM usdt_latency "
            "WHERE event = 'lock_wait' GROUP BY ALL"
        ).fetchall()
        commits = db.execute(
            "SELECT sum(value) FROM usdt_counters WHERE counter = 'xact_commit'"
        ).fetchone()
    finally:
        db.close()
    # the waiting backend started after the trace attached, and its one wait is there
    assert [(o, m, n) for o, m, n, _ in waits] == [("transactionid", "ShareLock", 1)], waits
    assert 0.3e9 <= waits[0][3] <= 5e9, waits
    # 211 autocommit SELECTs of a late backend, plus connection start-ups; not the other
    # cluster's 1000
    assert commits is not None and 211 <= commits[0] < 211 + 150, commits
    # how it works: the kernel raised the semaphores in every process mapping the binary,
    # the late backend and the other cluster's alike (the predicate kept the latter out) ...
    assert seen["late_semaphore"] >= 1 and seen["other_semaphore"] >= 1, seen
    # ... and lowered them when the trace ended. Anyone else tracing these probes on the
    # host raises them too (they are host-wide): compare only when nobody else was tracing.
    after = [semaphore(pid, binary, "lock__wait__start") for pid in lingering_pids]
    if quiet_before and not foreign_tracers():
        assert after == before, (before, after)
    else:
        print(f"other bpftrace processes on the host: semaphores {before} -> {after} unchecked")
    for session in lingering:
        session.close()


# -- interruption, the --dsn form, bad input, doctor ------------------------------------------


@needs_tracing
def test_sigint_keeps_what_was_traced(
    pg: PgBinaries, cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgscope", "trace", "io", "--data-dir", str(cluster.data_dir),
         "--duration", "120", "--results-dir", str(tmp_path / "results")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for_line(proc, "usdt: tracing", timeout=90)
    with cluster.conn.connect() as session:
        for _ in range(50):
            session.execute("SELECT 1")
    elapse(2.5, "two seconds traced, each a row")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "kept what was traced in" in err.splitlines()[-1]
    (run_dir,) = (tmp_path / "results").iterdir()
    db = open_store(run_dir)
    try:
        assert db.execute("SELECT status FROM run").fetchone() == ("interrupted",)
        assert db.execute("SELECT status, error FROM collectors").fetchone() == ("complete", None)
        seconds = db.execute("SELECT count(*) FROM usdt_seconds").fetchone()
        commits = db.execute(
            "SELECT sum(value) FROM usdt_counters WHERE counter = 'xact_commit'"
        ).fetchone()
    finally:
        db.close()
    assert seconds is not None and seconds[0] >= 2
    assert commits is not None and commits[0] >= 50


@needs_tracing
def test_a_trace_ends_early_and_says_so_when_its_server_stops(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgscope", "trace", "locks", "--data-dir", str(cluster.data_dir),
         "--duration", "120", "--results-dir", str(tmp_path / "results")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for_line(proc, "usdt: tracing", timeout=90)
    pid = cluster.postmaster_pid
    started = time.monotonic()
    cluster.stop()
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - started < 30, "the trace should end soon after the server"
    assert proc.returncode == 5, err
    error = one_line_error(subprocess.CompletedProcess([], 5, out, err))
    assert f"postmaster {pid} exited; nothing left to trace" in error
    assert "kept what was recorded in" in error


@needs_tracing
def test_trace_by_dsn_finds_the_local_server(cluster: EmbeddedCluster, tmp_path: Path) -> None:
    result = pgscope(
        "trace", "locks", "--dsn", cluster.conn.conninfo(), "--duration", "2", "--json",
        "--results-dir", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["postmaster_pid"] == cluster.postmaster_pid
    assert doc["counters"] == {"deadlocks": 0}
    assert doc["collectors"][0]["status"] == "complete"


def test_trace_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    cases = [
        (["trace", "lwlock"], 2, "give --data-dir or --dsn"),
        (["trace", "lwlocks", "--data-dir", str(tmp_path)], 2, "lwlocks"),
        (["trace", "locks", "--hold-time", "--data-dir", str(tmp_path)], 2, "--hold-time"),
        (["trace", "lwlock", "--data-dir", str(tmp_path)], 2, "not a PostgreSQL data directory"),
        (["trace", "io", "--data-dir", str(tmp_path), "--duration", "0"], 2, "--duration"),
        (["trace", "io", "--dsn", f"host={tmp_path} port=1"], 5, "cannot connect"),
    ]
    for args, code, words in cases:
        result = pgscope(*args, "--results-dir", str(tmp_path / "results"))
        assert result.returncode == code, (args, result.stderr)
        assert words in one_line_error(result), (args, result.stderr)
    assert not (tmp_path / "results").exists(), "no run folder for refused input"


def test_doctor_gives_the_usdt_verdict() -> None:
    result = pgscope("doctor", "--json")
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    usdt = checks["collector usdt"]
    assert usdt["ok"] == _AVAILABLE.ok
    if usdt["ok"]:
        assert "static probes" in usdt["detail"] and "on by default" in usdt["detail"]
    else:
        assert usdt["fix"] == _AVAILABLE.reason
