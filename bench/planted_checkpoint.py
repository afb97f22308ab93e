"""The checkpoint recipe on a disk throttled to a given write rate (field case 3's condition:
a WAL device that the full-page images after a checkpoint saturate).

This VM's disk absorbs ~100 MB/s of full-page images with a ~10% dip; the field case's did
not. The throttle (a cgroup v1 blkio group holding the cluster's processes, tests/plant.py)
plants that one difference, so the recipe's effect can be seen at the size it had there.

Usage (root):
    .venv/bin/python bench/planted_checkpoint.py [--mb-per-s 16] [--results-dir DIR] \
        [-- RECIPE FLAGS]
Prints the run's JSON document (as `pgscope run --json` does).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))

from tests.plant import slow_writes, slow_writes_unavailable


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb-per-s", type=float, default=16)
    parser.add_argument("--results-dir", default="bench/results/runs")
    parser.add_argument("flags", nargs="*", help="more `pgscope run checkpoint` flags")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="planted-"))
    os.chmod(work, 0o755)  # the server's unprivileged account must reach its cluster
    why_not = slow_writes_unavailable(work)
    if why_not:
        print(f"planted_checkpoint: {why_not}", file=sys.stderr)
        return 2
    argv = [
        *(sys.executable, "-m", "pgscope", "run", "checkpoint", "--json"),
        *("--work-dir", str(work), "--results-dir", args.results_dir, *args.flags),
    ]
    try:
        with slow_writes(work, int(args.mb_per_s * 2**20)):
            return subprocess.run(argv, check=False).returncode
    finally:
        work.rmdir()


if __name__ == "__main__":
    sys.exit(main())
