"""The diagnosis on short real runs: for each planted bottleneck and each field-case recipe,
the top finding names the planted cause.

The same cases, recorded, are the fixtures of tests/test_diagnose.py: run this file with
PGSCOPE_RECORD_FACTS=1 to write them again (tests/data/facts/<case>.json)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import pgscope

COMMON = """
duration = 4
warmup = 1
repeats = 1
order = "sequential"
[settings]
shared_buffers = "128MB"
[collectors]
activity = {}
pgstats = {}
host = {}
"""

# name -> (spec text, files it needs, the finding that must come first); every case gets
# COMMON's settings, and its CASE_FLAGS after them (they win).
CASE_FLAGS = {
    "datafile-read": ["--set", "shared_buffers=16MB"],  # the table is ~20x that
    "extension-lock-queue": ["--set", "synchronous_commit=off"],  # no commit flush to wait for
}
PLANTED: dict[str, tuple[str, dict[str, str], str]] = {
    # Three client counts: the USL fit (its sigma is evidence for hot rows) needs them.
    "hot-rows": ('workload = "tpcb-like"\nscale = 1\nclients = [2, 4, 8]\n', {}, "hot-row-locks"),
    "advisory-queue": (
        'scripts = ["advisory.sql"]\nscale = 0\nclients = [2, 8]\n',
        {
            "advisory.sql": "BEGIN;\nSELECT pg_advisory_xact_lock(42);\nSELECT pg_sleep(0.002);\n"
            "END;\n"
        },
        "object-lock-queue",
    ),
    "relation-lock-queue": (
        'scripts = ["lock.sql"]\ninit_sql = "schema.sql"\nscale = 0\nclients = [2, 8]\n',
        {
            "lock.sql": "BEGIN;\nLOCK TABLE queue IN EXCLUSIVE MODE;\nSELECT pg_sleep(0.002);\n"
            "END;\n",
            "schema.sql": "create table queue(id int);\n",
        },
        "object-lock-queue",
    ),
    "extension-lock-queue": (  # wide rows into one table: sessions queue to extend it
        'scripts = ["wide.sql"]\ninit_sql = "schema.sql"\nscale = 0\nclients = [2, 8]\n',
        {
            "wide.sql": "insert into wide select g, repeat('x', 1800) "
            "from generate_series(1, 50) g;\n",
            "schema.sql": "create table wide(id int, pad text) with (fillfactor = 10);\n"
            "alter table wide alter pad set storage plain;\n",
        },
        "object-lock-queue",
    ),
    "commit-flush": (
        'scripts = ["insert.sql"]\ninit_sql = "schema.sql"\nscale = 0\nclients = [1, 2]\n',
        {
            "insert.sql": "insert into t(info) values (null);\n",
            "schema.sql": "create table t(id serial primary key, info text);\n",
        },
        "commit-flush",
    ),
    "client-think-time": (
        'scripts = ["think.sql"]\nscale = 0\nclients = [2, 4]\n',
        {"think.sql": "SELECT 1;\n\\sleep 20 ms\n"},
        "client-bound",
    ),
    "datafile-read": (
        'workload = "select-only"\nscale = 20\nclients = [2, 4]\n',
        {},
        "datafile-read",
    ),
    "cpu-saturation": (
        'workload = "select-only"\nscale = 1\nclients = [4, 8]\n',
        {},
        "cpu-saturation",
    ),
}

# Field-case recipes, shrunk with flags to seconds: name -> (flags, expected top finding).
SHRINK = ["--quick", "--duration", "3", "--warmup", "1", "--repeats", "1"]
RECIPES: dict[str, tuple[list[str], str]] = {
    "syncrep": (["--clients", "2", "--collectors", "activity,pgstats,host"], "syncrep-waits"),
    "cpus": (
        ["--clients", "4", "--scale", "1", "--collectors", "activity,pgstats,host"],
        "cpu-saturation",
    ),
}


FACTS = Path(__file__).parent / "data" / "facts"


@contextlib.contextmanager
def cold_page_cache(work_dir: Path, every_s: float = 0.2) -> Iterator[None]:
    """Plant a working set larger than memory: keep evicting the clusters' data files from
    the OS page cache (posix_fadvise DONTNEED), as a host whose RAM is smaller than the data
    would. Without it a 300 MB table sits in this host's 24 GB of page cache and reads never
    wait for the disk, whatever shared_buffers is."""
    done = threading.Event()

    def evict() -> None:
        while not done.wait(every_s):
            for path in work_dir.glob("pgscope-*/data/base/*/*"):
                with contextlib.suppress(OSError):  # files come and go (temp, dropped)
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    finally:
                        os.close(fd)

    thread = threading.Thread(target=evict, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def diagnosis(result_stdout: str, case: str, expected: str) -> dict[str, Any]:
    doc = json.loads(result_stdout)
    assert all(s["status"] == "ok" for s in doc["steps"]), doc["steps"]
    if os.environ.get("PGSCOPE_RECORD_FACTS"):
        FACTS.mkdir(parents=True, exist_ok=True)
        (FACTS / f"{case}.json").write_text(
            json.dumps(
                {
                    "case": case,
                    "expected_top": expected,
                    "recorded_from": doc["command_line"],
                    "sheets": doc["facts"],
                },
                indent=1,
            )
            + "\n"
        )
    return dict(doc["diagnosis"])


def top(diag: dict[str, Any]) -> str:
    assert diag["findings"], diag
    return str(diag["findings"][0]["id"])


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_the_top_finding_names_the_planted_bottleneck(case: str, tmp_path: Path) -> None:
    spec_text, files, expected = PLANTED[case]
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    spec = tmp_path / f"{case}.toml"
    spec.write_text(spec_text + COMMON)
    planted = contextlib.nullcontext()
    if case == "datafile-read":
        if os.geteuid() != 0:
            pytest.skip("evicting the server's files from the page cache needs root")
        # The cluster lands in this session's TMPDIR (conftest), which the server can reach.
        planted = cold_page_cache(Path(tempfile.gettempdir()))
    with planted:
        result = pgscope(
            "run",
            str(spec),
            *CASE_FLAGS.get(case, []),
            "--json",
            "--results-dir",
            str(tmp_path / "r"),
            timeout=600,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    diag = diagnosis(result.stdout, case, expected)
    assert top(diag) == expected, json.dumps(diag["findings"][:3], indent=1)[:3000]
    assert not diag["weak_evidence"]


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_the_top_finding_names_the_field_case(recipe: str, tmp_path: Path) -> None:
    flags, expected = RECIPES[recipe]
    if recipe == "cpus" and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the cpus recipe needs 2 usable CPUs")
    result = pgscope(
        "run", recipe, *SHRINK, *flags, "--json", "--results-dir", str(tmp_path / "r"), timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert top(diagnosis(result.stdout, recipe, expected)) == expected


@pytest.mark.skipif(os.geteuid() != 0, reason="the CPU profile (perf) needs root")
def test_the_logging_recipe_names_statement_logging(tmp_path: Path) -> None:
    result = pgscope(
        "run",
        "logging",
        *SHRINK,
        "--repeats",  # two: the cost against "none" needs a spread to be beyond noise
        "2",
        "--clients",
        "2",
        "--scale",
        "1",
        "--json",
        "--results-dir",
        str(tmp_path / "r"),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    diag = diagnosis(result.stdout, "logging", "statement-logging-volume")
    assert top(diag) == "statement-logging-volume"
    cost = next(f for f in diag["findings"] if f["id"] == "statement-logging")
    assert cost["variant"] is None and cost["confidence"] == "high", cost


def test_the_checkpoint_recipe_names_full_page_images(tmp_path: Path) -> None:
    schema = tmp_path / "small.sql"
    schema.write_text(
        "create table tbl(id int primary key, info text, crt_time timestamp);\n"
        "insert into tbl select g, md5(g::text), now() "
        "from generate_series(1, 300000) g;\n"
    )
    result = pgscope(
        "run",
        "checkpoint",
        "--quick",
        "--clients",
        "2",
        "--duration",
        "14",
        "--warmup",
        "1",
        "--repeats",
        "1",
        "--action",
        "9:CHECKPOINT",
        "--init-sql",
        str(schema),
        "--set",
        "pgscope.define.rows=300000",
        "--collectors",
        "activity,pgstats,host",
        "--json",
        "--results-dir",
        str(tmp_path / "r"),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert top(diagnosis(result.stdout, "checkpoint", "checkpoint-fpi")) == "checkpoint-fpi"
