"""What the account of active time costs the load (issue 29): plan capture and the counting it
opens, against pgscope's earlier defaults, as interleaved A/B pairs.

    off: a cluster with pg_stat_statements as pgscope used to start it (top-level statements
         only, planning untimed, functions uncounted), no auto_explain;
    on:  a cluster as pgscope starts one now, driven by the real statements collector:
         auto_explain loaded and sampling about `plans_per_s` statements a second into the
         server log (read back into the store after each trial, as after a step), nested
         statements, planning time and functions counted.

Both clusters exist for the whole benchmark; each pair runs pgbench on one then the other, in
a random order, for select-only (the cheapest statement, where a per-statement cost shows
most) and tpcb-like. The cost is 1 - the median on/off tps ratio, with its spread.

    .venv/bin/python bench/bench_plans.py [--pairs 5] [--seconds 20] [--clients 4]
    add --smoke for a quick end-to-end check of the script itself (numbers meaningless).
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

from abtest import (
    bench_cluster,
    collecting,
    interleaved_pairs,
    pgbench_tps,
    ratio_summary,
    write_results,
)

from pgscope.collect.base import StepInfo
from pgscope.collect.statistics.plancapture import SETTINGS as PLAN_SETTINGS
from pgscope.collect.statistics.statements import COUNTING

BEFORE = {"shared_preload_libraries": "pg_stat_statements"}
NOW = {
    **COUNTING,
    **PLAN_SETTINGS,
    "shared_preload_libraries": "pg_stat_statements,auto_explain",
}
WORKLOADS = {"select-only": ["-S"], "tpcb-like": []}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.pairs, args.seconds = 1, 2
    results: dict[str, Any] = {
        "pairs": args.pairs,
        "seconds": args.seconds,
        "clients": args.clients,
    }
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-plans-")))
        folder.chmod(0o755)
        pg, off = stack.enter_context(bench_cluster(BEFORE, log_dir=folder))
        _, on = stack.enter_context(bench_cluster(NOW, log_dir=folder))
        for cluster in (off, on):
            with cluster.connect() as session:
                session.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        run_dir = folder / "run"
        collected = stack.enter_context(collecting({"statements": {}}, pg, on, run_dir))
        # The plans are read back from the run's server.log, as in a run; here the cluster
        # logs to its own file.
        (run_dir / "server.log").symlink_to(on.log_path)
        step = [0]

        def trial(workload: list[str]) -> Any:
            def run(arm: bool) -> tuple[float, dict[str, Any]]:
                if not arm:
                    return pgbench_tps(pg, off, workload, args.clients, args.seconds), {}
                step[0] += 1
                info = StepInfo(step[0], "on", args.clients, 1)
                collected.collectors.step_started(info)
                tps = pgbench_tps(pg, on, workload, args.clients, args.seconds)
                collected.collectors.step_finished(info)
                plans = collected.store.query(
                    "SELECT count(*) AS n FROM plan_samples WHERE step_id = ? AND NOT nested",
                    [step[0]],
                )[0]["n"]
                return tps, {"plans": plans, "plans_per_s": plans / args.seconds}

            return run

        for name, workload in WORKLOADS.items():
            print(f"{name}: {args.pairs} pairs of {args.seconds} s, {args.clients} clients")
            pairs = interleaved_pairs(args.pairs, trial(workload), seed=len(name))
            summary = ratio_summary(pairs)
            summary["plans_per_s"] = sum(p.detail["plans_per_s"] for p in pairs) / len(pairs)
            if not args.smoke and summary["plans_per_s"] < 1:
                # Without plans sampled, "on" would measure the settings alone.
                raise SystemExit(f"bench: {name}: no plans were sampled")
            results[name] = {"summary": summary, "pairs": [p.__dict__ for p in pairs]}
            print(
                f"  cost {summary['cost_pct']:+.2f}% (median on/off {summary['median_ratio']:.4f}, "
                f"quartiles {summary['q1']:.4f}-{summary['q3']:.4f}, range "
                f"{summary['min']:.4f}-{summary['max']:.4f}), "
                f"{summary['plans_per_s']:.1f} plans sampled a second"
            )
    results["at"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    print(f"saved {write_results('plans', results)}")


if __name__ == "__main__":
    main()
