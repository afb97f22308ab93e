"""Benchmark (issue 38): a run folder analysed again and rendered, as `pgscope report DIR
--format html` does it, each time in a fresh process (imports included: what a user waits).

    report:   wall seconds of `pgscope report DIR --format html`, --repeats times;
    phases:   in one process, after its imports: load_analysis, the JSON document, the HTML.

The folder is a copy of --run (a 3-minute sweep's: `pgscope run scaling --quick`, 18 steps),
or, without --run, a recorded planted case's store from tests/data/runs (--case). Targets
(issue 38): a 3-minute sweep's folder re-rendered in <= 2 s, a recorded case in <= 1 s.

Usage:
    .venv/bin/python bench/bench_report.py --run results/<run-id> [--repeats 5]
    .venv/bin/python bench/bench_report.py --case partition-locks
With bench/ab_commits.sh BASE ROUNDS -- bench/bench_report.py ..., an interleaved A/B.
Results: printed as Markdown, and saved as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from abtest import write_results

ROOT = Path(__file__).parent.parent
PHASES = """
import json, sys, time
from pathlib import Path
from pgscope.analyze.load import load_analysis
from pgscope.render.html import report_html
from pgscope.render.json_doc import run_document
t0 = time.perf_counter(); a = load_analysis(Path(sys.argv[1])); t1 = time.perf_counter()
json.dumps(run_document(a), default=str); t2 = time.perf_counter()
report_html(a); t3 = time.perf_counter()
print(json.dumps({"load_analysis": t1 - t0, "document": t2 - t1, "html": t3 - t2}))
"""


def _folder(args: argparse.Namespace, work: Path) -> Path:
    folder = work / "20260101-000000-bench-0000"
    if args.run:
        folder.mkdir()
        shutil.copy2(Path(args.run) / "run.duckdb", folder / "run.duckdb")
        return folder
    folder.mkdir()
    source = ROOT / "tests" / "data" / "runs" / args.case / "run.duckdb.gz"
    with gzip.open(source, "rb") as src, (folder / "run.duckdb").open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", help="a run folder to copy (its run.duckdb)")
    parser.add_argument("--case", default="partition-locks", help="a recorded planted case")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="pgscope-bench-report-") as tmp:
        folder = _folder(args, Path(tmp))
        walls = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            subprocess.run(
                [python, "-m", "pgscope", "report", str(folder), "--format", "html"],
                check=True,
                capture_output=True,
            )
            walls.append(time.perf_counter() - start)
        done = subprocess.run(
            [python, "-c", PHASES, str(folder)], check=True, capture_output=True, text=True
        )
        phases = json.loads(done.stdout)
    what = args.run or f"recorded case {args.case}"
    print(
        f"| report --format html ({what}) | median {statistics.median(walls):.2f} s |"
        f" min {min(walls):.2f} s | max {max(walls):.2f} s | n={len(walls)} |"
    )
    print("| phase | seconds |\n|---|---|")
    for name, seconds in phases.items():
        print(f"| {name} | {seconds:.2f} |")
    write_results("report", {"what": what, "walls_s": walls, "phases_s": phases})


if __name__ == "__main__":
    main()
