"""Benchmark (issue 14): an hour's observation of a busy server, analysed and rendered.

One hour of 100 client sessions sampled at 50 Hz is 18 M activity rows. This builds such a
store synthetically (no server: the rows are generated in DuckDB), with pgstats snapshots
each second and at every 10-s window's edges, then measures, each in a fresh process:

    windows:  `windows.close_windows` (the windows' figures, in SQL), seconds, as `observe`
              runs it at the end of the observation;
    analyse:  `load_analysis` + `write_outputs` (summary.json, summary.txt, report.html),
              in a fresh process: seconds and peak resident memory (its ru_maxrss);
    store:    the run store's size on disk.

Targets (issue 14): analysed and rendered in <= 30 s and <= 2 GB, the store <= 300 MB.

Usage:
    .venv/bin/python bench/bench_observe.py [--seconds 3600] [--sessions 100] [--hz 50]
    add --smoke for a quick end-to-end check of the script itself (numbers meaningless).
Results: printed as Markdown, and saved as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))  # tests.stores

from abtest import write_results
from tests.stores import observation_begun

from pgscope.windows import VARIANT, close_windows

WINDOW_S = 10
T0 = 1_790_000_000_000_000  # a fixed epoch in microseconds: the store is the same each time
# The wait events sessions are drawn from, with their weights (a hot-row workload).
WAITS = [
    ("Lock", "transactionid", 45),
    (None, None, 25),
    ("LWLock", "WALWrite", 10),
    ("IO", "WALSync", 8),
    ("Client", "ClientRead", 7),
    ("Lock", "tuple", 5),
]


def build(run_dir: Path, seconds: int, sessions: int, hz: int) -> float:
    """The store; returns how long `close_windows` took on it."""
    store = observation_begun(run_dir, T0, "bench")
    db = store.db
    samples = seconds * hz
    cases = " ".join(
        f"WHEN r < {sum(w for *_, w in WAITS[: i + 1])} THEN {i}" for i in range(len(WAITS))
    )
    types = "[" + ", ".join("NULL" if t is None else f"'{t}'" for t, _, _ in WAITS) + "]"
    events = "[" + ", ".join("NULL" if e is None else f"'{e}'" for _, e, _ in WAITS) + "]"
    db.execute(
        f"""
        INSERT INTO activity_samples
        SELECT {T0} + (s * 1000000 // {hz})::BIGINT, s + 1, 1000 + p, 'client backend',
               CASE WHEN r < 97 THEN 'active' ELSE 'idle' END,
               {types}[k + 1], {events}[k + 1], 7000 + (p % 5), 'app', 'app', 'app', NULL
        FROM (
            SELECT s, p, (hash(s * 1000 + p) % 100)::INTEGER AS r,
                   CASE {cases} ELSE 0 END AS k
            FROM range({samples}) t(s), range({sessions}) u(p)
        )
        """
    )
    db.execute(
        "INSERT INTO activity_queries SELECT 7000 + q, 'update counters set n = n + 1 where "
        "id = ' || q, ? FROM range(5) t(q)",
        [T0],
    )
    db.execute(
        f"INSERT INTO activity_rate SELECT {T0} + s * 1000000, {hz}, {hz}, 0.5, 2, 0.13, 0.4 "
        f"FROM range({seconds}) t(s)"
    )
    # Commits each second (about 2,000/s), and at every window's edges.
    db.execute(
        f"INSERT INTO pgstats_counters SELECT {T0} + s * 1000000, 'pg_stat_database', 'app', "
        f"'xact_commit', s * 2000.0, NULL, NULL FROM range({seconds + 1}) t(s)"
    )
    windows = seconds // WINDOW_S
    for w in range(windows):
        start, end = T0 + w * WINDOW_S * 1_000_000, T0 + (w + 1) * WINDOW_S * 1_000_000
        db.execute(
            "INSERT INTO steps (step_id, variant, clients, repeat, duration_s, started_us, "
            "ended_us, status) VALUES (?, ?, 0, 1, ?, ?, ?, 'ok')",
            [w + 1, VARIANT, WINDOW_S, start, end - 1],
        )
    db.execute(
        f"INSERT INTO pgstats_counters SELECT {T0} + w * {WINDOW_S * 1_000_000} + "
        f"CASE WHEN m = 'start' THEN 1000 ELSE {WINDOW_S * 1_000_000} - 1000 END, "
        f"'pg_stat_database', 'app', 'xact_commit', (w * {WINDOW_S} + CASE WHEN m = 'start' "
        f"THEN 0.001 ELSE {WINDOW_S} - 0.001 END) * 2000.0, w + 1, m "
        f"FROM range({windows}) t(w), (VALUES ('start'), ('end')) v(m)"
    )
    store.collector_stopped("activity", "complete")
    store.collector_stopped("pgstats", "complete")
    began = time.perf_counter()
    close_windows(store)
    closed_s = time.perf_counter() - began
    store.finish_run("complete")
    store.close()
    return closed_s


# The analysis runs in a process of its own: its peak memory is its own.
STEP = r"""
import json, resource, sys, time
from pathlib import Path
run_dir, what, into = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
start = time.perf_counter()
from pgscope.analyze.load import load_analysis
from pgscope.collect import offered
from pgscope.render.outputs import write_outputs
write_outputs(load_analysis(run_dir), offered())
into.write_text(json.dumps({"seconds": time.perf_counter() - start,
                  "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(run_dir: Path, what: str) -> dict[str, float]:
    into = run_dir.parent / f"{what}.json"
    out = subprocess.run(
        [sys.executable, "-c", STEP, str(run_dir), what, str(into)],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"{what} failed: {out.stderr[-2000:]}")
    result: dict[str, float] = json.loads(into.read_text())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=3600)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--hz", type=int, default=50)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.sessions, args.hz = 60, 10, 10
    with tempfile.TemporaryDirectory(prefix="bench-observe-") as tmp:
        run_dir = Path(tmp) / "observe"
        began = time.perf_counter()
        windows_s = build(run_dir, args.seconds, args.sessions, args.hz)
        built_s = time.perf_counter() - began - windows_s
        analysed = measure(run_dir, "analyse")
        size_mb = sum(f.stat().st_size for f in run_dir.rglob("*") if f.is_file()) / 2**20
        store_mb = (run_dir / "run.duckdb").stat().st_size / 2**20
    rows = args.seconds * args.hz * args.sessions
    result: dict[str, Any] = {
        "seconds_observed": args.seconds,
        "sessions": args.sessions,
        "hz": args.hz,
        "activity_rows": rows,
        "build_s": built_s,
        "windows_s": windows_s,
        "analyse_and_render_s": analysed["seconds"],
        "analyse_max_rss_mb": analysed["max_rss_mb"],
        "store_mb": store_mb,
        "run_folder_mb": size_mb,
        "bench_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print("| measure | value | target |\n|---|---|---|")
    print(f"| activity rows | {rows:,} | |")
    print(f"| windows (SQL) | {result['windows_s']:.1f} s | |")
    print(f"| analyse + render | {result['analyse_and_render_s']:.1f} s | <= 30 s |")
    print(f"| its peak memory | {result['analyse_max_rss_mb']:,.0f} MB | <= 2048 MB |")
    print(f"| store on disk | {store_mb:,.0f} MB | <= 300 MB |")
    if not args.smoke:
        write_results("observe", result)


if __name__ == "__main__":
    main()
