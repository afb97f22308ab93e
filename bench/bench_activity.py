"""Benchmarks of the wait-event sampler (issue 3): its throughput cost, and its accuracy
against pg_wait_sampling.

    overhead: select-only, -M prepared, 2x cores clients, sampler off vs on at each rate,
              interleaved A/B pairs; median tps ratio with its spread.
    cpu:      under the same load, the CPU time the sampler takes per sample (its thread and
              its backend): a resource cost that host noise barely moves.
    accuracy: three workloads with different bottlenecks, pg_wait_sampling loaded (10 ms
              period); total-variation distance between the two client-backend wait
              distributions (waits only: Debian's pg_wait_sampling has no CPU bucket).

Usage:
    .venv/bin/python bench/bench_activity.py overhead [--pairs 5] [--seconds 20] [--rates ...]
    .venv/bin/python bench/bench_activity.py accuracy [--seconds 20] [--repeats 3]
    .venv/bin/python bench/bench_activity.py cpu [--seconds 20] [--repeats 3] [--rates ...]
    add --smoke for a quick end-to-end check of the script itself (numbers meaningless).
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

from pgscope.analyze import waits
from pgscope.host import usable_cores
from pgscope.store import now_us

PGWS = {
    "shared_preload_libraries": "pg_wait_sampling",
    "pg_wait_sampling.history_period": "10",
    "pg_wait_sampling.profile_period": "10",
    "pg_wait_sampling.history_size": "200000",
}


def overhead(args: argparse.Namespace) -> dict[str, Any]:
    clients = 2 * usable_cores()
    rates = [float(r) for r in args.rates.split(",")]
    out: dict[str, Any] = {
        "workload": "select-only -M prepared, scale 10",
        "clients": clients,
        "seconds": args.seconds,
        "rates": {},
    }
    with tempfile.TemporaryDirectory() as tmp, bench_cluster(scale=10) as (pg, cluster):
        pgbench_tps(pg, cluster, ["-b", "select-only"], clients, 5)  # warm the cache
        for rate in rates:
            print(f"rate {rate:g} Hz")
            achieved: list[float] = []

            def trial(
                on: bool, rate: float = rate, achieved: list[float] = achieved
            ) -> tuple[float, dict[str, Any]]:
                if not on:
                    return pgbench_tps(
                        pg, cluster, ["-b", "select-only"], clients, args.seconds
                    ), {}
                run_dir = Path(tmp) / f"r{time.time_ns()}"
                with collecting({"activity": {"hz": rate}}, pg, cluster, run_dir) as session:
                    tps = pgbench_tps(pg, cluster, ["-b", "select-only"], clients, args.seconds)
                    rate_row = waits.sampler_rate(session.store.db)
                hz = rate_row.achieved_hz if rate_row else 0.0
                achieved.append(hz)
                return tps, {
                    "achieved_hz": hz,
                    "query_mean_ms": rate_row.query_mean_ms if rate_row else None,
                }

            pairs = interleaved_pairs(args.pairs, trial, seed=int(rate))
            out["rates"][f"{rate:g}"] = {
                **ratio_summary(pairs),
                "achieved_hz_median": statistics.median(achieved),
                "pairs_detail": [p.__dict__ for p in pairs],
            }
    return out


def cpu_cost(args: argparse.Namespace) -> dict[str, Any]:
    """CPU time the sampler costs per sample, under the overhead benchmark's load: the
    sampling thread's own (thread CPU clock) and its backend's (/proc/PID/stat). Unlike a
    throughput ratio, host noise barely moves it."""
    import threading

    import pgscope.collect.activity as activity

    clock_ticks = os.sysconf("SC_CLK_TCK")
    thread_cpu: dict[str, float] = {}
    original = activity.ActivityCollector.run_loop

    def timed(self: Any) -> None:
        start = time.thread_time()
        try:
            original(self)
        finally:
            thread_cpu["s"] = time.thread_time() - start

    activity.ActivityCollector.run_loop = timed

    def backend_cpu(pid: int) -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / clock_ticks

    clients = 2 * usable_cores()
    rates = [float(r) for r in args.rates.split(",")]
    out: dict[str, Any] = {"clients": clients, "seconds": args.seconds, "rates": {}}
    with tempfile.TemporaryDirectory() as tmp, bench_cluster(scale=10) as (pg, cluster):
        for rate in rates:
            rows = []
            for _ in range(args.repeats):
                run_dir = Path(tmp) / f"c{time.time_ns()}"
                load = threading.Thread(
                    target=pgbench_tps,
                    args=(pg, cluster, ["-b", "select-only"], clients, args.seconds),
                )
                with collecting({"activity": {"hz": rate}}, pg, cluster, run_dir):
                    load.start()
                    time.sleep(1.5)
                    with cluster.connect() as conn:
                        row = conn.execute(
                            "SELECT pid FROM pg_stat_activity WHERE "
                            "application_name = 'pgscope-sampler'"
                        ).fetchone()
                    pid = int(row[0]) if row else 0
                    before = backend_cpu(pid)
                    load.join()
                    after = backend_cpu(pid)
                samples = store_samples(run_dir)
                rows.append(
                    {
                        "samples": samples,
                        "thread_cpu_s": thread_cpu.get("s", 0.0),
                        "backend_cpu_s": after - before,
                    }
                )
            per_sample = [
                (r["thread_cpu_s"] + r["backend_cpu_s"]) / r["samples"] * 1000
                for r in rows
                if r["samples"]
            ]
            thread = [r["thread_cpu_s"] / r["samples"] * 1000 for r in rows if r["samples"]]
            backend = [r["backend_cpu_s"] / r["samples"] * 1000 for r in rows if r["samples"]]
            median = statistics.median(per_sample)
            out["rates"][f"{rate:g}"] = {
                "repeats": rows,
                "ms_per_sample_median": median,
                "ms_per_sample_range": [min(per_sample), max(per_sample)],
                "thread_ms_median": statistics.median(thread),
                "backend_ms_median": statistics.median(backend),
                "share_of_one_core": median * rate / 1000,
                "share_of_host": median * rate / 1000 / usable_cores(),
            }
            print(
                f"{rate:g} Hz: {median:.3f} ms CPU per sample "
                f"({statistics.median(thread):.3f} ours + {statistics.median(backend):.3f} "
                f"server), {median * rate / 10:.2f}% of one core"
            )
    return out


def store_samples(run_dir: Path) -> int:
    import duckdb

    db = duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)
    try:
        row = db.execute("SELECT count(DISTINCT sample_no) FROM activity_samples").fetchone()
    finally:
        db.close()
    return int(row[0]) if row else 0


WORKLOADS: dict[str, dict[str, Any]] = {
    "select-only": {"scale": 10, "clients": 4, "pgbench": ["-b", "select-only"]},
    "tpcb-like, scale 1, 8 clients (hot rows)": {
        "scale": 1,
        "clients": 8,
        "pgbench": ["-b", "tpcb-like"],
    },
    "insert-only, synchronous_commit=on": {"scale": 0, "clients": 4, "pgbench": "insert"},
}


def accuracy(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"seconds": args.seconds, "repeats": args.repeats, "workloads": {}}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "insert.sql"
        script.write_text("insert into test(info) values (null);\n")
        os.chmod(tmp, 0o755)
        for name, spec in WORKLOADS.items():
            print(name)
            with bench_cluster(PGWS, scale=int(spec["scale"])) as (pg, cluster):
                with cluster.connect() as conn:
                    conn.execute("CREATE EXTENSION pg_wait_sampling")
                    conn.execute(
                        "CREATE TABLE IF NOT EXISTS test(id serial primary key, "
                        "info text, crt_time timestamp)"
                    )
                workload = (
                    ["-f", str(script)] if spec["pgbench"] == "insert" else list(spec["pgbench"])
                )
                results = []
                for repeat in range(args.repeats):
                    run_dir = Path(tmp) / f"acc{time.time_ns()}"
                    with collecting({"activity": {}, "pgws": {}}, pg, cluster, run_dir) as session:
                        start = now_us()
                        pgbench_tps(pg, cluster, workload, int(spec["clients"]), args.seconds)
                        end = now_us()
                        # pg_wait_sampling's ring is copied every 0.5 s: wait for the last.
                        time.sleep(1.2)
                        comparison = waits.compare_with_pgws(
                            session.store.db, start + 1_000_000, end - 500_000
                        )
                    if comparison is None:
                        print("  no comparison (one side empty)")
                        continue
                    print(
                        f"  repeat {repeat + 1}: TVD {comparison.tvd:.4f} "
                        f"({comparison.pgscope_rows} vs {comparison.pgws_rows} rows)"
                    )
                    results.append(comparison.to_json())
                tvds = [r["total_variation_distance"] for r in results]
                out["workloads"][name] = {
                    "tvd_median": statistics.median(tvds) if tvds else None,
                    "tvd_max": max(tvds) if tvds else None,
                    "repeats": results,
                }
    return out


def markdown_overhead(result: dict[str, Any]) -> str:
    lines = [
        f"select-only, {result['clients']} clients, {result['seconds']} s per trial",
        "",
        "| rate | pairs | median tps ratio (on/off) | IQR | range | cost | achieved |",
        "|---|---|---|---|---|---|---|",
    ]
    for rate, r in result["rates"].items():
        lines.append(
            f"| {rate} Hz | {r['pairs']} | {r['median_ratio']:.4f} | "
            f"{r['q1']:.4f}–{r['q3']:.4f} | {r['min']:.4f}–{r['max']:.4f} | "
            f"{r['cost_pct']:.2f}% | {r['achieved_hz_median']:.1f} Hz |"
        )
    return "\n".join(lines)


def markdown_accuracy(result: dict[str, Any]) -> str:
    lines = [
        "| workload | repeats | TVD median | TVD max | top waits (pgscope / pg_wait_sampling) |",
        "|---|---|---|---|---|",
    ]
    for name, r in result["workloads"].items():
        if not r["repeats"]:
            continue
        first = r["repeats"][0]
        ours = ", ".join(list(first["pgscope"])[:3])
        theirs = ", ".join(list(first["pg_wait_sampling"])[:3])
        lines.append(
            f"| {name} | {len(r['repeats'])} | {r['tvd_median']:.4f} | "
            f"{r['tvd_max']:.4f} | {ours} / {theirs} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("which", choices=["overhead", "accuracy", "cpu"])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rates", default="10,50,100,500")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script")
    args = parser.parse_args()
    if args.smoke:
        args.pairs, args.seconds, args.repeats, args.rates = 2, 3, 1, "50"
    if args.which == "overhead":
        result = overhead(args)
        print(markdown_overhead(result))
    elif args.which == "cpu":
        result = cpu_cost(args)
    else:
        result = accuracy(args)
        print(markdown_accuracy(result))
    path = write_results(f"activity-{args.which}" + ("-smoke" if args.smoke else ""), result)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
