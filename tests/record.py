"""Record the planted cases: `python -m tests.record [CASE ...]` runs each case of
tests/planted.py live, as tests/test_findings.py does, and keeps its run's store
(gzip-compressed: a few tens of kB) in tests/data/runs/<case>/, with what was expected of it,
and its fact sheets in tests/data/facts/<case>.json. The fast tests replay them
(tests/test_recorded.py, tests/test_diagnose.py): loading, facts, diagnosis, the account,
the JSON document and the report, without a server.

Run it on a quiet host (every finding reads the host's CPU), as root for the cases that plant
a host condition, after a change to what is collected: a store keeps what the collectors of
its time wrote, and a newer pgscope reads it as declared (pgscope.tables)."""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.evidence import shortfalls
from tests.plant import busy_neighbours, cold_page_cache, slow_writes, slow_writes_unavailable
from tests.planted import CASES, EVIDENCE, SLOW_WAL_DEVICE, spec_text
from tests.runs import write_facts

RUNS = Path(__file__).parent / "data" / "runs"


def _planted(name: str, work: Path) -> contextlib.AbstractContextManager[Any]:
    plant = CASES[name].plant
    if plant == "cold-cache":
        return cold_page_cache(work)
    if plant == "busy-neighbours":
        return busy_neighbours(4)
    if plant == "slow-writes":
        why_not = slow_writes_unavailable(work)
        if why_not:
            raise SystemExit(f"record: cannot plant a slow WAL device for {name}: {why_not}")
        return slow_writes(work, SLOW_WAL_DEVICE, starters=[os.getpid()])
    return contextlib.nullcontext()


def record(name: str) -> Path:
    case = CASES[name]
    with tempfile.TemporaryDirectory(prefix="pgscope-record-") as tmp:
        folder = Path(tmp)
        folder.chmod(0o755)  # the server's account reaches the cluster under it
        for file, content in case.files.items():
            (folder / file).write_text(content)
        spec = folder / f"{name}.toml"
        spec.write_text(spec_text(name))
        command = [
            sys.executable,
            "-m",
            "pgscope",
            "run",
            str(spec),
            *case.flags,
            "--json",
            "--results-dir",
            str(folder / "r"),
        ]
        with _planted(name, Path(tempfile.gettempdir())):
            done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise SystemExit(f"record: {name} failed: {done.stderr[-2000:]}")
        document = json.loads(done.stdout)
        # A run whose cause did not take (a host too busy to queue, a plant that failed)
        # would make a recording that proves nothing: keep none.
        missing = shortfalls(document, EVIDENCE[name])
        if missing:
            raise SystemExit(f"record: {name} does not show its cause: {'; '.join(missing)}")
        run_dir = Path(document["run_dir"])
        target = RUNS / name
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        with (
            (run_dir / "run.duckdb").open("rb") as src,
            gzip.open(target / "run.duckdb.gz", "wb", compresslevel=9) as dst,
        ):
            shutil.copyfileobj(src, dst)
        write_facts(document, name, case.expected)
        top = document["findings"][0]["id"] if document["findings"] else None
        (target / "case.json").write_text(
            json.dumps(
                {
                    "case": name,
                    "expected": case.expected,
                    "found_first": top,
                    "recorded_from": document["command_line"],
                    "server": document["target"]["server_version"],
                },
                indent=1,
            )
            + "\n"
        )
        return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help="cases to record (default: all)")
    names = parser.parse_args().cases or sorted(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"record: no such case: {', '.join(unknown)}")
    for name in names:
        target = record(name)
        said = json.loads((target / "case.json").read_text())
        mark = "ok" if said["found_first"] == said["expected"] else "DIFFERS"
        print(f"{name}: {said['found_first']} ({mark}), {target}", flush=True)


if __name__ == "__main__":
    main()
