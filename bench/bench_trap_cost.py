"""What one USDT probe hit costs on this host: the figure behind every usdt program's cost.

The usdt programs' costs scale with the probe hits they take, so the cost of one hit turns an
event rate (which a run records) into a CPU cost. It is measured here rather than assumed:
pgbench select-only with enough clients to keep every CPU of the host busy, off against on
with bpftrace attached to two probes that fire on every LWLock acquisition and release
(`lwlock__acquire`, `lwlock__release`: several per transaction), in interleaved A/B pairs.
With the host saturated, the CPU the hits take is throughput lost, so per pair

    CPU per hit = CPUs x (1 - tps_on / tps_off) / hits per second

Two handlers are timed:
    count:      `@hits = count()`: the trap and the least a handler can do;
    wait-shape: what lwlock.bt and locks.bt do per traced wait: the postmaster predicate and
                a per-thread map write at the first probe, a map lookup and delete at the
                second (plus the count).
The host's busy share during the "off" trials is reported too: the formula holds only when it
is ~100%.

Usage:
    .venv/bin/python bench/bench_trap_cost.py [--pairs 5] [--seconds 10] [--clients 8]
    .venv/bin/python bench/bench_trap_cost.py --smoke     (end to end; numbers mean nothing)
Results: printed as Markdown, and saved as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from abtest import bench_cluster, interleaved_pairs, pgbench_tps, write_results

from pgscope.host import describe_host, usable_cores
from pgscope.target.embedded import EmbeddedCluster
from pgscope.target.pgbin import PgBinaries

HANDLERS = {
    "count": """
usdt:$1:postgresql:lwlock__acquire, usdt:$1:postgresql:lwlock__release
{ @hits = count(); }
""",
    "wait-shape": """
usdt:$1:postgresql:lwlock__acquire
/ pid == $2 || curtask->real_parent->tgid == $2 /
{ @start[tid] = nsecs; @hits = count(); }

usdt:$1:postgresql:lwlock__release
/ @start[tid] /
{ delete(@start[tid]); @hits = count(); }
""",
}
BEGIN = 'BEGIN { printf("ready\\n"); }\n'


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def host_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs so far, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


class Traced:
    """bpftrace with one handler attached file-wide to the server binary, until stopped."""

    def __init__(self, pg: PgBinaries, cluster: EmbeddedCluster, handler: str, work: Path):
        script = work / f"{handler}.bt"
        script.write_text(BEGIN + HANDLERS[handler])
        self.proc = subprocess.Popen(
            [
                "bpftrace",
                "-f",
                "json",
                str(script),
                str(pg.path("postgres")),
                str(cluster.postmaster_pid),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # attached once BEGIN has run
            if '"ready' in line:
                return
        raise RuntimeError(
            f"bpftrace did not start: {self.proc.stderr.read() if self.proc.stderr else ''}"
        )

    def stop(self) -> int:
        """Detach; the hits counted."""
        # Again until it exits: once in ~25 stops here bpftrace sat in epoll_wait for over a
        # minute after one SIGINT (this program prints nothing after BEGIN to wake it).
        for _ in range(60):
            self.proc.send_signal(signal.SIGINT)
            try:
                out, err = self.proc.communicate(timeout=1)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            self.proc.kill()
            raise RuntimeError("bpftrace did not stop on SIGINT within 60 s")
        for line in out.splitlines():
            if not line.startswith("{"):
                continue
            doc = json.loads(line)
            if doc.get("type") == "map" and "@hits" in doc.get("data", {}):
                return int(doc["data"]["@hits"])
        raise RuntimeError(f"bpftrace printed no @hits: {err.strip()[:200]}")


def measure(
    pg: PgBinaries,
    cluster: EmbeddedCluster,
    handler: str,
    pairs: int,
    seconds: int,
    clients: int,
    work: Path,
) -> dict[str, Any]:
    cpus = usable_cores()
    busy_off: list[float] = []

    def trial(on: bool) -> tuple[float, dict[str, Any]]:
        if not on:
            b0, t0 = host_busy()
            tps = pgbench_tps(pg, cluster, ["-b", "select-only"], clients, seconds)
            b1, t1 = host_busy()
            busy_off.append((b1 - b0) / (t1 - t0))
            return tps, {}
        traced = Traced(pg, cluster, handler, work)
        started = time.monotonic()
        try:
            tps = pgbench_tps(pg, cluster, ["-b", "select-only"], clients, seconds)
        finally:
            hits = traced.stop()
        return tps, {"hits_per_s": hits / seconds, "traced_s": time.monotonic() - started}

    results = interleaved_pairs(pairs, trial, say=lambda line: say(f"  {handler}{line}"))
    per_hit_us = [
        cpus * (1 - p.ratio) / p.detail["hits_per_s"] * 1e6
        for p in results
        if p.detail["hits_per_s"]
    ]
    hits_per_xact = [p.detail["hits_per_s"] / p.on_tps for p in results]
    return {
        "handler": handler,
        "pairs": len(results),
        "cpus": cpus,
        "clients": clients,
        "off_tps_median": statistics.median(p.off_tps for p in results),
        "ratio_median": statistics.median(p.ratio for p in results),
        "hits_per_s_median": statistics.median(p.detail["hits_per_s"] for p in results),
        "hits_per_xact_median": statistics.median(hits_per_xact),
        "per_hit_us_median": statistics.median(per_hit_us),
        "per_hit_us_min": min(per_hit_us),
        "per_hit_us_max": max(per_hit_us),
        "host_busy_off_median": statistics.median(busy_off),
        "pairs_detail": [p.__dict__ for p in results],
    }


def markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        "| handler | pairs | off tps (median) | on/off (median) | probe hits/s | hits per "
        "transaction | host CPU per hit, µs (median, range) | host busy, off |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['handler']} | {r['pairs']} | {r['off_tps_median']:,.0f} "
            f"| {r['ratio_median']:.3f} | {r['hits_per_s_median']:,.0f} "
            f"| {r['hits_per_xact_median']:.1f} | {r['per_hit_us_median']:.2f} "
            f"({r['per_hit_us_min']:.2f}–{r['per_hit_us_max']:.2f}) "
            f"| {r['host_busy_off_median']:.0%} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--clients", type=int, default=4 * usable_cores())
    parser.add_argument("--smoke", action="store_true", help="1 pair of 2 s: checks the script")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_trap_cost: needs root (bpftrace)")
    pairs, seconds = (1, 2) if args.smoke else (args.pairs, args.seconds)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-trap-") as tmp, bench_cluster() as (pg, cluster):
        for handler in HANDLERS:
            say(f"{handler}: {pairs} pairs of {seconds} s, {args.clients} clients")
            results.append(measure(pg, cluster, handler, pairs, seconds, args.clients, Path(tmp)))
    table = markdown(results)
    print(table)
    path = write_results(
        "trap-cost" + ("-smoke" if args.smoke else ""),
        {"host": describe_host(), "pairs": pairs, "seconds": seconds, "results": results},
    )
    say(f"results: {path}")


if __name__ == "__main__":
    main()
