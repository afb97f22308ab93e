"""The activity sampler's shared-memory source: the compiled helper on a file whose layout we
wrote, and the whole source on a real server, against the SQL source, with planted waits."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import psycopg
import pytest

from pgscope.collect.sampling import shmem
from pgscope.collect.sampling.activitymem import BINARY, helper_binary, read_batch, untrusted
from pgscope.proc import server_account
from pgscope.target.embedded import EmbeddedCluster
from pgscope.target.pgbin import PgBinaries
from tests.cli import pgscope
from tests.poll import elapse, wait_until
from tests.runs import run_doc
from tests.servers import SMALL_SERVER

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="reading another process's memory needs root"
)

# A file standing in for shared memory: 4 proc slots of 64 bytes (pid at 8, wait at 16, lock
# group leader at 24, the array at PROCS_AT in the server), then 4 status slots of 48 bytes
# (pid at 4, backend type at 8, state at 12, query_id at 24).
PROC, STATUS, STATUSES_AT, PROCS_AT = 64, 48, 256, 0x7F0000001000
LAYOUT = ["0", "4", "64", "8", "16", str(STATUSES_AT), "4", "48", "4", "12", "8", "24"]
LAYOUT += ["24", str(PROCS_AT)]


def fake_segment(path: Path) -> int:
    """Two processes in use: 111 waiting (in proc slot 1, status slot 2), a member of 222's
    lock group; 222 on CPU (proc slot 3, status slot 0, running query 42), its leader."""
    data = bytearray(STATUSES_AT + 4 * STATUS)
    struct.pack_into("iiIiQ", data, 1 * PROC + 8, 111, 0, 0x03000009, 0, PROCS_AT + 3 * PROC)
    struct.pack_into("iiiiQ", data, 3 * PROC + 8, 222, 0, 0, 0, PROCS_AT + 3 * PROC)
    struct.pack_into("iii", data, STATUSES_AT + 0 * STATUS + 4, 222, 3, 2)
    struct.pack_into("q", data, STATUSES_AT + 0 * STATUS + 24, 42)
    struct.pack_into("iii", data, STATUSES_AT + 2 * STATUS + 4, 111, 3, 1)
    path.write_bytes(data)
    return len(data)


def test_helper_copies_the_slots_in_use_on_schedule_and_flushes_when_stopped(
    tmp_path: Path,
) -> None:
    size = fake_segment(tmp_path / "segment")
    fd = os.open(tmp_path / "segment", os.O_RDONLY)
    started = time.monotonic()
    try:
        helper = subprocess.Popen(
            [str(helper_binary()), str(fd), str(size), "100", "1000", *LAYOUT],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(fd,),
        )
    finally:
        os.close(fd)
    elapse(0.5, "some ticks, fewer than a batch")
    helper.terminate()  # before a whole batch (1,000 ticks): what it holds is written
    out, err = helper.communicate(timeout=10)
    lived = time.monotonic() - started
    assert helper.returncode == 0, err
    stream = io.BytesIO(out)
    batch = read_batch(stream)
    assert batch is not None and read_batch(stream) is None
    ticks = len(batch.tick_us)
    assert 5 <= ticks <= lived * 100 + 2, (ticks, lived)
    # On its 100 Hz schedule: never faster; slower only by ticks a busy host made it skip
    # (the schedule skips ahead rather than catch up; measured 66 Hz under a load of 10).
    span_s = (batch.tick_us[-1] - batch.tick_us[0]) / 1e6
    rate = (ticks - 1) / span_s
    assert 25 <= rate <= 105, (rate, np.diff(batch.tick_us).tolist())
    assert batch.cpu_ns > 0
    # Two rows per tick, in slot order, each joined to the status slot of the same pid.
    assert len(batch.pid) == 2 * ticks
    assert batch.tick.tolist() == [t for t in range(ticks) for _ in range(2)]
    assert batch.pid.tolist() == [111, 222] * ticks
    assert batch.wait.tolist() == [0x03000009, 0] * ticks
    assert batch.state.tolist() == [1, 2] * ticks
    assert batch.btype.tolist() == [3, 3] * ticks
    assert batch.query_id.tolist() == [0, 42] * ticks
    assert batch.leader.tolist() == [222, 0] * ticks  # a leader's own pointer names itself


def test_helper_refuses_a_layout_outside_its_mapping_in_one_line(tmp_path: Path) -> None:
    size = fake_segment(tmp_path / "segment")
    fd = os.open(tmp_path / "segment", os.O_RDONLY)
    try:
        layout = [*LAYOUT[:6], "40", *LAYOUT[7:]]  # 40 status slots: beyond the file
        done = subprocess.run(
            [str(helper_binary()), str(fd), str(size), "100", "100", *layout],
            capture_output=True,
            text=True,
            pass_fds=(fd,),
            timeout=10,
        )
    finally:
        os.close(fd)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "pgscope-shmem-sampler: the status array lies outside the mapping"
    ]


def test_the_sampler_runs_only_where_no_one_but_root_could_have_changed_it(
    tmp_path: Path,
) -> None:
    """The package's own binary passes; a copy that its group may write, one that another
    account owns, a link, and one in a folder others may write are each refused, in one line
    that names the file or folder."""
    assert untrusted(BINARY) is None
    assert helper_binary() == BINARY
    folder = tmp_path / "bin"
    folder.mkdir(mode=0o755)
    copy = folder / "pgscope-shmem-sampler"
    shutil.copy(BINARY, copy)
    copy.chmod(0o775)
    assert untrusted(copy) == f"{copy} is writable by its group"
    with pytest.raises(shmem.ShmemError, match="writable by its group"):
        helper_binary(copy)
    copy.chmod(0o755)
    postgres = server_account(None)
    if postgres.uid != os.geteuid():
        os.chown(copy, postgres.uid, postgres.gid)
        assert untrusted(copy) == f"{copy} belongs to uid {postgres.uid}, not root"
        os.chown(copy, os.geteuid(), os.getegid())
    link = folder / "link"
    link.symlink_to(BINARY)
    assert "not a regular file" in (untrusted(link) or "")
    # Here the file itself is fine: the first folder above it that others may write is named.
    shared = next(p for p in copy.parents if os.stat(p).st_mode & 0o022)
    problem = untrusted(copy) or ""
    assert problem.startswith(f"{shared} is writable by") and "above the sampler" in problem
    assert "\n" not in problem


# -- on a real server, as root ----------------------------------------------------------------


@pytest.fixture
def planted(cluster: EmbeddedCluster) -> Iterator[EmbeddedCluster]:
    """Waits whose names we know: a session holding advisory lock 42 (then idle), two
    sessions queued on it (Lock:advisory), one in pg_sleep (Timeout:PgSleep)."""
    holder = cluster.conn.connect(application_name="planted-holder")
    holder.execute("SELECT pg_advisory_lock(42)")
    sessions = [holder]
    threads = []

    def run(app: str, sql: str) -> None:
        session = cluster.conn.connect(application_name=app)
        sessions.append(session)
        with contextlib.suppress(psycopg.Error):  # cancelled at the end
            session.execute(sql)

    for app, sql in (
        ("planted-waiter", "SELECT pg_advisory_lock(42)"),
        ("planted-waiter", "SELECT pg_advisory_lock(42)"),
        ("planted-sleeper", "SELECT pg_sleep(120)"),
    ):
        thread = threading.Thread(target=run, args=(app, sql), daemon=True)
        thread.start()
        threads.append(thread)

    def in_place() -> bool:  # two queued on the lock, one asleep
        with cluster.connect() as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE wait_event = 'advisory'), "
                "count(*) FILTER (WHERE wait_event = 'PgSleep') FROM pg_stat_activity"
            ).fetchone()
        return row == (2, 1)

    wait_until(in_place, "the planted waits")
    try:
        yield cluster
    finally:
        for session in sessions[1:]:
            session.cancel_safe()
        holder.close()
        for thread in threads:
            thread.join(timeout=10)
        for session in sessions[1:]:
            session.close()


def observed(cluster: EmbeddedCluster, tmp_path: Path, sampler: str) -> Path:
    result = pgscope(
        "observe",
        "--data-dir",
        str(cluster.data_dir),
        "--duration",
        "4",
        "--window",
        "2",
        "--sampler",
        sampler,
        "--results-dir",
        str(tmp_path / sampler),
    )
    assert result.returncode == 0, result.stderr
    [run_dir] = list((tmp_path / sampler).iterdir())
    return run_dir / "run.duckdb"


def profile(store: Path) -> tuple[dict[tuple[str, ...], float], int, list[str]]:
    """Per planted application, each (state, wait) and its share of that application's rows;
    the samples; the activity events."""
    db = duckdb.connect(str(store), read_only=True)
    try:
        rows = db.execute(
            "SELECT *, n / sum(n) OVER (PARTITION BY application_name) FROM ("
            "SELECT application_name, backend_type, state, coalesce(wait_event_type, 'CPU'), "
            "coalesce(wait_event, 'CPU'), count(*) AS n FROM activity_samples GROUP BY ALL)"
        ).fetchall()
        samples = db.execute("SELECT count(DISTINCT sample_no) FROM activity_samples").fetchone()
        events = db.execute(
            "SELECT detail FROM events WHERE kind LIKE 'activity-%' ORDER BY ts_us"
        ).fetchall()
    finally:
        db.close()
    shares = {tuple(str(v) for v in r[:5]): float(r[6]) for r in rows}
    return shares, int(samples[0]) if samples else 0, [e[0] for e in events]


@needs_root
def test_memory_source_sees_planted_waits_as_the_sql_source_does(
    planted: EmbeddedCluster, tmp_path: Path
) -> None:
    memory, memory_samples, memory_events = profile(observed(planted, tmp_path, "memory"))
    sql, sql_samples, _ = profile(observed(planted, tmp_path, "sql"))
    expected = {
        ("planted-waiter", "client backend", "active", "Lock", "advisory"),
        ("planted-sleeper", "client backend", "active", "Timeout", "PgSleep"),
        ("planted-holder", "client backend", "idle", "Client", "ClientRead"),
    }
    for key in expected:
        assert memory.get(key, 0) > 0.95, (key, memory)
        assert abs(memory[key] - sql.get(key, 0)) < 0.05, (key, memory, sql)
    assert not [key for key in memory if key[0].startswith("pgscope")], memory
    # 50 Hz for 4 s, as the SQL source takes.
    assert memory_samples >= 0.8 * sql_samples and memory_samples >= 150
    assert any("shared memory" in e for e in memory_events), memory_events
    assert any(e.startswith("the shared-memory sampler used") for e in memory_events)


@needs_root
def test_the_memory_sampler_runs_on_a_host_without_a_compiler(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    """It ships built: with no C compiler on PATH (only the venv's and PostgreSQL's programs)
    `observe` samples from shared memory all the same."""
    path = f"{Path(sys.executable).parent}:{cluster.pg.bindir}"
    for folder in path.split(":"):
        assert not {"cc", "gcc"} & {p.name for p in Path(folder).iterdir()}, folder
    # Finding the arrays can miss its moment on a busy host: tried again then.
    for attempt in range(3):
        results = tmp_path / f"results-{attempt}"
        result = pgscope(
            *("observe", "--data-dir", str(cluster.data_dir), "--duration", "2"),
            *("--window", "1", "--sampler", "memory", "--results-dir", str(results)),
            env={"PATH": path},
        )
        if "could not tell the wait and state fields apart" not in result.stderr:
            break
    assert result.returncode == 0, result.stderr[-2000:]
    [run_dir] = results.iterdir()
    _, samples, events = profile(run_dir / "run.duckdb")
    assert any(e.startswith("sampling from the server's shared memory") for e in events), events
    assert samples >= 50


# Two variants, the second with a shared_buffers of its own: the run restarts the server
# between them (a postmaster setting), while the activity collector keeps running.
RESTARTING = """
workload = "select-only"
scale = 1
clients = [2]
duration = 3
warmup = 0
repeats = 1
order = "sequential"
[settings]
shared_buffers = "128MB"
[variants]
small = {}
larger = {shared_buffers = "160MB"}
[collectors]
activity = {source = "memory"}
"""


@pytest.mark.server
@needs_root
def test_memory_source_finds_the_layout_again_after_a_restart(tmp_path: Path) -> None:
    """A run restarts its server between variants whose postmaster settings differ: the
    shared memory is made anew, and the sampler finds its layout again and samples the second
    variant as it did the first. (`observe` stops at a restart instead: docs/observe.md.)"""
    spec = tmp_path / "restarting.toml"
    spec.write_text(RESTARTING)
    result = pgscope("run", str(spec), "--json", "--results-dir", str(tmp_path / "results"))
    doc = run_doc(result)
    db = duckdb.connect(str(Path(doc["run_dir"]) / "run.duckdb"), read_only=True)
    try:
        per_step = dict(
            db.execute(
                "SELECT s.variant, count(DISTINCT a.sample_no) FROM activity_samples a "
                "JOIN steps s ON a.ts_us BETWEEN s.window_start_us AND s.window_end_us "
                "GROUP BY ALL"
            ).fetchall()
        )
        events = [m for (m,) in db.execute("SELECT detail FROM events").fetchall()]
    finally:
        db.close()
    print(per_step)
    assert any(e.startswith("sampling from the server's shared memory") for e in events), events
    assert any(
        e.startswith("the server restarted: sampling its shared memory again") for e in events
    ), events
    # 3 s at 50 Hz on each side of the restart.
    assert per_step.get("small", 0) > 100 and per_step.get("larger", 0) > 100, (per_step, events)


@pytest.mark.server
@needs_root
def test_wait_numbers_are_named_as_each_version_names_them(
    pg_version: PgBinaries, tmp_path: Path
) -> None:
    """On 15, 16, 17 and 18: each wait read from memory whose number the list names is the
    wait the server itself reports for that process, at an instant when its number did not
    change: the background processes' main-loop waits (several places in class Activity), an
    idle session's ClientRead and a session in pg_sleep."""
    with (
        EmbeddedCluster(
            pg_version, server_account(None), tmp_path / "server.log", SMALL_SERVER
        ) as cluster,
        cluster.connect() as session,
    ):
        postmaster = cluster.postmaster_pid
        assert postmaster is not None
        layout = shmem.calibrate(session, postmaster)
        assert "not used" not in layout.wait_names_source
        # LWLocks by id on every version; on 17 and 18 only if the list's names are the
        # server's own (pg_wait_events), every one of them.
        assert layout.wait_names[0x01000008] == ("LWLock", "WALWrite"), layout.wait_names_source
        assert layout.wait_names[0x03000004] == ("Lock", "tuple")
        idle = cluster.conn.connect(application_name="planted-idle")
        sleeper = cluster.conn.connect(application_name="planted-sleeper")
        # Per number, what the server called it each time ours did not change around its
        # read. A process can leave its wait and come back to it between our reads (a
        # background process's main loop wakes), so a rare other name is no misnumbering;
        # a list out of step with the numbers disagrees every time.
        seen: dict[int, Counter[tuple[str, str]]] = {}
        reader = shmem.Reader(layout)
        try:
            thread = threading.Thread(
                target=_quietly, args=(sleeper, "SELECT pg_sleep(60)"), daemon=True
            )
            thread.start()
            for _ in range(20):
                before = reader.waits()
                reported = session.execute(
                    "SELECT pid, wait_event_type, wait_event FROM pg_stat_activity "
                    "WHERE wait_event IS NOT NULL"
                ).fetchall()
                after = reader.waits()
                for pid, kind, event in reported:
                    raw = before.get(pid)
                    if raw is not None and raw == after.get(pid) and raw in layout.wait_names:
                        seen.setdefault(raw, Counter())[(kind, event)] += 1
                elapse(0.05, "between two comparisons")
        finally:
            reader.close()
            sleeper.cancel_safe()
            thread.join(timeout=10)
            sleeper.close()
            idle.close()
    compared = {raw: names.most_common(1)[0][0] for raw, names in seen.items()}
    for raw, names in seen.items():
        assert layout.wait_names[raw] == compared[raw], (hex(raw), layout.wait_names[raw], names)
        assert names[compared[raw]] >= 0.8 * sum(names.values()), (hex(raw), names)
    kinds = {kind for kind, _ in compared.values()}
    assert {"Activity", "Client", "Timeout"} <= kinds, compared
    assert sum(kind == "Activity" for kind, _ in compared.values()) >= 3, compared


def _quietly(session: psycopg.Connection[tuple[object, ...]], sql: str) -> None:
    with contextlib.suppress(psycopg.Error):  # cancelled at the end
        session.execute(sql)
