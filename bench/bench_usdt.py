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
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from abtest import (
    bench_cluster,
    collecting,
    interleaved_pairs,
    pgbench_tps,
    ratio_summary,
    write_results,
)

from pgscope.collect.base import CollectorEnv
from pgscope.collect.tracing.usdt import UsdtCollector
from pgscope.host import describe_host, usable_cores
from pgscope.store import RunStore
from pgscope.target.embedded import EmbeddedCluster
from pgscope.target.pgbin import PgBinaries, find_binaries

WORKLOADS = ("select-only", "tpcb-like")


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def recorded_events(store: RunStore) -> tuple[int, float]:
    """(events recorded, seconds traced) in a trial's store: latency events and counters."""
    row = store.query(
        "SELECT (SELECT coalesce(sum(count), 0) FROM usdt_latency) + "
        "(SELECT coalesce(sum(value), 0) FROM usdt_counters) AS events, "
        "(SELECT coalesce(sum(end_us - start_us), 0) FROM usdt_seconds) / 1e6 AS seconds"
    )[0]
    return int(row["events"]), float(row["seconds"])


def overhead(
    pg: PgBinaries,
    traced_cluster: EmbeddedCluster,
    loaded_cluster: EmbeddedCluster,
    workload: str,
    program: str,
    pairs: int,
    seconds: int,
    work: Path,
    seed: int,
) -> dict[str, Any]:
    """Pairs of (pgbench on `loaded_cluster`) with `program` tracing `traced_cluster` and
    without. The same cluster for the program's own cost; another one for a bystander's."""
    clients = 2 * usable_cores()
    flags = ["-b", workload]
    options: dict[str, Any] = (
        {"programs": ["lwlock"], "lwlock_hold": True}
        if program == "lwlock_hold"
        else {"programs": [program]}
    )

    def trial(on: bool) -> tuple[float, dict[str, Any]]:
        if not on:
            return pgbench_tps(pg, loaded_cluster, flags, clients, seconds), {}
        events: list[tuple[int, float]] = []
        run_dir = work / f"{workload}-{program}-{time.time_ns()}"
        # Attached before pgbench starts and detached after it ends, as in a run.
        with collecting(
            {"usdt": options},
            pg,
            traced_cluster,
            run_dir,
            on_stopped=lambda store: events.append(recorded_events(store)),
        ):
            tps = pgbench_tps(pg, loaded_cluster, flags, clients, seconds)
        count, traced_s = events[0]
        return tps, {"events_per_s": count / traced_s if traced_s else None}

    def said(line: str) -> None:
        say(f"  {workload} {program}{line}")

    results = interleaved_pairs(pairs, trial, seed=seed, say=said)
    rates = [p.detail["events_per_s"] for p in results if p.detail["events_per_s"] is not None]
    return {
        "workload": workload,
        "program": program,
        "clients": clients,
        **ratio_summary(results),
        "events_per_s_median": statistics.median(rates) if rates else None,
        "pairs_detail": [p.__dict__ for p in results],
    }


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
            f"| {r['workload']} | {r['program']} | {r['pairs']} | {r['off_tps_median']:,.0f} "
            f"| {r['median_ratio']:.4f} | {r['q1']:.4f}-{r['q3']:.4f} | {r['min']:.4f}-"
            f"{r['max']:.4f} | {r['cost_pct']:.1f}% | {'-' if rate is None else f'{rate:,.0f}'} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--programs", default="lwlock,locks,checkpoint,io")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--hold", action="store_true", help="also lwlock hold times")
    parser.add_argument("--bystander", action="store_true", help="also the cost to a neighbour")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script")
    args = parser.parse_args()
    if args.smoke:
        args.pairs, args.seconds, args.scale = 1, 2, 1
    programs = [p for p in args.programs.split(",") if p] + (["lwlock_hold"] if args.hold else [])
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    verdict = UsdtCollector.check(
        CollectorEnv(find_binaries(), "embedded", None, os.geteuid() == 0)
    )
    if not verdict.ok:
        say(f"bench_usdt: tracing unavailable: {verdict.reason}")
        return 4
    payload: dict[str, Any] = {
        "host": describe_host(),
        "args": vars(args),
        "overhead": [],
        "bystander": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-usdt-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)  # the server's account reaches its cluster through it
        with bench_cluster(scale=args.scale, log_dir=work) as (pg, target):
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
                with bench_cluster(scale=args.scale, log_dir=work) as (_, neighbour):
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
        say(f"saved {write_results('usdt', payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
