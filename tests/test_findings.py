"""The diagnosis on short real runs: for each planted bottleneck, the top finding names the
planted cause (the field-case recipes get the same check in tests/test_recipes.py).

The same cases, recorded, are the fixtures of tests/test_diagnose.py: run this file with
PGSCOPE_RECORD_FACTS=1 to write them again (tests/data/facts/<case>.json)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import pytest

from tests.conftest import diagnosis, pgscope, run_doc, top_finding
from tests.plant import cold_page_cache

pytestmark = [pytest.mark.server, pytest.mark.load]

COMMON = """
duration = 3
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
    diag = diagnosis(run_doc(result), case, expected)
    assert top_finding(diag) == expected, json.dumps(diag["findings"][:3], indent=1)[:3000]
    assert not diag["weak_evidence"]
