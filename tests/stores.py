"""Run stores as the runner leaves them, built without a server: for the fast tests of what
pgscope reads and renders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pgscope.store import RunMeta, RunStore

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
