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
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from abtest import (
    Collecting,
    bench_cluster,
    collecting,
    interleaved_pairs,
    pgbench_tps,
    ratio_summary,
    write_results,
)

from pgscope.analyze.profile import load_profile
from pgscope.collect.base import StepInfo
from pgscope.host import describe_host, usable_cores
from pgscope.render.flame import write_profile_files
from pgscope.target.embedded import EmbeddedCluster
from pgscope.target.pgbin import PgBinaries

SELECT_ONLY = ["-b", "select-only"]


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def profiled_step(session: Collecting, step: StepInfo, run: Any) -> tuple[float, float]:
    """`run()` inside one step, as a run drives it: step_started attaches the recorder,
    step_finished stops it and folds its stacks into the store. -> (tps, stop+fold seconds)"""
    session.collectors.step_started(step)
    try:
        tps = float(run())
    finally:
        started = time.monotonic()
        session.collectors.step_finished(step)
        fold_s = time.monotonic() - started
    return tps, fold_s


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
    seconds: int,
    work: Path,
    seed: int,
) -> dict[str, Any]:
    label, name, options = arm
    clients = 2 * usable_cores()
    folder = work / f"overhead-{label.replace(' ', '-').replace('=', '-')}"
    with collecting({name: options}, pg, target, folder) as session:
        # An empty step first: from then on the collector records only inside steps, so the
        # "off" arms run with nothing attached, as between a run's steps.
        warmup = StepInfo(0, "warmup", 1, 0)
        session.collectors.step_started(warmup)
        session.collectors.step_finished(warmup)
        steps = iter(range(1, 2 * pairs + 1))

        def trial(on: bool) -> tuple[float, dict[str, Any]]:
            if not on:
                return pgbench_tps(pg, target, SELECT_ONLY, clients, seconds), {}
            step = StepInfo(next(steps), name, clients, 1)
            tps, fold_s = profiled_step(
                session, step, lambda: pgbench_tps(pg, target, SELECT_ONLY, clients, seconds)
            )
            return tps, {"fold_s": fold_s}

        said = lambda line: say(f"  {label}{line}")  # noqa: E731
        results = interleaved_pairs(pairs, trial, seed=seed, say=said)
    return {
        "profiler": label,
        "collector": name,
        "options": options,
        "clients": clients,
        "seconds": seconds,
        **ratio_summary(results),
        "median_fold_s": statistics.median(p.detail["fold_s"] for p in results),
        "pairs_detail": [p.__dict__ for p in results],
    }


def render(pg: PgBinaries, target: EmbeddedCluster, seconds: int, work: Path) -> dict[str, Any]:
    clients = 2 * usable_cores()
    with collecting({"perf": {}}, pg, target, work / "render") as session:
        tps, fold_s = profiled_step(
            session,
            StepInfo(1, "render", clients, 1),
            lambda: pgbench_tps(pg, target, SELECT_ONLY, clients, seconds),
        )
        started = time.monotonic()
        profile = load_profile(session.store, "cpu", [1], label="render")
        load_s = time.monotonic() - started
        started = time.monotonic()
        files = write_profile_files(profile, work / "files", "cpu", "bench profile")
        write_s = time.monotonic() - started
    return {
        "seconds": seconds,
        "tps": tps,
        "samples": profile.total,
        "stacks": len(profile.stacks),
        "stop_and_fold_s": fold_s,
        "load_s": load_s,
        "write_files_s": write_s,
        "file_bytes": {p.name: p.stat().st_size for p in files},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--profile-seconds", type=int, default=60)
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
        with bench_cluster(scale=args.scale, log_dir=work) as (pg, target):
            say(f"overhead: {args.pairs} interleaved pairs of {args.seconds} s per profiler")
            results["overhead"] = [
                overhead(pg, target, arm, args.pairs, args.seconds, work, seed)
                for seed, arm in enumerate(ARMS, 5)
            ]
            say(f"render: a {args.profile_seconds} s whole-cluster profile")
            results["render"] = render(pg, target, args.profile_seconds, work)
    print("| profiler | pairs | median tps ratio | q1-q3 | min-max | cost | stop+fold per step |")
    print("|---|---|---|---|---|---|---|")
    for o in results["overhead"]:
        print(
            f"| {o['profiler']} | {o['pairs']} | {o['median_ratio']:.4f} | "
            f"{o['q1']:.4f}-{o['q3']:.4f} | {o['min']:.4f}-{o['max']:.4f} | "
            f"{o['cost_pct']:.1f}% | {o['median_fold_s']:.1f} s |"
        )
    r = results["render"]
    print(
        f"\n{r['seconds']} s profile: {r['samples']:,} samples, {r['stacks']:,} stacks; "
        f"stop+fold {r['stop_and_fold_s']:.2f} s, load {r['load_s']:.2f} s, write folded+"
        f"speedscope+HTML {r['write_files_s']:.2f} s; sizes {r['file_bytes']}"
    )
    if not args.smoke:
        say(f"saved {write_results('perf', results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
