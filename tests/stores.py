"""Run stores as the runner leaves them, built without a server: for the fast tests of what
pgscope reads and renders."""

from __future__ import annotations

import json
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


def repeated_run(
    run_dir: Path, cells: list[tuple[int, int, float]], conninfo: str = "host=db1"
) -> Path:
    """One ok step per (clients, repeat, tps), one second apart, in the order given, on the
    server of `conninfo` (as the store keeps it)."""
    store = RunStore.create(
        run_dir,
        RunMeta(run_dir.name, "scaling", "recipe scaling", "", "{}", "pgscope run", "0",
                "server", conninfo, HOST),
    )  # fmt: skip
    start = 1_700_000_000_000_000
    for step_id, (clients, repeat, tps) in enumerate(cells, start=1):
        store.begin_step(step_id, "base", clients, repeat, 1, 2.0, 0.0, False)
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


def capacity_run(run_dir: Path) -> Path:
    """A run with offered rates and the objective p99<5ms, as the runner leaves it: a sweep
    at 2, 4 and 8 clients peaking at 10,000 tps, then 2,000 to 12,000 tps offered by 8 clients,
    3 repeats of each. The server keeps up to 8,000 tps; p99<5ms holds up to 6,000 in every
    repeat and is missed from 8,000, by shares above 5 ms that put each repeat's crossing
    elsewhere between them."""
    spec = {"rates": [2000.0, 4000.0, 6000.0, 8000.0, 10000.0, 12000.0], "slo": ["p99<5ms"],
            "rate_clients": "auto", "variants": {"base": {}}, "protocol": "prepared"}  # fmt: skip
    store = RunStore.create(
        run_dir,
        RunMeta(run_dir.name, "capacity", "recipe capacity", "", json.dumps(spec),
                "pgscope run capacity --slo p99<5ms", "0", "embedded", "embedded", HOST),
    )  # fmt: skip
    start, step_id = 1_700_000_000_000_000, 0

    def step(clients: int, repeat: int, tps: float, rate: float | None, p99: float) -> int:
        nonlocal step_id
        step_id += 1
        share, limit = (None, None) if rate is None else (rate / 10000, 5.0)
        store.begin_step(
            step_id, "base", clients, repeat, 2, 5.0, 1.0, False,
            rate=rate, rate_share=share, latency_limit_ms=limit,
        )  # fmt: skip
        window = (start + step_id * 10_000_000, start + step_id * 10_000_000 + 5_000_000)
        results: dict[str, Any] = {"window_start_us": window[0], "window_end_us": window[1]}
        results |= {"tps": tps, "xacts": int(tps * 5), "succeeded": int(tps * 5)}
        results |= {"p50_ms": p99 / 4, "p90_ms": p99 / 2, "p95_ms": p99 / 1.5, "p99_ms": p99}
        results |= {"p999_ms": p99 * 2, "max_ms": p99 * 4, "latency_mean_ms": p99 / 4}
        if rate is not None:
            results |= {"served": int(min(rate, tps) * 5), "skipped": 0, "late": 0}
            results |= {"lag_mean_ms": p99 / 8, "lag_p99_ms": p99 / 2, "lag_max_ms": p99}
            results |= {"service_p50_ms": 0.2, "service_p99_ms": 1.0}
        store.finish_step(step_id, "ok", None, results)
        return step_id

    crossings = {1: (0.002, 0.1), 2: (0.004, 0.03), 3: (0.001, 0.4)}  # above 5 ms at 6k, 8k
    for repeat in (1, 2, 3):
        for clients, tps in ((2, 6000.0), (4, 9000.0), (8, 10000.0)):
            step(clients, repeat, tps + repeat * 50, None, 2.0)
    for repeat in (1, 2, 3):
        for rate in spec["rates"]:
            assert isinstance(rate, float)
            achieved = min(rate, 8000.0 + repeat * 100)
            above = (
                0.0 if rate < 6000 else crossings[repeat][0] if rate == 6000 else
                min(0.9, crossings[repeat][1] * rate / 8000)
            )  # fmt: skip
            p99 = 2.0 if rate < 8000 else 50.0 * rate / 8000
            sid = step(8, repeat, achieved, rate, p99)
            scheduled = int(rate * 5)
            store.add_step_objectives(
                sid, [("p99<5ms", 0.99, 5.0, round(above * scheduled), scheduled, p99)]
            )
    store.finish_run("complete", None)
    store.close()
    return run_dir


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
               'app', 'app', NULL
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
