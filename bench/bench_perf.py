"""Benchmarks of the CPU profilers (issue 5): their throughput cost, and the time to fold and
render a whole-cluster profile.

    overhead: select-only pgbench (-M prepared, 2x cores clients) with the perf collector at
              its default 99 Hz (attach=system, the default, and attach=process, perf -p with
              inherited events), and with the offcpu collector, each against no profiler, in
              interleaved A/B pairs (random order within a pair). Each "on" trial is a step
              exactly as in a run: step_started (recorder attached) -> pgbench -> step_finished
              (recorder stopped, stacks folded into the store, after pgbench has ended).
              Reported: the median on/off tps ratio per profiler with quartiles and range.
    render:   a 60-second on-CPU profile of the whole cluster under the same load, then the
              time to stop perf and fold its output into the store, and to read it back and
              write folded text, speedscope JSON and the HTML flame graph.

Usage:
    .venv/bin/python bench/bench_perf.py [--pairs 5] [--seconds 20] [--profile-seconds 60]
    .venv/bin/python bench/bench_perf.py --smoke      (checks the script end to end; numbers
                                                       meaningless)
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

from pgscope.analyze.profile import load_profile
from pgscope.collect import build
from pgscope.collect.base import Collector, CollectorContext, CollectorEnv, StepInfo
from pgscope.host import describe_host, usable_cores
from pgscope.proc import server_account
from pgscope.render.flame import write_profile_files
from pgscope.store import RunMeta, RunStore
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import PgBinaries, find_binaries

RESULTS = Path(__file__).parent / "results"
TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def cluster(
    scale: int, clients: int, log_dir: Path
) -> Iterator[tuple[PgBinaries, EmbeddedCluster]]:
    pg = find_binaries()
    startup = {**benchmark_defaults(clients), "shared_buffers": "512MB"}
    with EmbeddedCluster(pg, server_account(None), log_dir / "server.log", startup) as running:
        subprocess.run(
            [str(pg.path("pgbench")), "-i", "-s", str(scale), "-q", running.conn.conninfo()],
            check=True,
            capture_output=True,
        )
        yield pg, running


def pgbench(pg: PgBinaries, target: EmbeddedCluster, clients: int, seconds: float) -> float:
    argv = [
        str(pg.path("pgbench")),
        "-n", "-S", "-M", "prepared",
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
def collector(
    name: str, options: dict[str, Any], pg: PgBinaries, target: EmbeddedCluster, run_dir: Path
) -> Iterator[tuple[Collector, RunStore]]:
    """A collector driven as a run drives it, writing into a store of its own."""
    meta = RunMeta(
        run_dir.name, "bench", "bench", "", "{}", "bench_perf", "bench", "embedded",
        "embedded", describe_host(),
    )  # fmt: skip
    store = RunStore.create(run_dir, meta)
    env = CollectorEnv(pg, "embedded", target.conn, os.geteuid() == 0)
    built = build(name, options)
    verdict = type(built).check(env)
    if not verdict.ok:
        store.close()
        raise SystemExit(f"bench_perf: collector {name} unavailable: {verdict.reason}")
    built.start(
        CollectorContext(
            env=env,
            conn=target.conn,
            store=store,
            run_dir=run_dir,
            postmaster_pid=lambda: target.postmaster_pid,
            data_dir=target.data_dir,
            server_version_num=150000,
            say=say,
        )
    )
    # One empty step first: from then on the collector records only inside steps, so the
    # "off" arms run with nothing attached, as between a run's steps.
    built.step_started(StepInfo(0, "warmup", 1, 0))
    built.step_finished(StepInfo(0, "warmup", 1, 0))
    try:
        yield built, store
    finally:
        error = built.stop()
        store.close()
        if error:
            say(f"  collector {name}: {error}")


# (label, collector, options): perf in both attach modes, then off-CPU tracing.
ARMS: list[tuple[str, str, dict[str, Any]]] = [
    ("perf attach=system", "perf", {"attach": "system"}),
    ("perf attach=process", "perf", {"attach": "process"}),
    ("offcpu", "offcpu", {}),
]


def overhead(
    pg: PgBinaries,
    target: EmbeddedCluster,
    arm: tuple[str, str, dict[str, Any]],
    pairs: int,
    seconds: float,
    work: Path,
) -> dict[str, Any]:
    label, name, options = arm
    clients = 2 * usable_cores()
    rng = random.Random(5)
    rows = []
    folder = work / f"overhead-{label.replace(' ', '-').replace('=', '-')}"
    with collector(name, options, pg, target, folder) as (built, _):
        for i in range(1, pairs + 1):
            arms = ["off", "on"]
            rng.shuffle(arms)
            tps: dict[str, float] = {}
            for arm in arms:
                if arm == "on":
                    step = StepInfo(i, name, clients, 1)
                    built.step_started(step)
                    try:
                        tps[arm] = pgbench(pg, target, clients, seconds)
                    finally:
                        started = time.monotonic()
                        built.step_finished(step)
                        fold_s = time.monotonic() - started
                else:
                    tps[arm] = pgbench(pg, target, clients, seconds)
            ratio = tps["on"] / tps["off"]
            rows.append({"pair": i, "first": arms[0], **tps, "ratio": ratio, "fold_s": fold_s})
            say(
                f"  {label} pair {i}: off {tps['off']:,.0f} on {tps['on']:,.0f} tps, ratio "
                f"{ratio:.4f} ({arms[0]} first), stop+fold {fold_s:.1f} s"
            )
    ratios = sorted(r["ratio"] for r in rows)
    quartiles = (
        statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    )
    median = statistics.median(ratios)
    return {
        "profiler": label,
        "collector": name,
        "options": options,
        "clients": clients,
        "seconds": seconds,
        "pairs": rows,
        "median_ratio": median,
        "q1": quartiles[0],
        "q3": quartiles[2],
        "min": ratios[0],
        "max": ratios[-1],
        "cost_pct": (1 - median) * 100,
        "median_fold_s": statistics.median(r["fold_s"] for r in rows),
    }


def render(pg: PgBinaries, target: EmbeddedCluster, seconds: float, work: Path) -> dict[str, Any]:
    clients = 2 * usable_cores()
    run_dir = work / "render"
    with collector("perf", {}, pg, target, run_dir) as (built, store):
        step = StepInfo(1, "render", clients, 1)
        built.step_started(step)
        try:
            tps = pgbench(pg, target, clients, seconds)
        finally:
            started = time.monotonic()
            built.step_finished(step)
            fold_s = time.monotonic() - started
        started = time.monotonic()
        profile = load_profile(store, "cpu", [1], label="render")
        load_s = time.monotonic() - started
        started = time.monotonic()
        files = write_profile_files(profile, work / "files", "cpu", "bench profile")
        write_s = time.monotonic() - started
        stacks = len(profile.stacks)
    return {
        "seconds": seconds,
        "tps": tps,
        "samples": profile.total,
        "stacks": stacks,
        "stop_and_fold_s": fold_s,
        "load_s": load_s,
        "write_files_s": write_s,
        "file_bytes": {p.name: p.stat().st_size for p in files},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--profile-seconds", type=float, default=60)
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script")
    args = parser.parse_args()
    if args.smoke:
        args.pairs, args.seconds, args.profile_seconds, args.scale = 2, 3, 5, 1
    if os.geteuid() != 0:
        say("bench_perf: profiling needs root")
        return 4
    results: dict[str, Any] = {"host": describe_host(), "args": vars(args)}
    with tempfile.TemporaryDirectory(prefix="bench-perf-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)  # the server's account writes its log here
        with cluster(args.scale, 2 * usable_cores(), work) as (pg, target):
            say(f"overhead: {args.pairs} interleaved pairs of {args.seconds:g} s per profiler")
            results["overhead"] = [
                overhead(pg, target, arm, args.pairs, args.seconds, work) for arm in ARMS
            ]
            say(f"render: a {args.profile_seconds:g} s whole-cluster profile")
            results["render"] = render(pg, target, args.profile_seconds, work)
    print("| profiler | pairs | median tps ratio | q1-q3 | min-max | cost | stop+fold per step |")
    print("|---|---|---|---|---|---|---|")
    for o in results["overhead"]:
        print(
            f"| {o['profiler']} | {len(o['pairs'])} | {o['median_ratio']:.4f} | "
            f"{o['q1']:.4f}-{o['q3']:.4f} | {o['min']:.4f}-{o['max']:.4f} | "
            f"{o['cost_pct']:.1f}% | {o['median_fold_s']:.1f} s |"
        )
    r = results["render"]
    print(
        f"\n{r['seconds']:g} s profile: {r['samples']:,} samples, {r['stacks']:,} stacks; "
        f"stop+fold {r['stop_and_fold_s']:.2f} s, load {r['load_s']:.2f} s, write folded+"
        f"speedscope+HTML {r['write_files_s']:.2f} s; sizes {r['file_bytes']}"
    )
    if not args.smoke:
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / f"perf-{time.strftime('%Y%m%d-%H%M%S')}.json"
        path.write_text(json.dumps(results, indent=2, default=str))
        say(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
