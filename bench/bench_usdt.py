"""Benchmark of the usdt collector (issue 4): the throughput cost of each bpftrace program.

    overhead:  pgbench (-M prepared, 2x cores clients, select-only and tpcb-like) on an
               embedded cluster, with one program attached (the usdt collector started before
               pgbench and stopped after it, as in a run) and with nothing attached, in
               interleaved A/B pairs (random order within a pair). Reported per workload and
               program: the median on/off tps ratio with quartiles and range, and the events
               the program recorded per second (each costs one or two uprobe traps).
    bystander: (--bystander) the cost to *another* cluster on the host: a second cluster runs
               select-only while the first, idle, is traced. The kernel raises the probes'
               semaphores in every process of the binary, so the bystander's processes trap
               on the probe sites too (the programs' predicates then drop them).

Targets (issue 4): checkpoint and locks <= 1%, lwlock <= 5%.

Usage:
    .venv/bin/python bench/bench_usdt.py [--pairs 5] [--seconds 20] [--scale 10]
        [--programs lwlock,locks,checkpoint,io] [--workloads select-only,tpcb-like]
        [--hold] [--bystander]
    .venv/bin/python bench/bench_usdt.py --smoke     (checks the script end to end; the
                                                      numbers mean nothing)
Results: printed as Markdown, and saved as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pgscope.collect import build
from pgscope.collect.base import CollectorContext, CollectorEnv
from pgscope.collect.usdt import UsdtCollector
from pgscope.host import describe_host, usable_cores
from pgscope.proc import server_account
from pgscope.store import RunMeta, RunStore
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import PgBinaries, find_binaries

RESULTS = Path(__file__).parent / "results"
TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)
WORKLOAD_FLAGS = {"select-only": ["-S"], "tpcb-like": []}


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def cluster(scale: int, clients: int, log: Path) -> Iterator[EmbeddedCluster]:
    pg = find_binaries()
    startup = {**benchmark_defaults(clients), "shared_buffers": "512MB"}
    with EmbeddedCluster(pg, server_account(None), log, startup) as running:
        subprocess.run(
            [str(pg.path("pgbench")), "-i", "-s", str(scale), "-q", running.conn.conninfo()],
            check=True,
            capture_output=True,
        )
        yield running


def pgbench(
    pg: PgBinaries, target: EmbeddedCluster, workload: str, clients: int, seconds: float
) -> float:
    argv = [
        str(pg.path("pgbench")),
        "-n", "-M", "prepared", *WORKLOAD_FLAGS[workload],
        "-c", str(clients), "-j", str(min(clients, usable_cores())),
        "-T", str(int(seconds)),
        target.conn.conninfo(),
    ]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    match = TPS.search(out.stdout)
    if match is None:
        raise RuntimeError(f"no tps in pgbench output: {out.stdout[-300:]}")
    return float(match.group(1))


@contextmanager
def traced(
    options: dict[str, Any], pg: PgBinaries, target: EmbeddedCluster, run_dir: Path
) -> Iterator[RunStore]:
    """The usdt collector attached to `target` for the block, as a run attaches it."""
    meta = RunMeta(
        run_dir.name,
        "bench",
        "bench",
        "",
        "{}",
        "bench_usdt",
        "bench",
        "embedded",
        "embedded",
        describe_host(),
    )
    store = RunStore.create(run_dir, meta)
    collector = build("usdt", options)
    collector.start(
        CollectorContext(
            env=CollectorEnv(pg, "embedded", target.conn, os.geteuid() == 0),
            conn=target.conn,
            store=store,
            run_dir=run_dir,
            postmaster_pid=lambda: target.postmaster_pid,
            data_dir=target.data_dir,
            server_version_num=150000,
            say=lambda _: None,
        )
    )
    try:
        yield store
    finally:
        error = collector.stop()
        if error:
            say(f"  usdt: {error}")


def recorded_events(store: RunStore) -> tuple[int, float]:
    """(events recorded, seconds traced) in a trial's store: latency events and counters."""
    row = store.query(
        "SELECT (SELECT coalesce(sum(count), 0) FROM usdt_latency) + "
        "(SELECT coalesce(sum(value), 0) FROM usdt_counters) AS events, "
        "(SELECT coalesce(sum(end_us - start_us), 0) FROM usdt_seconds) / 1e6 AS seconds"
    )[0]
    return int(row["events"]), float(row["seconds"])


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = sorted(r["ratio"] for r in rows)
    quartiles = (
        statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    )
    median = statistics.median(ratios)
    rates = [r["events_per_s"] for r in rows if r["events_per_s"] is not None]
    return {
        "pairs": rows,
        "median_ratio": median,
        "q1": quartiles[0],
        "q3": quartiles[2],
        "min": ratios[0],
        "max": ratios[-1],
        "cost_pct": (1 - median) * 100,
        "off_tps_median": statistics.median(r["off"] for r in rows),
        "events_per_s_median": statistics.median(rates) if rates else None,
    }


def overhead(
    pg: PgBinaries,
    traced_cluster: EmbeddedCluster,
    loaded_cluster: EmbeddedCluster,
    workload: str,
    program: str,
    pairs: int,
    seconds: float,
    work: Path,
    seed: int,
) -> dict[str, Any]:
    """Pairs of (pgbench on `loaded_cluster`) with `program` tracing `traced_cluster` and
    without. The same cluster for the program's own cost; another one for a bystander's."""
    clients = 2 * usable_cores()
    options: dict[str, Any] = (
        {"programs": ["lwlock"], "lwlock_hold": True}
        if program == "lwlock_hold"
        else {"programs": [program]}
    )
    rng = random.Random(seed)
    rows = []
    for i in range(1, pairs + 1):
        arms = ["off", "on"]
        rng.shuffle(arms)
        tps: dict[str, float] = {}
        events: tuple[int, float] = (0, 0.0)
        for arm in arms:
            if arm == "off":
                tps[arm] = pgbench(pg, loaded_cluster, workload, clients, seconds)
                continue
            run_dir = work / f"{workload}-{program}-{i}-{time.time_ns()}"
            with traced(options, pg, traced_cluster, run_dir) as store:
                tps[arm] = pgbench(pg, loaded_cluster, workload, clients, seconds)
            try:
                events = recorded_events(store)
            finally:
                store.close()
        ratio = tps["on"] / tps["off"]
        rate = events[0] / events[1] if events[1] else None
        rows.append({"pair": i, "first": arms[0], **tps, "ratio": ratio, "events_per_s": rate})
        say(
            f"  {workload} {program} pair {i}: off {tps['off']:,.0f} on {tps['on']:,.0f} tps, "
            f"ratio {ratio:.4f} ({arms[0]} first), {rate or 0:,.0f} events/s recorded"
        )
    return {"workload": workload, "program": program, "clients": clients, **summary(rows)}


def markdown(title: str, results: list[dict[str, Any]]) -> str:
    lines = [
        f"### {title}",
        "",
        "| workload | program | pairs | off tps (median) | on/off (median) | IQR | range "
        "| cost | events/s traced |",
        "|---|---|---:|---:|---:|---|---|---:|---:|",
    ]
    for r in results:
        rate = r["events_per_s_median"]
        lines.append(
            f"| {r['workload']} | {r['program']} | {len(r['pairs'])} | {r['off_tps_median']:,.0f} "
            f"| {r['median_ratio']:.4f} | {r['q1']:.4f}-{r['q3']:.4f} | {r['min']:.4f}-"
            f"{r['max']:.4f} | {r['cost_pct']:.1f}% | {'-' if rate is None else f'{rate:,.0f}'} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--programs", default="lwlock,locks,checkpoint,io")
    parser.add_argument("--workloads", default="select-only,tpcb-like")
    parser.add_argument("--hold", action="store_true", help="also lwlock hold times")
    parser.add_argument("--bystander", action="store_true", help="also the cost to a neighbour")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script")
    args = parser.parse_args()
    if args.smoke:
        args.pairs, args.seconds, args.scale = 1, 2.0, 1
    programs = [p for p in args.programs.split(",") if p] + (["lwlock_hold"] if args.hold else [])
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(workloads) - set(WORKLOAD_FLAGS)
    if unknown:
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    pg = find_binaries()
    verdict = UsdtCollector.check(CollectorEnv(pg, "embedded", None, os.geteuid() == 0))
    if not verdict.ok:
        say(f"bench_usdt: tracing unavailable: {verdict.reason}")
        return 4
    clients = 2 * usable_cores()
    payload: dict[str, Any] = {
        "host": describe_host(),
        "pairs": args.pairs,
        "seconds": args.seconds,
        "scale": args.scale,
        "smoke": args.smoke,
        "overhead": [],
        "bystander": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-usdt-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)  # the server's account reaches its cluster through it
        with cluster(args.scale, clients, work / "server.log") as target:
            for workload in workloads:
                for seed, program in enumerate(programs, 1):
                    say(f"overhead: {workload}, {program}")
                    payload["overhead"].append(
                        overhead(
                            pg,
                            target,
                            target,
                            workload,
                            program,
                            args.pairs,
                            args.seconds,
                            work,
                            seed,
                        )
                    )
            if args.bystander:
                with cluster(args.scale, clients, work / "bystander.log") as neighbour:
                    for seed, program in enumerate(programs, 100):
                        say(f"bystander: select-only on another cluster, {program}")
                        payload["bystander"].append(
                            overhead(
                                pg,
                                target,
                                neighbour,
                                "select-only",
                                program,
                                args.pairs,
                                args.seconds,
                                work,
                                seed,
                            )
                        )
    print(markdown("Throughput cost of each usdt program (traced cluster)", payload["overhead"]))
    if payload["bystander"]:
        print()
        print(markdown("Cost to another cluster on the host (bystander)", payload["bystander"]))
    if not args.smoke:
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / f"usdt-{time.strftime('%Y%m%d-%H%M%S')}.json"
        path.write_text(json.dumps(payload, indent=2, default=str))
        say(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
