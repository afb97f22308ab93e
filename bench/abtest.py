"""Shared benchmark machinery: a throw-away cluster, pgbench trials, interleaved A/B pairs.

Hosts are shared and noisy, so overhead is a ratio of interleaved A/B trials in one run: each
pair runs "off" and "on" back to back in a random order, and the cost is the median of the
per-pair ratios, reported with its spread (quartiles, min, max), never one absolute time.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgscope.drive.pgbench import parse_summary
from pgscope.proc import server_account
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import PgBinaries, find_binaries

RESULTS = Path(__file__).parent / "results"


@contextmanager
def bench_cluster(
    settings: dict[str, str] | None = None,
    scale: int = 10,
    max_clients: int = 16,
    log_dir: Path | None = None,
) -> Iterator[tuple[PgBinaries, EmbeddedCluster]]:
    """A throw-away cluster with pgbench tables at `scale`."""
    pg = find_binaries()
    log = (log_dir or Path("/tmp")) / f"bench-server-{time.time_ns()}.log"
    startup = {**benchmark_defaults(max_clients), "shared_buffers": "512MB", **(settings or {})}
    with EmbeddedCluster(pg, server_account(None), log, startup) as cluster:
        if scale:
            subprocess.run(
                [
                    str(pg.path("pgbench")),
                    "-i",
                    "-s",
                    str(scale),
                    "-I",
                    "dtGvp",
                    "-q",
                    cluster.conn.conninfo(),
                ],
                check=True,
                capture_output=True,
            )
        yield pg, cluster


def pgbench_tps(
    pg: PgBinaries, cluster: EmbeddedCluster, workload: list[str], clients: int, seconds: int
) -> float:
    """pgbench's own tps (no per-transaction log: the log would add its own cost)."""
    argv = [
        str(pg.path("pgbench")),
        "-n",
        "-M",
        "prepared",
        *workload,
        "-c",
        str(clients),
        "-j",
        str(min(clients, 2)),
        "-T",
        str(seconds),
        cluster.conn.conninfo(),
    ]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return float(parse_summary(out.stdout)["tps"])


@dataclass(frozen=True)
class Pair:
    pair: int
    off_tps: float
    on_tps: float
    first: str  # which arm ran first
    detail: dict[str, Any]

    @property
    def ratio(self) -> float:
        return self.on_tps / self.off_tps


def interleaved_pairs(
    n: int,
    trial: Callable[[bool], tuple[float, dict[str, Any]]],
    seed: int = 1,
    say: Callable[[str], None] = print,
) -> list[Pair]:
    """Run `n` pairs of trial(False) and trial(True) in a random order within each pair."""
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        order = [False, True]
        rng.shuffle(order)
        results: dict[bool, tuple[float, dict[str, Any]]] = {}
        for arm in order:
            results[arm] = trial(arm)
        pair = Pair(
            i + 1,
            results[False][0],
            results[True][0],
            "on" if order[0] else "off",
            results[True][1],
        )
        say(
            f"  pair {pair.pair}: off {pair.off_tps:,.0f} on {pair.on_tps:,.0f} tps, "
            f"ratio {pair.ratio:.4f} ({pair.first} first)"
        )
        pairs.append(pair)
    return pairs


def ratio_summary(pairs: list[Pair]) -> dict[str, float]:
    """Median on/off ratio with quartiles and range; cost = 1 - median ratio."""
    ratios = sorted(p.ratio for p in pairs)
    q1, _, q3 = (
        statistics.quantiles(ratios, n=4, method="inclusive")
        if len(ratios) > 1
        else (ratios[0], ratios[0], ratios[0])
    )
    median = statistics.median(ratios)
    return {
        "pairs": len(ratios),
        "median_ratio": median,
        "q1": q1,
        "q3": q3,
        "min": ratios[0],
        "max": ratios[-1],
        "cost_pct": (1 - median) * 100,
        "off_tps_median": statistics.median(p.off_tps for p in pairs),
    }


def write_results(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(payload, indent=2, default=str))
    return path


@dataclass
class Collecting:
    store: Any  # RunStore, open for the block
    collectors: Any  # CollectorSet: step_started/step_finished drive step-scoped collectors


@contextmanager
def collecting(
    selection: dict[str, dict[str, Any]],
    pg: PgBinaries,
    cluster: EmbeddedCluster,
    run_dir: Path,
    on_stopped: Callable[[Any], None] | None = None,
) -> Iterator[Collecting]:
    """Run collectors against `cluster` for the duration of the block, exactly as a run does
    (same CollectorSet, same store). `on_stopped(store)` reads what the collectors wrote when
    they stopped, before the store closes. A collector that is unavailable here stops the
    benchmark: its numbers would be meaningless."""
    import os

    from pgscope.collect.base import CollectorContext, CollectorEnv
    from pgscope.collect.manager import CollectorSet
    from pgscope.host import describe_host
    from pgscope.store import RunMeta, RunStore

    meta = RunMeta(
        run_dir.name,
        "bench",
        "bench",
        "",
        "{}",
        "bench",
        "bench",
        "embedded",
        "embedded",
        describe_host(),
    )
    store = RunStore.create(run_dir, meta)
    env = CollectorEnv(pg, "embedded", None, os.geteuid() == 0)
    collectors = CollectorSet(selection, env, store, lambda m: print(f"  · {m}"))
    if collectors.unavailable:
        store.close()
        raise SystemExit(f"bench: collectors unavailable: {collectors.unavailable}")
    ctx = CollectorContext(
        env=env,
        conn=cluster.conn,
        store=store,
        run_dir=run_dir,
        postmaster_pid=lambda: cluster.postmaster_pid,
        data_dir=cluster.data_dir,
        server_version_num=150000,
        say=lambda m: print(f"  · {m}"),
    )
    collectors.start(ctx)
    try:
        yield Collecting(store, collectors)
    finally:
        collectors.stop()
        try:
            if on_stopped is not None:
                on_stopped(store)
        finally:
            store.close()
