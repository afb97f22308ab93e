"""Benchmarks of the wait-event sampler (issue 3): its throughput cost, and its accuracy
against pg_wait_sampling.

    overhead: select-only, -M prepared, 2x cores clients, sampler off vs on at each rate,
              interleaved A/B pairs; median tps ratio with its spread.
    cpu:      under the same load, the CPU time the sampler takes per sample (this process,
              every thread, up to its last write; and its backend): a resource cost that host
              noise barely moves.
    pgws-cpu: the reference: pg_wait_sampling's collector's own CPU at 100 Hz (10-ms
              period), idle and under that load.
    floor:    where a sample's server CPU goes, under the same load at 100 Hz: the parts of
              an SQL sampler run alone (sleeping to schedule; and reading the wait events
              through the per-backend functions; or through pg_stat_get_activity), then
              pgscope's statement, interleaved; pg_wait_sampling's collector, on the same
              cluster, as the reference.
    accuracy: three workloads with different bottlenecks, pg_wait_sampling loaded (10 ms
              period); total-variation distance between the two client-backend wait
              distributions (waits only: Debian's pg_wait_sampling has no CPU bucket).

Usage:
    .venv/bin/python bench/bench_activity.py overhead [--pairs 5] [--seconds 20] [--rates ...]
    .venv/bin/python bench/bench_activity.py accuracy [--seconds 20] [--repeats 3]
    .venv/bin/python bench/bench_activity.py cpu [--seconds 20] [--repeats 3] [--rates ...]
    .venv/bin/python bench/bench_activity.py pgws-cpu [--seconds 20] [--repeats 3]
    .venv/bin/python bench/bench_activity.py floor [--seconds 6] [--repeats 5]
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
                read: dict[str, Any] = {}

                def on_stopped(store: Any, read: dict[str, Any] = read) -> None:
                    # Read once the sampler has stopped: it writes its rows every 10 s.
                    read["rate"] = waits.sampler_rate(store.db)

                with collecting({"activity": {"hz": rate}}, pg, cluster, run_dir, on_stopped):
                    tps = pgbench_tps(pg, cluster, ["-b", "select-only"], clients, args.seconds)
                rate_row = read.get("rate")
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
    """CPU time the sampler costs per sample, under the overhead benchmark's load: ours (this
    process's CPU time while sampling, every thread of it: the sampling thread and DuckDB's,
    up to the last write at stop) and its backend's (/proc/PID/schedstat, in ns). Unlike a
    throughput ratio, host noise barely moves it."""

    clients = 2 * usable_cores()
    rates = [float(r) for r in args.rates.split(",")]
    out: dict[str, Any] = {"clients": clients, "seconds": args.seconds, "rates": {}}
    with tempfile.TemporaryDirectory() as tmp, bench_cluster(scale=10) as (pg, cluster):
        pgbench_tps(pg, cluster, ["-b", "select-only"], clients, 3)  # warm the cache
        sources = args.sources.split(",")
        for rate in rates:
            rows: dict[str, list[dict[str, Any]]] = {source: [] for source in sources}
            for _ in range(args.repeats):
                for source in sources:  # interleaved
                    rows[source].append(
                        sampling_cost(pg, cluster, Path(tmp), rate, args.seconds, clients, source)
                    )
            for source in sources:
                key = f"{rate:g}" if source == "sql" else f"{rate:g} {source}"
                out["rates"][key] = cost_summary(rows[source], rate)
                r = out["rates"][key]
                print(
                    f"{key} Hz: {r['ms_per_sample_median']:.3f} ms CPU per sample "
                    f"({r['client_ms_median']:.3f} ours + {r['backend_ms_median']:.3f} server), "
                    f"{100 * r['share_of_one_core']:.2f}% of one core "
                    "(range {:.3f}-{:.3f} ms)".format(*r["ms_per_sample_range"])
                )
    return out


def sampling_cost(
    pg: Any, cluster: Any, tmp: Path, rate: float, seconds: int, clients: int, source: str = "sql"
) -> dict[str, Any]:
    """One trial: the sampler at `rate` while select-only runs `seconds`."""
    import threading

    run_dir = tmp / f"c{time.time_ns()}"
    load = threading.Thread(
        target=pgbench_tps, args=(pg, cluster, ["-b", "select-only"], clients, seconds)
    )
    stopped: dict[str, float] = {}

    def on_stopped(_store: Any) -> None:  # every row written, the store not yet closed
        stopped["cpu"] = time.process_time()
        stopped["us"] = now_us()

    with collecting({"activity": {"hz": rate, "source": source}}, pg, cluster, run_dir, on_stopped):
        load.start()
        time.sleep(1.5)
        with cluster.connect() as conn:
            row = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgscope-sampler'"
            ).fetchone()
        pid = int(row[0]) if row else 0
        helper = helper_pid()
        start_us, start_cpu, start_backend = now_us(), time.process_time(), backend_ns(pid)
        start_helper = backend_ns(helper) if helper else 0
        load.join()
        end_backend, end_us = backend_ns(pid), now_us()
        end_helper = backend_ns(helper) if helper else 0
    server_samples = samples_between(run_dir, start_us, end_us)
    client_samples = samples_between(run_dir, start_us, int(stopped["us"]))
    return {
        "samples": server_samples,
        "rows_per_sample": rows_between(run_dir, start_us, end_us) / max(1, server_samples),
        "client_cpu_s": stopped["cpu"] - start_cpu,
        "client_samples": client_samples,
        "backend_cpu_s": (end_backend - start_backend) / 1e9,
        "helper_cpu_s": (end_helper - start_helper) / 1e9,
    }


def helper_pid() -> int:
    """The compiled sampler's pid, a child of ours (the memory source's), else 0: its CPU
    is ours, but process_time() does not count a child's."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)
            if fields[0].endswith("(pgscope-shmem-s") and int(fields[1].split()[1]) == os.getpid():
                return int(stat.parent.name)
        except (OSError, IndexError, ValueError):
            continue
    return 0


def cost_summary(rows: list[dict[str, Any]], rate: float) -> dict[str, Any]:
    client = [
        r["client_cpu_s"] / r["client_samples"] * 1000
        + r.get("helper_cpu_s", 0.0) / r["samples"] * 1000
        for r in rows
        if r["samples"]
    ]
    backend = [r["backend_cpu_s"] / r["samples"] * 1000 for r in rows if r["samples"]]
    per_sample = [c + b for c, b in zip(client, backend, strict=True)]
    median = statistics.median(per_sample)
    return {
        "repeats": rows,
        "ms_per_sample_median": median,
        "ms_per_sample_range": [min(per_sample), max(per_sample)],
        "client_ms_median": statistics.median(client),
        "backend_ms_median": statistics.median(backend),
        "share_of_one_core": median * rate / 1000,
        "share_of_host": median * rate / 1000 / usable_cores(),
    }


def spread(values: list[float]) -> dict[str, Any]:
    """Repeats as a reader takes them: the median and the range."""
    return {"median": statistics.median(values), "range": [min(values), max(values)]}


def backend_ns(pid: int) -> int:
    """A process's CPU time so far, in ns (schedstat: finer than /proc/PID/stat's ticks)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def pgws_collector(cluster: Any) -> int:
    """pg_wait_sampling's extension created on a cluster that preloads it (PGWS); its
    collector process's pid."""
    with cluster.connect() as conn:
        conn.execute("CREATE EXTENSION pg_wait_sampling")
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_wait_sampling collector'"
        ).fetchone()
    assert row is not None, "pg_wait_sampling's collector is not running"
    return int(row[0])


def pgws_cpu(args: argparse.Namespace) -> dict[str, Any]:
    """The reference: pg_wait_sampling's collector process's own CPU at its 10-ms period
    (100 Hz), idle and under the cpu benchmark's load, alternating."""
    import threading

    clients = 2 * usable_cores()
    out: dict[str, Any] = {"period_ms": 10, "clients": clients, "trials": []}
    with bench_cluster(PGWS, scale=10) as (pg, cluster):
        pid = pgws_collector(cluster)
        for _ in range(args.repeats):
            for loaded in (False, True):
                load = threading.Thread(
                    target=pgbench_tps,
                    args=(pg, cluster, ["-b", "select-only"], clients, args.seconds + 2),
                )
                if loaded:
                    load.start()
                time.sleep(1)
                before, began = backend_ns(pid), time.monotonic()
                time.sleep(args.seconds)
                cpu_s, wall = (backend_ns(pid) - before) / 1e9, time.monotonic() - began
                if loaded:
                    load.join()
                share = cpu_s / wall
                out["trials"].append({"load": loaded, "share_of_one_core": share})
                print(
                    f"pg_wait_sampling collector, {'load' if loaded else 'idle'}: "
                    f"{100 * share:.2f}% of one core, {share * 1e4:.1f} us per 10-ms period"
                )
    for loaded in (False, True):
        shares = [t["share_of_one_core"] for t in out["trials"] if t["load"] == loaded]
        out["idle" if not loaded else "load"] = spread(shares)
    return out


# The parts of a sample, each a statement of 100-Hz samples: `{read}` is what a sample reads
# after sleeping to its schedule and clearing the status snapshot. The per-backend functions'
# id set is a set-returning function in a target list (re-run each sample, as a sampler must:
# a function scan would rewind its first result); each read is aggregated to one text per
# sample, as the sampler does.
FLOOR_SQL = """
SELECT count(*), sum(length(r.x)) FROM generate_series(1, %(n)s) AS s(n)
CROSS JOIN LATERAL (
    SELECT pg_sleep(greatest(0, %(interval)s * (s.n - 1)
                    - date_part('epoch', clock_timestamp() - statement_timestamp()))),
           pg_stat_clear_snapshot()
    OFFSET 0) AS p
CROSS JOIN LATERAL ({read}) AS r
"""
FLOOR_READS = {
    "sleep, nothing read": "SELECT ''::text AS x WHERE s.n > 0",
    "sleep + per-backend functions": (
        "SELECT string_agg(concat(pg_stat_get_backend_pid(i.id), ',', "
        "pg_stat_get_backend_wait_event_type(i.id), ',', pg_stat_get_backend_wait_event(i.id)), "
        "';') AS x FROM (SELECT pg_stat_get_backend_idset() AS id WHERE s.n > 0) AS i"
    ),
    "sleep + pg_stat_get_activity": (
        "SELECT string_agg(concat(g.pid, ',', g.wait_event_type, ',', g.wait_event), ';') AS x "
        "FROM pg_stat_get_activity(CASE WHEN s.n > 0 THEN NULL::int END) AS g"
    ),
}


def floor(args: argparse.Namespace) -> dict[str, Any]:
    """Server CPU per sample of each part, and of pgscope's whole statement, interleaved
    under select-only load (4 clients); pg_wait_sampling's collector per 10-ms period."""
    import threading

    import psycopg

    from pgscope.collect.sampling.activity import BATCH_SQL

    rate, clients = 100, 2 * usable_cores()
    samples = args.seconds * rate
    statements = {name: FLOOR_SQL.format(read=read) for name, read in FLOOR_READS.items()}
    statements["pgscope's statement (all of it)"] = BATCH_SQL
    per_sample: dict[str, list[float]] = {name: [] for name in statements}
    reference: list[float] = []
    with bench_cluster(PGWS, scale=10) as (pg, cluster):
        collector = pgws_collector(cluster)
        pgbench_tps(pg, cluster, ["-b", "select-only"], clients, 3)  # warm the cache
        with psycopg.connect(cluster.conn.conninfo(), autocommit=True) as session:
            pid = session.info.backend_pid
            params = {
                "n": samples,
                "interval": 1 / rate,
                "known": [],
                "databases": [],
                "roles": [],
            }
            for _ in range(args.repeats):
                for name, sql in statements.items():
                    load = threading.Thread(
                        target=pgbench_tps,
                        args=(pg, cluster, ["-b", "select-only"], clients, args.seconds + 2),
                    )
                    load.start()
                    time.sleep(1)
                    before, ref_before, began = backend_ns(pid), backend_ns(collector), now_us()
                    session.cursor(binary=True).execute(sql, params).fetchall()
                    spent, ref_spent = backend_ns(pid) - before, backend_ns(collector) - ref_before
                    periods = (now_us() - began) / 1e6 * rate
                    load.join()
                    per_sample[name].append(spent / samples / 1000)
                    reference.append(ref_spent / periods / 1000)
    out: dict[str, Any] = {"rate_hz": rate, "clients": clients, "seconds": args.seconds}
    out["server_us_per_sample"] = {
        name: {**spread(v), "trials": v} for name, v in per_sample.items()
    }
    out["pg_wait_sampling_us_per_period"] = spread(reference)
    print(f"| part (server CPU per sample, {rate} Hz, under load) | median | range |")
    print("|---|---|---|")
    for name, r in out["server_us_per_sample"].items():
        print(f"| {name} | {r['median']:.0f} us | {r['range'][0]:.0f}-{r['range'][1]:.0f} us |")
    r = out["pg_wait_sampling_us_per_period"]
    print(
        f"| pg_wait_sampling's collector, per 10-ms period | {r['median']:.0f} us | "
        f"{r['range'][0]:.0f}-{r['range'][1]:.0f} us |"
    )
    return out


def samples_between(run_dir: Path, start_us: int, end_us: int) -> int:
    return int(_one(run_dir, "count(DISTINCT sample_no)", start_us, end_us))


def rows_between(run_dir: Path, start_us: int, end_us: int) -> int:
    return int(_one(run_dir, "count(*)", start_us, end_us))


def _one(run_dir: Path, what: str, start_us: int, end_us: int) -> Any:
    import duckdb

    db = duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)
    try:
        row = db.execute(
            f"SELECT {what} FROM activity_samples WHERE ts_us BETWEEN ? AND ?",
            [start_us, end_us],
        ).fetchone()
    finally:
        db.close()
    return row[0] if row else 0


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
    out: dict[str, Any] = {
        "seconds": args.seconds,
        "repeats": args.repeats,
        "hz": args.hz or 50,
        "workloads": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "insert.sql"
        script.write_text("insert into test(info) values (null);\n")
        os.chmod(tmp, 0o755)
        for name, spec in WORKLOADS.items():
            if not any(name.startswith(w) for w in args.workloads.split(",")):
                continue
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
                sources = args.sources.split(",")
                results: dict[str, list[dict[str, Any]]] = {source: [] for source in sources}
                for repeat in range(args.repeats):
                    for source in sources:  # interleaved
                        comparison = compare_once(
                            pg, cluster, Path(tmp), workload, spec, source, args
                        )
                        if comparison is None:
                            print(f"  {source}: no comparison (one side empty)")
                            continue
                        print(
                            f"  {source} repeat {repeat + 1}: TVD {comparison.tvd:.4f} "
                            f"({comparison.pgscope_rows} vs {comparison.pgws_rows} rows)"
                        )
                        results[source].append(comparison.to_json())
                for source in sources:
                    tvds = [r["total_variation_distance"] for r in results[source]]
                    key = name if source == "sql" else f"{name} ({source})"
                    out["workloads"][key] = {
                        "tvd_median": statistics.median(tvds) if tvds else None,
                        "tvd_max": max(tvds) if tvds else None,
                        "repeats": results[source],
                    }
    return out


def compare_once(
    pg: Any,
    cluster: Any,
    tmp: Path,
    workload: list[str],
    spec: dict[str, Any],
    source: str,
    args: argparse.Namespace,
) -> Any:
    """One trial of the accuracy benchmark: the sampler (from `source`) beside
    pg_wait_sampling while `workload` runs; their comparison, None if one side is empty."""
    run_dir = tmp / f"acc{time.time_ns()}"
    compared: dict[str, Any] = {}

    def on_stopped(store: Any) -> None:
        # Compared once both have stopped: the sampler writes every 10 s.
        compared["it"] = waits.compare_with_pgws(
            store.db, compared["start"] + 1_000_000, compared["end"] - 500_000
        )

    activity = {"source": source, **({"hz": args.hz} if args.hz else {})}
    with collecting({"activity": activity, "pgws": {}}, pg, cluster, run_dir, on_stopped):
        compared["start"] = now_us()
        pgbench_tps(pg, cluster, workload, int(spec["clients"]), args.seconds)
        compared["end"] = now_us()
        # pg_wait_sampling's ring is copied every 0.5 s: wait for the last.
        time.sleep(1.2)
    return compared.get("it")


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
    parser.add_argument("which", choices=["overhead", "accuracy", "cpu", "pgws-cpu", "floor"])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rates", default="10,50,100,500")
    parser.add_argument("--sources", default="sql", help="cpu, accuracy: sql,memory (interleaved)")
    parser.add_argument("--hz", type=float, default=0, help="accuracy: sampling rate (default 50)")
    parser.add_argument(
        "--workloads", default="", help="accuracy: only those whose name starts so (insert,tpcb)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script")
    args = parser.parse_args()
    if args.smoke:
        args.pairs, args.seconds, args.repeats, args.rates = 2, 3, 1, "50"
    if args.which == "overhead":
        result = overhead(args)
        print(markdown_overhead(result))
    elif args.which == "cpu":
        result = cpu_cost(args)
    elif args.which == "pgws-cpu":
        result = pgws_cpu(args)
    elif args.which == "floor":
        result = floor(args)
    else:
        result = accuracy(args)
        print(markdown_accuracy(result))
    path = write_results(f"activity-{args.which}" + ("-smoke" if args.smoke else ""), result)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
