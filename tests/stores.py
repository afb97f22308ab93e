"""Run stores as the runner leaves them, built without a server: for the fast tests of what
pgscope reads and renders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pgscope.store import RunMeta, RunStore
from pgscope.windows import open_windows

HOST = {"usable_cpus": 2, "cpu_model": "planted", "memory_bytes": 25276510208}


def measured_run(
    run_dir: Path, cells: list[tuple[int, float]], host: dict[str, Any] | None = None
) -> Path:
    """One ok step per (clients, tps), one second apart, in the order given."""
    store = RunStore.create(
        run_dir,
        RunMeta(run_dir.name, "scaling", "recipe scaling", "", "{}", "pgscope run", "0",
                "server", "host=db1", host or HOST),
    )  # fmt: skip
    start = 1_700_000_000_000_000
    for step_id, (clients, tps) in enumerate(cells, start=1):
        store.begin_step(step_id, "base", clients, 1, 1, 2.0, 0.0, False)
        window = (start + step_id * 10_000_000, start + step_id * 10_000_000 + 5_000_000)
        results = {"window_start_us": window[0], "window_end_us": window[1], "tps": tps}
        results |= {"xacts": int(tps * 5), "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0}
        store.finish_step(step_id, "ok", None, results)
    store.finish_run("complete", None)
    store.close()
    return run_dir


def sampled_session(run_dir: Path, lock_share: float) -> Path:
    """A `pgscope sample` session as the activity collector leaves it (its own tables), no
    steps: 300 samples of 8 active sessions, `lock_share` of them waiting on a row lock's
    transaction, the others on CPU."""
    store = RunStore.create(
        run_dir,
        RunMeta(run_dir.name, "sample", "pgscope sample", "", "{}", "pgscope sample", "0",
                "server", "host=db1", HOST),
    )  # fmt: skip
    store.set_collector("activity", True, None, {"hz": 50})
    store.collector_started("activity")
    store.create_tables("activity")
    start, rows = 1_700_000_000_000_000, []
    for n in range(1, 301):
        for pid in range(8):
            waiting = (n * 8 + pid) % 100 < lock_share * 100
            rows.append((start + n * 20_000, n, 100 + pid, "client backend", "active",
                         "Lock" if waiting else None, "transactionid" if waiting else None,
                         42 if waiting else 7, "postgres", "postgres", "pgbench"))  # fmt: skip
    names = ("ts_us", "sample_no", "pid", "backend_type", "state", "wait_event_type",
             "wait_event", "query_id", "datname", "usename", "application_name")  # fmt: skip
    store.append("activity_samples", {k: [r[i] for r in rows] for i, k in enumerate(names)})
    store.append(
        "activity_queries",
        {
            "query_id": [42, 7],
            "query": ["UPDATE pgbench_branches SET bbalance = bbalance + $1 WHERE bid = $2",
                      "SELECT abalance FROM pgbench_accounts WHERE aid = $1"],
            "first_seen_us": [start, start],
        },
    )  # fmt: skip
    store.collector_stopped("activity", "complete")
    store.finish_run("complete", None)
    store.close()
    return run_dir


def observation_begun(run_dir: Path, started_us: int, who: str) -> RunStore:
    """An `observe` session's store as its collectors begin (`who` stands for the command line
    and version): the run's row from `started_us`, the activity and pgstats tables, windows
    open, both collectors running. The caller fills in samples and counters."""
    meta = RunMeta(
        run_dir.name, "observe", "pgscope observe", "", "{}", who, who, "server",
        f"host={who}", {"usable_cpus": 2},
    )  # fmt: skip
    store = RunStore.create(run_dir, meta)
    store.db.execute("UPDATE run SET started_us = ?", [started_us])
    store.create_tables("activity")
    store.create_tables("pgstats")
    open_windows(store)
    for name in ("activity", "pgstats"):
        store.set_collector(name, True, None, {})
        store.collector_started(name)
    return store


def busy_observation(
    run_dir: Path, started_us: int, seconds: int, sessions: int, hz: int, window_s: int = 10
) -> Path:
    """A finished `observe` of `sessions` client sessions sampled at `hz` for `seconds` (the
    rows made in DuckDB: seconds x hz x sessions activity samples), in windows of `window_s`
    with pgstats snapshots each second and at their edges; run started at `started_us`."""
    from pgscope.windows import VARIANT, close_windows

    store = observation_begun(run_dir, started_us, "busy")
    db, t0 = store.db, started_us
    db.execute(
        f"""
        INSERT INTO activity_samples
        SELECT {t0} + (s * 1000000 // {hz})::BIGINT, s + 1, 1000 + p, 'client backend',
               'active', CASE WHEN (s + p) % 3 = 0 THEN 'Lock' END,
               CASE WHEN (s + p) % 3 = 0 THEN 'transactionid' END, 7000 + (p % 5), 'app',
               'app', 'app'
        FROM range({seconds * hz}) t(s), range({sessions}) u(p)
        """
    )
    db.execute(
        "INSERT INTO activity_queries SELECT 7000 + q, 'update counters set n = n + 1 where "
        "id = ' || q, ? FROM range(5) t(q)",
        [t0],
    )
    db.execute(
        f"INSERT INTO pgstats_counters SELECT {t0} + s * 1000000, 'pg_stat_database', 'app', "
        f"'xact_commit', s * 2000.0, NULL, NULL FROM range({seconds + 1}) t(s)"
    )
    windows = seconds // window_s
    for w in range(windows):
        start, end = t0 + w * window_s * 1_000_000, t0 + (w + 1) * window_s * 1_000_000
        db.execute(
            "INSERT INTO steps (step_id, variant, clients, repeat, duration_s, started_us, "
            "ended_us, status) VALUES (?, ?, 0, 1, ?, ?, ?, 'ok')",
            [w + 1, VARIANT, window_s, start, end - 1],
        )
    db.execute(
        f"INSERT INTO pgstats_counters SELECT {t0} + w * {window_s * 1_000_000} + "
        f"CASE WHEN m = 'start' THEN 1000 ELSE {window_s * 1_000_000} - 1000 END, "
        f"'pg_stat_database', 'app', 'xact_commit', (w * {window_s} + CASE WHEN m = 'start' "
        f"THEN 0.001 ELSE {window_s} - 0.001 END) * 2000.0, w + 1, m "
        f"FROM range({windows}) t(w), (VALUES ('start'), ('end')) v(m)"
    )
    for name in ("activity", "pgstats"):
        store.collector_stopped(name, "complete")
    close_windows(store)
    store.finish_run("complete")
    store.db.execute("UPDATE run SET ended_us = ?", [t0 + seconds * 1_000_000])
    store.close()
    return run_dir
