"""Faults injected into real processes: signals at any phase, a server killed mid-step, a
collector killed mid-run, a disk that fills up, a user's server that must see no writes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from pgscope.collect.roles import process_role
from pgscope.proc import child_pids
from pgscope.target.embedded import EmbeddedCluster
from tests.cli import one_line_error, pgscope, start, stop_within, wait_for_line
from tests.poll import elapse, wait_until
from tests.servers import setting, tmpfs
from tests.suite import describe, server_processes, wait_for_nothing_left, wait_for_programs

CAN_TRACE = os.geteuid() == 0 and bool(shutil.which("bpftrace")) and bool(shutil.which("perf"))
BASE = ["--set", "shared_buffers=128MB", "--warmup", "1", "--repeats", "1"]


def only_run(results: Path) -> Path:
    [run_dir] = [p for p in results.iterdir() if (p / "run.duckdb").is_file()]
    return run_dir


def query(run_dir: Path, sql: str) -> list[tuple[object, ...]]:
    db = duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


@pytest.mark.server
def test_sigterm_during_initialisation_stops_everything(tmp_path: Path) -> None:
    before = server_processes()
    proc = start(
        [
            "run",
            "scaling",
            "--clients",
            "1,2",
            "--duration",
            "5",
            "--scale",
            "40",
            *BASE,
            "--results-dir",
            str(tmp_path),
        ]
    )
    wait_for_line(proc, "initialising pgbench tables")
    wait_for_programs(before, {"pgbench"})  # inside pgbench -i
    err = stop_within(proc, signal.SIGTERM)
    assert proc.returncode == 143, err
    assert one_line_error(subprocess.CompletedProcess([], 143, "", err)).startswith(
        "pgscope: error: interrupted by SIGTERM"
    )
    wait_for_nothing_left(before)
    run_dir = only_run(tmp_path)
    assert query(run_dir, "SELECT status FROM run") == [("interrupted",)]
    assert (run_dir / "report.html").is_file(), "an interrupted run still gets its report"


@pytest.mark.server
@pytest.mark.tracing
@pytest.mark.skipif(not CAN_TRACE, reason="needs root, bpftrace and perf")
def test_sigint_mid_step_with_tracers_running_stops_them_all(tmp_path: Path) -> None:
    before = server_processes()
    proc = start(
        [
            "run",
            "scaling",
            "--clients",
            "2,3",
            "--duration",
            "20",
            "--scale",
            "1",
            *BASE,
            "--collectors",
            "activity,usdt,perf",
            "--results-dir",
            str(tmp_path),
        ]
    )
    wait_for_line(proc, r"tracing lwlock")
    wait_for_programs(before, {"bpftrace", "perf", "pgbench", "postgres"})
    elapse(2, "pgbench's first progress rows (one a second), measured while traced")
    err = stop_within(proc, signal.SIGINT)
    assert proc.returncode == 130, err
    wait_for_nothing_left(before)  # bpftrace, perf, pgbench and postgres all gone
    run_dir = only_run(tmp_path)
    assert query(run_dir, "SELECT count(*) FROM timeline")[0][0] > 0, "rows measured are kept"


@pytest.mark.server
@pytest.mark.parametrize("moment", ["stopping the embedded cluster", "report: "])
def test_sigint_during_teardown_or_after_it_keeps_the_run(tmp_path: Path, moment: str) -> None:
    """The last moments of a run: while the cluster stops (before the report is written), or
    right after the report is announced. Either way: one line, exit 130 or a clean 0, nothing
    left behind, and a store that opens."""
    before = server_processes()
    proc = start(
        [
            "run",
            "scaling",
            *("--clients", "1", "--duration", "1", "--scale", "1", *BASE),
            *("--collectors", "activity,pgstats", "--results-dir", str(tmp_path)),
        ]
    )
    wait_for_line(proc, re.escape(moment))
    err = stop_within(proc, signal.SIGINT)
    assert "Traceback" not in err, err
    if proc.returncode != 0:  # the signal arrived before pgscope was done
        assert proc.returncode == 130, err
        one_line_error(subprocess.CompletedProcess([], 130, "", err))
    wait_for_nothing_left(before)  # no postgres or pgbench may remain
    run_dir = only_run(tmp_path)
    assert query(run_dir, "SELECT status FROM steps") == [("ok",)], "the finished step is kept"
    report = pgscope("report", str(run_dir), "--format", "json")
    assert report.returncode == 0, report.stderr


@pytest.mark.server
def test_a_killed_server_fails_its_step_then_the_run_goes_on(tmp_path: Path) -> None:
    proc = start(
        [
            "run",
            "scaling",
            "--clients",
            "1,2,3",
            "--order",
            "sequential",
            "--duration",
            "6",
            "--scale",
            "1",
            *BASE,
            "--collectors",
            "activity,pgstats",
            "--json",
            "--results-dir",
            str(tmp_path),
        ]
    )
    wait_for_line(proc, r"step 1/3 .* tps")  # step 1 done: step 2 is starting
    wait_for_programs(set(), {"pgbench"})  # step 2's load under way
    postmaster = next(
        int(Path(d).name)
        for d in (f"/proc/{p}" for p in server_processes())
        if Path(d, "cmdline").exists() and b"postgres\x00-D" in Path(d, "cmdline").read_bytes()
    )
    os.kill(postmaster, signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 7, err  # partial: a step failed, the others did not
    doc = json.loads(out)
    statuses = [(s["step_id"], s["status"]) for s in doc["steps"]]
    assert statuses == [(1, "ok"), (2, "failed"), (3, "ok")], statuses
    assert doc["steps"][1]["error"], "the failed step says why"
    events = query(
        Path(doc["run_dir"]),
        "SELECT kind, detail FROM events WHERE kind LIKE 'server-%' ORDER BY ts_us",
    )
    assert [k for k, _ in events] == ["server-died", "server-restarted"]
    assert "killed by signal 9" in str(events[0][1])
    message = one_line_error(subprocess.CompletedProcess([], 7, "", err))
    assert message.startswith("pgscope: error: 1 of 3 steps failed (first: step 2, ")


@pytest.mark.server
@pytest.mark.tracing
@pytest.mark.skipif(not CAN_TRACE, reason="needs root and bpftrace")
def test_a_killed_tracer_leaves_a_recorded_gap_and_the_run_goes_on(tmp_path: Path) -> None:
    before = server_processes()
    proc = start(
        [
            "run",
            "scaling",
            "--clients",
            "1,2,3",
            "--order",
            "sequential",
            "--duration",
            "4",
            "--scale",
            "1",
            *BASE,
            "--collectors",
            "activity,usdt",
            "--json",
            "--results-dir",
            str(tmp_path),
        ]
    )
    wait_for_line(proc, r"step 1/3 .* tps")
    tracers = [
        p
        for p in server_processes() - before
        if Path(f"/proc/{p}/comm").exists()
        and Path(f"/proc/{p}/comm").read_text().strip() == "bpftrace"
    ]
    assert tracers
    for pid in tracers:
        os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    doc = json.loads(out)
    assert all(s["status"] == "ok" for s in doc["steps"]), "the load was not disturbed"
    usdt = next(c for c in doc["environment"]["collectors"] if c["name"] == "usdt")
    assert usdt["status"] == "failed" and usdt["error"]
    gaps = [g for g in doc["environment"]["gaps"] if g["name"] == "usdt"]
    assert gaps and gaps[0]["end_us"] > gaps[0]["start_us"]
    html = (Path(doc["run_dir"]) / "report.html").read_text()
    assert "Gaps" in html and "stopped collecting" in html


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "small", "100m") as mount:
        yield mount


def test_a_nearly_full_results_disk_is_refused_before_starting(small_disk: Path) -> None:
    (small_disk / "filler").write_bytes(b"\0" * 60 * 2**20)
    result = pgscope(
        "run",
        "scaling",
        "--clients",
        "1,2,3",
        "--duration",
        "2",
        *BASE,
        "--results-dir",
        str(small_disk / "results"),
    )
    assert result.returncode == 4
    assert "MB free; this run needs at least 64 MB" in one_line_error(result)
    assert not (small_disk / "results").exists() or not any((small_disk / "results").iterdir())


@pytest.mark.server
def test_a_disk_that_fills_mid_run_keeps_a_readable_store(small_disk: Path) -> None:
    results = small_disk / "results"
    proc = start(
        [
            "run",
            "scaling",
            "--clients",
            "1,2,3,4",
            "--order",
            "sequential",
            "--duration",
            "4",
            "--scale",
            "1",
            *BASE,
            "--collectors",
            "activity",
            "--results-dir",
            str(results),
        ]
    )
    wait_for_line(proc, r"step 1/4 .* tps")
    # Fill it all: the run keeps writing meanwhile, so the filler itself may hit the end.
    free = shutil.disk_usage(small_disk).free
    with contextlib.suppress(OSError), (small_disk / "filler").open("wb") as filler:
        filler.write(b"\0" * free)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode != 0
    assert "Traceback" not in err
    assert "the disk is full" in one_line_error(subprocess.CompletedProcess([], 1, "", err))
    (small_disk / "filler").unlink()
    run_dir = only_run(results)
    report = pgscope("report", str(run_dir), "--format", "json")
    assert report.returncode == 0, report.stderr
    steps = json.loads(report.stdout)["steps"]
    assert steps[0]["status"] == "ok" and steps[0]["tps"] > 0, "what was written is intact"


def test_a_read_only_run_on_a_users_server_issues_no_write(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    subprocess.run(
        ["pgbench", "-i", "-s", "1", "-q", cluster.conn.conninfo()], check=True, capture_output=True
    )
    with cluster.connect() as conn:
        conn.execute("ALTER SYSTEM SET log_statement = 'all'")
        conn.execute("SELECT pg_reload_conf()")
    wait_until(lambda: setting(cluster, "log_statement") == "all", "log_statement = all")
    log_start = cluster.log_path.stat().st_size
    secret = "a-secret-to-keep-4711"
    dsn = (
        f"host={cluster.socket_dir} port={cluster.port} user=postgres dbname=postgres "
        f"password={secret}"
    )
    proc = start(
        [
            "run",
            "scaling",
            "--dsn",
            dsn,
            "--clients",
            "1,2,3",
            "--duration",
            "2",
            "--warmup",
            "0",
            "--repeats",
            "1",
            "--scale",
            "1",
            "--results-dir",
            str(tmp_path / "r"),
        ]
    )
    titles = ""  # (no --json: a large document on an unread pipe would block the child)
    while proc.poll() is None:  # the process titles while it runs
        titles += subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        elapse(0.3, "between two readings of the process titles")
    _, err = proc.communicate()
    assert proc.returncode == 0, err
    assert secret not in titles, "a password in a process title"
    logged = cluster.log_path.read_bytes()[log_start:].decode(errors="replace")
    statements = re.findall(r"LOG:  (?:statement|execute [^:]*): (.*)", logged)
    assert len(statements) > 100, "log_statement = all saw the run"
    writes = [
        s
        for s in statements
        if re.match(
            r"\s*(INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|TRUNCATE|COPY|VACUUM|CHECKPOINT|GRANT|"
            r"REINDEX|CLUSTER|LOCK)\b",
            s,
            re.IGNORECASE,
        )
    ]
    assert writes == [], writes[:5]
    for path in (tmp_path / "r").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"the password is in {path}"


@pytest.mark.server
def test_what_a_killed_run_left_is_found_by_doctor_and_removed_by_the_next_run(
    tmp_path: Path,
) -> None:
    """SIGKILL leaves no chance to clean up: the cluster folder (~70 MB) and the load
    account's folder stay. Their markers name a pgscope that is gone: doctor lists them, and
    the next run stops what still runs from them and deletes them."""
    scratch = Path(tempfile.gettempdir())
    before = {p for p in scratch.glob("pgscope-*") if (p / ".pgscope-owner").exists()}
    proc = start(
        [
            *("run", "scaling", "--clients", "1,2", "--duration", "4", "--scale", "1"),
            *BASE,
            *("--collectors", "activity", "--results-dir", str(tmp_path / "killed")),
        ]
    )
    wait_for_line(proc, r"step 1/2")
    wait_for_programs(set(), {"pgbench", "postgres"})  # into step 2's load
    proc.kill()
    proc.wait(timeout=10)
    left = {p for p in scratch.glob("pgscope-*") if (p / ".pgscope-owner").exists()} - before
    assert any((p / "data").is_dir() for p in left), f"a cluster folder stays: {left}"

    doctor = pgscope("doctor", "--json")
    [check] = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "leftovers"]
    assert not check["ok"] and all(str(p) in check["detail"] for p in left), check

    again = pgscope(
        *("run", "scaling", "--clients", "1", "--duration", "1", "--scale", "1"),
        *BASE,
        *("--collectors", "activity", "--results-dir", str(tmp_path / "next")),
    )
    assert again.returncode == 0, again.stderr
    assert "removing what a killed run left" in again.stderr
    assert not any(p.exists() for p in left), "the next run removed them"
    running_there = [pid for pid in server_processes() if any(str(p) in _cwd(pid) for p in left)]
    assert not running_there, describe(set(running_there))


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


@pytest.mark.server
def test_a_killed_backend_fails_its_step_and_the_server_recovers_for_the_next(
    tmp_path: Path,
) -> None:
    """SIGKILL of one backend: the postmaster resets every session and recovers (crash
    restart) by itself. The step it hit is recorded as failed with the reason, the next runs."""
    before = server_processes()
    proc = start(
        [
            *("run", "scaling", "--clients", "2,3", "--order", "sequential"),
            *("--duration", "6", "--scale", "1", *BASE),
            *("--collectors", "activity,pgstats", "--json", "--results-dir", str(tmp_path)),
        ]
    )
    try:
        wait_for_line(proc, r"step 1/2 .* tps")  # step 1 done: step 2 is starting
        wait_for_programs(before, {"pgbench"})  # step 2's load under way
        # This run's postmaster, a child of its pgscope: not a server an earlier test of this
        # worker left running, nor one the other worker started meanwhile (idle, neither has
        # a backend of this load).
        postmaster = next(p for p in child_pids(proc.pid) if " -D " in _title(p))
        seen: set[str] = set()

        def a_backend() -> int | None:
            children = {p: _title(p) for p in child_pids(postmaster)}
            seen.update(children.values())
            return next((p for p, t in children.items() if process_role(t) == "backend"), None)

        try:
            backend = wait_until(a_backend, "a backend of step 2's load")
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}; postmaster {postmaster} ({_title(postmaster)!r}), whose children "
                f"were {sorted(seen)}"
            ) from None
    except BaseException:
        proc.kill()  # never left running behind a failed test
        proc.communicate()
        raise
    os.kill(backend, signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 7, err
    assert "Traceback" not in err
    doc = json.loads(out)
    statuses = [(s["step_id"], s["status"]) for s in doc["steps"]]
    assert statuses == [(1, "ok"), (2, "failed")], statuses
    assert doc["steps"][1]["error"], "the failed step says why"
    assert (Path(doc["run_dir"]) / "summary.json").is_file()


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


@pytest.mark.server
def test_a_full_cluster_disk_fails_the_steps_it_hits_and_keeps_the_summary(
    tmp_path: Path,
) -> None:
    """The cluster's own disk (--work-dir) fills after step 1: the server's "No space left on
    device" is a fault of the step (not the workload's result), the run ends with exit 7 and
    the summary of what was measured."""
    # In the session's TMPDIR, which the server's account can enter.
    with tmpfs(Path(tempfile.gettempdir()) / f"small-work-{os.getpid()}", "400m") as work:
        work.chmod(0o1777)
        proc = start(
            [
                *("run", "scaling", "--clients", "1,2", "--order", "sequential"),
                *("--duration", "3", "--scale", "5", "--workload", "tpcb-like", *BASE),
                *("--collectors", "activity", "--work-dir", str(work), "--json"),
                *("--results-dir", str(tmp_path)),
            ]
        )
        wait_for_line(proc, r"step 1/2 .* tps")
        free = shutil.disk_usage(work).free
        with contextlib.suppress(OSError), (work / "filler").open("wb") as filler:
            filler.write(b"\0" * free)
        out, err = proc.communicate(timeout=180)
    assert proc.returncode == 7, err
    assert "Traceback" not in err
    doc = json.loads(out)
    assert [s["status"] for s in doc["steps"]] == ["ok", "failed"], doc["steps"]
    assert "No space left on device" in doc["steps"][1]["error"]
    assert (Path(doc["run_dir"]) / "summary.json").is_file()


@pytest.mark.server
def test_a_server_panic_before_a_step_ends_with_a_summary(tmp_path: Path) -> None:
    """The server PANICs in the CHECKPOINT pgscope takes before a step, and in every crash
    recovery after it, as with a full disk under its WAL: planted as a directory where the
    checkpointer removes a file (it PANICs on any failure there). The step is failed with the
    server's PANIC, and the run ends with exit 5 (the server), one line naming the PANIC, a
    summary, and no server left running."""
    before = server_processes()
    work = Path(tempfile.mkdtemp(prefix="panic-", dir=tempfile.gettempdir()))
    work.chmod(0o1777)  # the server's account makes its cluster in it
    try:
        proc = start(
            [
                *("run", "scaling", "--clients", "1,2", "--duration", "1", "--scale", "1"),
                # No --set: a restart for settings would PANIC in its shutdown checkpoint,
                # before any step (a failed start, exit 5 as well, with no step to record).
                *("--warmup", "1", "--repeats", "1"),
                *("--collectors", "activity", "--work-dir", str(work)),
                *("--results-dir", str(tmp_path)),
            ]
        )
        planted = False
        deadline = time.monotonic() + 120
        while not planted and proc.poll() is None and time.monotonic() < deadline:
            # As soon as the data directory is there: the first checkpoint is step 1's.
            for logical in work.glob("pgscope-*/data/pg_logical"):
                (logical / "replorigin_checkpoint.tmp").mkdir()
                planted = True
            elapse(0.005, "between two looks for the folder to plant in")
        out, err = proc.communicate(timeout=180)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert planted, err
    assert proc.returncode == 5, err
    error = one_line_error(subprocess.CompletedProcess([], 5, out, err))
    assert 'PANIC: could not remove file "pg_logical/replorigin_checkpoint.tmp"' in error, error
    summary = json.loads((only_run(tmp_path) / "summary.json").read_text())
    first = summary["steps"][0]
    assert first["status"] == "failed" and "PANIC" in first["error"], first
    wait_for_nothing_left(before)


@pytest.mark.server
def test_a_signal_around_a_steps_end_always_ends_in_a_summary(tmp_path: Path) -> None:
    """SIGINT or SIGTERM at offsets that walk across step 2's end: the last seconds of load,
    the analysis of its transaction log (DuckDB, which turns a signal into its own error),
    the run's teardown. Each ends with exit 0 (too late to matter) or the signal's code, one
    line, a summary and a report of what was measured, and nothing left running."""
    before = server_processes()
    offsets = [1.7, 2.1, 2.5, 2.9]
    for offset, sig in zip(offsets, [signal.SIGINT, signal.SIGTERM] * 2, strict=True):
        results = tmp_path / f"{offset}"
        proc = start(
            [
                *("run", "scaling", "--clients", "1,2", "--order", "sequential"),
                *("--duration", "1", "--scale", "1", *BASE),
                *("--collectors", "activity,pgstats", "--results-dir", str(results)),
            ]
        )
        wait_for_line(proc, r"step 1/2 .* tps")
        elapse(offset, "the signal arrives this far into the step")
        err = stop_within(proc, sig)
        assert "Traceback" not in err, (offset, err)
        assert proc.returncode in (0, 128 + sig), (offset, proc.returncode, err)
        if proc.returncode:
            one_line_error(subprocess.CompletedProcess([], proc.returncode, "", err))
        run_dir = only_run(results)
        assert (run_dir / "summary.json").is_file(), (offset, err)
        steps = json.loads((run_dir / "summary.json").read_text())["steps"]
        assert steps[0]["status"] == "ok", (offset, steps)
        report = pgscope("report", str(run_dir), "--format", "json")
        assert report.returncode == 0, (offset, report.stderr)
        wait_for_nothing_left(before)
