"""Benchmark (issue 32): a central repository's two costs a fleet pays every day.

    push:   `pgscope push` of an hour's observation of 100 sessions sampled at 50 Hz (18 M
            activity rows; the store built as bench_observe.py builds it, its summary.json
            written as `observe` leaves it), in a fresh process, wall time, into a repository
            on this host (an embedded PostgreSQL started here). Target: <= 60 s.
    runs:   `pgscope runs --from` over 1,000 stored runs, in a fresh process, wall time (the
            interpreter's start included), median of 5: every run (--limit 0 --json), the
            default page (text), and one server's last 30 days. Target: <= 1 s. Beside them,
            `pgscope --version` (what any command pays to start: Python and the CLI's
            imports), and the listing's query alone, in this process.

The 1,000 runs: a few small runs pushed for real, then copied in SQL (as the repository's
owner) to 1,000, over 20 servers and 90 days: what `runs --from` reads is the runs and servers
tables, which this fills as pushes would.

Usage:
    .venv/bin/python bench/bench_repository.py [--seconds 3600] [--sessions 100] [--hz 50]
        [--runs 1000]
    add --smoke for a quick end-to-end check of the script itself (numbers meaningless).
Results: printed as Markdown, and saved as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))  # tests.stores

from abtest import write_results
from bench_observe import build
from tests.stores import measured_run

from pgscope.proc import server_account
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import find_binaries

# A repository as a DBA would set one up for bulk loads: room for the COPY between
# checkpoints, and buffers for the indexes being built.
REPOSITORY_SETTINGS = {
    "shared_buffers": "1GB",
    "max_wal_size": "16GB",
    "checkpoint_timeout": "30min",
    "wal_compression": "on",
}


def pgscope(*args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pgscope", *args], capture_output=True, text=True, env=os.environ
    )
    spent = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"pgscope {' '.join(args[:2])} failed: {done.stderr[-2000:]}")
    return spent, done


def analysed(run_dir: Path) -> None:
    """summary.json and the report, as `observe` writes them at its end (not timed)."""
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from pgscope.analyze.load import "
            "load_analysis; from pgscope.collect import offered; from pgscope.render.outputs "
            "import write_outputs; write_outputs(load_analysis(Path(sys.argv[1])), offered())",
            str(run_dir),
        ],
        check=True,
    )


def fill(dsn: str, tmp: Path, runs: int) -> int:
    """`runs` runs in the repository: five pushed, the rest copies of them."""
    import psycopg

    for n in range(5):
        run_dir = measured_run(
            tmp / "small" / f"20260101-00000{n}-scaling-{n:04x}",
            [(c, 1000.0 * c) for c in (1, 2, 4, 8, 16)],
        )
        pgscope("push", str(run_dir), "--to", dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgscope.servers (server_id, system_identifier, host, port) "
            "SELECT 1000 + s, 7000000000000000000 + s, 'db' || s, 5432 "
            "FROM generate_series(1, 20) s ON CONFLICT DO NOTHING"
        )
        conn.execute(
            f"""
            INSERT INTO pgscope.runs (server_id, run_key, run_id, state, name, recipe, status,
                started_us, started_at, target, workload, scale, clients, best_tps, steps,
                steps_ok, server_version, verdict, finding_ids, run_dir, store_version,
                pushed_by, watermarks, pushed_at)
            SELECT 1000 + (n % 20) + 1, nextval('pgscope.run_keys'),
                   to_char(t, 'YYYYMMDD-HH24MISS') || '-scaling-' || lpad(to_hex(n), 4, '0'),
                   'complete', r.name, r.recipe, r.status,
                   (extract(epoch FROM t) * 1e6)::bigint, t, r.target, r.workload, r.scale,
                   r.clients, r.best_tps * (1 + (n % 7) / 10.0), r.steps, r.steps_ok,
                   r.server_version, r.verdict, r.finding_ids, r.run_dir, r.store_version,
                   r.pushed_by, r.watermarks, now()
            FROM generate_series(1, {runs - 5}) n,
                 LATERAL (SELECT now() - n * interval '90 days' / {runs}) AS w(t),
                 LATERAL (SELECT * FROM pgscope.runs ORDER BY run_key LIMIT 1) AS r
            """
        )
        conn.execute("ANALYZE pgscope.runs")
        conn.execute("ANALYZE pgscope.servers")
        row = conn.execute("SELECT count(*) FROM pgscope.runs").fetchone()
    return int(row[0]) if row else 0


def median_of(repeats: int, *args: str) -> float:
    return statistics.median(pgscope(*args)[0] for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=3600)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--hz", type=int, default=50)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.sessions, args.hz, args.runs = 60, 10, 10, 50
    pg = find_binaries()
    with tempfile.TemporaryDirectory(prefix="bench-repository-") as name:
        tmp = Path(name)
        os.chmod(tmp, 0o755)  # the server's account reaches its cluster's folder
        run_dir = tmp / "20260101-000000-observe-0001"
        build(run_dir, args.seconds, args.sessions, args.hz)
        analysed(run_dir)
        settings = {**benchmark_defaults(8), **REPOSITORY_SETTINGS}
        with EmbeddedCluster(pg, server_account(None), tmp / "repository.log", settings) as repo:
            dsn = repo.conn.conninfo()
            pgscope("repository", "init", "--to", dsn)
            push_s, pushed = pgscope("push", str(run_dir), "--to", dsn, "--json")
            rows = json.loads(pushed.stdout)[0]["rows"]
            stored = fill(dsn, tmp, args.runs)
            every = median_of(5, "runs", "--from", dsn, "--limit", "0", "--json")
            _, listed = pgscope("runs", "--from", dsn, "--limit", "0", "--json")
            assert len(json.loads(listed.stdout)) == stored, "every run listed"
            page = median_of(5, "runs", "--from", dsn)
            one = median_of(5, "runs", "--from", dsn, "--server", "db7", "--since", "30d")
            start_up = median_of(5, "--version")
            query_s = query_alone(dsn)
            with repo.connect() as conn:
                size = conn.execute(
                    "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = 'pgscope' AND c.relkind IN ('r', 'p', 'i', 't')"
                ).fetchone()
    activity = args.seconds * args.hz * args.sessions
    result: dict[str, Any] = {
        "seconds_observed": args.seconds,
        "sessions": args.sessions,
        "hz": args.hz,
        "activity_rows": activity,
        "rows_pushed": rows,
        "push_s": push_s,
        "push_rows_per_s": rows / push_s,
        "repository_mb": (int(size[0]) if size and size[0] else 0) / 2**20,
        "runs_stored": stored,
        "runs_all_json_s": every,
        "runs_page_text_s": page,
        "runs_one_server_30d_s": one,
        "runs_query_alone_s": query_s,
        "cli_start_up_s": start_up,
        "repository_settings": REPOSITORY_SETTINGS,
    }
    print("| measure | value | target |\n|---|---|---|")
    print(f"| activity rows | {activity:,} | |")
    print(f"| push (fresh process, {rows:,} rows) | {push_s:.1f} s | <= 60 s |")
    print(f"| push rate | {rows / push_s:,.0f} rows/s | |")
    print(f"| repository size | {result['repository_mb']:,.0f} MB | |")
    print(f"| runs --from, all {stored:,} (--json) | {every:.2f} s | <= 1 s |")
    print(f"| runs --from, default page (text) | {page:.2f} s | <= 1 s |")
    print(f"| runs --from --server --since 30d | {one:.2f} s | <= 1 s |")
    print(f"| `pgscope --version` (any command's start) | {start_up:.2f} s | |")
    print(f"| the listing's query alone | {query_s * 1000:.0f} ms | |")
    if not args.smoke:
        write_results("repository", result)


def query_alone(dsn: str) -> float:
    from pgscope.repository.connection import connect
    from pgscope.repository.listing import Filters, list_runs
    from pgscope.target.conn import ConnParams

    session, _ = connect(ConnParams.from_dsn(dsn), writing=False)
    try:
        times = []
        for _ in range(5):
            began = time.perf_counter()
            list_runs(session, Filters())
            times.append(time.perf_counter() - began)
    finally:
        session.close()
    return statistics.median(times)


if __name__ == "__main__":
    main()
