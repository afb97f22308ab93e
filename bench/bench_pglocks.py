"""What one reading of the pglocks collector costs, against how many locks are held.

N sessions each hold the locks of one prepared lookup on a table of 128 hash partitions,
planned generically (PostgreSQL 15 locks all 129 relations of the plan and the one index it
scans: 130 each), inside an open transaction; then the collector's query (`HELD_SQL`, on a
session set up as the collector sets it up) runs `--readings` times. Reported per reading:
the round trip, the server CPU of the reading's backend (/proc/PID/stat), and, for scale, the
time of `SELECT count(*) FROM pg_locks` alone (the part that holds the lock manager's
partition locks while it copies them). Idle sessions: no load beyond the readings, so host
noise barely moves it.

    .venv/bin/python bench/bench_pglocks.py [--holders 0,8,32] [--readings 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from abtest import bench_cluster, write_results

from pgscope.collect.statistics.pglocks import APPLICATION, HELD_SQL

PARTITIONS = 128
SCHEMA = [
    "CREATE TABLE orders(id int, pad text) PARTITION BY HASH (id)",
    *(
        f"CREATE TABLE orders_{i} PARTITION OF orders "
        f"FOR VALUES WITH (MODULUS {PARTITIONS}, REMAINDER {i})"
        for i in range(PARTITIONS)
    ),
    "CREATE INDEX ON orders(id)",
    f"INSERT INTO orders SELECT g, md5(g::text) FROM generate_series(1, {PARTITIONS * 100}) g",
    "ANALYZE orders",
]


def backend_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(cluster: Any, holders: int, readings: int) -> dict[str, Any]:
    sessions = []
    try:
        for _ in range(holders):
            session = cluster.conn.connect(application_name="pgbench")
            session.execute("SET plan_cache_mode = force_generic_plan")
            session.execute("PREPARE q(int) AS SELECT pad FROM orders WHERE id = $1")
            session.execute("EXECUTE q(1)")  # plans it: the planner locks every index too
            session.execute("BEGIN")
            session.execute("EXECUTE q(1)")
            sessions.append(session)
        with cluster.conn.connect(application_name=APPLICATION) as reader:
            reader.execute("SET enable_nestloop = off")  # as the collector's session
            rows = reader.execute(HELD_SQL, prepare=True).fetchall()
            pid = int(reader.info.backend_pid)
            cpu_before, started = backend_cpu_s(pid), time.perf_counter()
            for _ in range(readings):
                reader.execute(HELD_SQL, prepare=True).fetchall()
            round_trip_ms = (time.perf_counter() - started) / readings * 1000
            cpu_ms = (backend_cpu_s(pid) - cpu_before) / readings * 1000
            copies = []
            for _ in range(readings):
                began = time.perf_counter()
                reader.execute("SELECT count(*) FROM pg_locks").fetchall()
                copies.append((time.perf_counter() - began) * 1000)
    finally:
        for session in sessions:
            session.close()
    locks = sum(int(r[4]) + int(r[5]) for r in rows)
    print(
        f"{holders} sessions, {locks} relation locks: {round_trip_ms:.2f} ms round trip, "
        f"{cpu_ms:.2f} ms server CPU a reading; pg_locks alone {statistics.median(copies):.2f} ms"
    )
    return {
        "holders": holders,
        "locks": locks,
        "round_trip_ms": round_trip_ms,
        "server_cpu_ms": cpu_ms,
        "pg_locks_alone_ms_median": statistics.median(copies),
        "share_of_one_core_at_1hz": cpu_ms / 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--holders", default="0,8,32")
    parser.add_argument("--readings", type=int, default=300)
    args = parser.parse_args()
    counts = [int(h) for h in args.holders.split(",")]
    with bench_cluster(scale=0, max_clients=max(counts) + 4) as (_, cluster):
        with cluster.connect() as session:
            for statement in SCHEMA:
                session.execute(statement)
        result = {
            "readings": args.readings,
            "runs": [measure(cluster, h, args.readings) for h in counts],
        }
    print(f"saved {write_results('pglocks-cost', result)}")


if __name__ == "__main__":
    main()
