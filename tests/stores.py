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
