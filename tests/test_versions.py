"""PostgreSQL 16, 17 and 18 beside Debian's 15: the planted causes whose evidence comes from
views that changed between versions, a planted checkpoint case on 17 (checkpoint counters in
pg_stat_checkpointer, no USDT probes), the wait events 17 renamed, and what `doctor` says of
a server without probes. test_pgstats.py runs its counters test on all four; tracing and
profiling stay on 15, which has the probes."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

import duckdb
import pytest

from pgscope.analyze.facts.waits import WAIT_GROUPS
from pgscope.analyze.waits import renamed_waits
from pgscope.proc import server_account
from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
from pgscope.target.pgbin import PgBinaries
from tests.cli import pgscope
from tests.evidence import shortfalls
from tests.plant import slow_writes, slow_writes_unavailable
from tests.planted import CASES, EVIDENCE, spec_text
from tests.runs import diagnosis, run_doc
from tests.servers import SMALL_SERVER, pg_of_major

# Each reads the waits (17 renamed IO:WALSync), the counters (17 and 18 moved them) and the
# CPU the same way on every version; 15's run of each is tests/test_findings.py's.
CAUSES = ("hot-rows", "commit-flush", "cpu-saturation")


@pytest.mark.load
@pytest.mark.parametrize("case", CAUSES)
def test_planted_causes_on_each_newer_version(
    case: str, pg_newer: PgBinaries, tmp_path: Path
) -> None:
    expected = CASES[case].expected
    for name, content in CASES[case].files.items():
        (tmp_path / name).write_text(content)
    spec = tmp_path / f"{case}.toml"
    spec.write_text(spec_text(case))
    result = pgscope(
        "run",
        str(spec),
        *("--pg-bin", str(pg_newer.bindir), "--json", "--results-dir", str(tmp_path / "r")),
        timeout=600,
    )
    doc = run_doc(result)
    assert f"PostgreSQL {pg_newer.major_version()}." in doc["target"]["server_version"]
    diagnosis(doc, case, expected)
    # The same evidence as on 15 (a rank is proven on 15's recordings): the flush waits under
    # the rules' name whatever the server calls them (IO:WalSync on 17+), and the counted
    # fsyncs (pg_stat_io on 18) agree, one per commit.
    missing = shortfalls(doc, EVIDENCE[case])
    assert not missing, "\n".join(missing)
    # pg_stat_statements' read time, under its 17 name (shared_blk_read_time) or its older
    # one; the 16 wheel has no pg_stat_statements.
    if case == "commit-flush" and pg_newer.major_version() >= 17:
        db = duckdb.connect(str(Path(doc["run_dir"]) / "run.duckdb"), read_only=True)
        try:
            row = db.execute("SELECT count(read_ms), count(*) FROM statement_readings").fetchone()
        finally:
            db.close()
        assert row is not None and row[0] == row[1] > 0, row


CHECKPOINT_ROWS = 150_000  # as tests/test_recipes.py: ~1,800 pages, one full-page image each
SLOW_DISK = 16 * 2**20  # bytes/s
CHECKPOINT_SPEC = f"""
scale = 0
init_sql = "small.sql"
scripts = ["update.sql"]
protocol = "prepared"
clients = [2]
duration = 33
warmup = 3
repeats = 1
[settings]
shared_buffers = "128MB"
checkpoint_timeout = "30s"
checkpoint_completion_target = 0.9
max_wal_size = "16GB"
"pgscope.define.rows" = {CHECKPOINT_ROWS}
[variants]
fpw-on = {{full_page_writes = "on"}}
fpw-off = {{full_page_writes = "off"}}
[collectors]
activity = {{}}
pgstats = {{}}
host = {{}}
"""


@pytest.mark.load
def test_a_planted_checkpoint_case_on_17_is_found_from_its_counters(tmp_path: Path) -> None:
    """The checkpoint recipe's design, shrunk as tests/test_recipes.py does on 15, on 17: no
    probes trace the checkpoint, and 17 counts checkpoints in pg_stat_checkpointer, not
    pg_stat_bgwriter. The timed checkpoint 30 s into each step must be counted, and the
    full-page-image finding must show that count. The control is the same load with
    full_page_writes = off: there the rule stays silent (commits that wait for the
    throttled disk are both variants' finding, so not the specific one)."""
    pg17 = pg_of_major(17)
    work = Path(tempfile.gettempdir())
    why_not = slow_writes_unavailable(work)
    if why_not:
        pytest.skip(f"no slow disk to plant: {why_not}")
    (tmp_path / "small.sql").write_text(
        "create table tbl(id int primary key, info text, crt_time timestamp);\n"
        "insert into tbl select g, md5(g::text), now() "
        f"from generate_series(1, {CHECKPOINT_ROWS}) g;\n"
    )
    (tmp_path / "update.sql").write_text(
        "\\set id random(1, :rows)\nupdate tbl set info = now(), crt_time = now() where id = :id;\n"
    )
    spec = tmp_path / "checkpoint.toml"
    spec.write_text(CHECKPOINT_SPEC)
    with slow_writes(work, SLOW_DISK):
        result = pgscope(
            "run",
            str(spec),
            *("--pg-bin", str(pg17.bindir), "--json", "--results-dir", str(tmp_path / "r")),
            timeout=600,
        )
    doc = run_doc(result)
    steps = {c["variant"]: c for c in doc["counters"]}
    assert set(steps) == {"fpw-on", "fpw-off"}, doc["counters"]
    for step in steps.values():
        assert step["checkpoints"] == 1, "the timed checkpoint, counted by pg_stat_checkpointer"
        assert step["checkpoint_buffers"] > 0, step
    diag = diagnosis(doc, "checkpoint-pg17", "checkpoint-fpi")
    top = next((f for f in diag["findings"] if f["id"] == "checkpoint-fpi"), None)
    assert top is not None and top["variant"] == "fpw-on", json.dumps(diag["findings"])[:2000]
    evidence = {e["name"]: e for e in top["evidence"]}
    assert evidence["checkpoint.count"]["source"] == "pgstats", evidence["checkpoint.count"]
    assert evidence["checkpoint.count"]["value"] == 1
    assert evidence["dip.fpi_wal_share"]["value"] >= 0.5, evidence
    assert not [
        f for f in diag["findings"] if f["id"] == "checkpoint-fpi" and f["variant"] == "fpw-off"
    ]


def test_the_wait_names_map_from_what_each_version_calls_them() -> None:
    """Every renamed wait event's old name is in 16's server binary, and those the rules use
    in 15's too (neither has pg_wait_events to ask; DSMAllocate is new in 16): the rules'
    names are the servers' own."""
    renamed = renamed_waits()
    assert renamed["IO"]["WalSync"] == "WALSync"
    used = {name.split(":", 1)[1] for group in WAIT_GROUPS.values() for name in group}
    olds = {old for names in renamed.values() for old in names.values()}
    assert {"WALSync", "WALWrite", "WALInitSync", "WALInitWrite"} <= used & olds
    for major, wanted in ((15, used & olds), (16, olds)):
        with contextlib.suppress(pytest.skip.Exception):
            binary = pg_of_major(major).path("postgres").read_bytes()
            missing = sorted(old for old in wanted if old.encode() not in binary)
            assert not missing, f"PostgreSQL {major} has none of {missing}"


@pytest.mark.server
@pytest.mark.parametrize("major", (17, 18))
def test_the_renamed_wait_events_are_the_servers_names(major: int, tmp_path: Path) -> None:
    """17 and 18 list their wait events (pg_wait_events): each new name in the map is there,
    under its type, and its old name is not."""
    pg = pg_of_major(major)
    with (
        EmbeddedCluster(
            pg,
            server_account(None),
            tmp_path / "server.log",
            {**benchmark_defaults(4), **SMALL_SERVER},
        ) as cluster,
        cluster.connect() as session,
    ):
        events = set(session.execute("SELECT type, name FROM pg_wait_events").fetchall())
    for kind, names in renamed_waits().items():
        for new, old in names.items():
            assert (kind, new) in events, f"PostgreSQL {major} has no {kind}:{new}"
            assert (kind, old) not in events, f"PostgreSQL {major} still has {kind}:{old}"


def test_doctor_says_what_works_on_17_without_probes() -> None:
    pg17 = pg_of_major(17)
    result = pgscope("doctor", "--json", "--pg-bin", str(pg17.bindir))
    assert result.returncode == 0, result.stderr
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["version"]["ok"] and "PostgreSQL 17" in checks["version"]["detail"]
    assert "pg_stat_checkpointer" in checks["checkpoint counters"]["detail"]
    assert "pg_stat_io" in checks["backend writes"]["detail"]
    assert "IO:WalSync" in checks["wait event names"]["detail"]
    assert checks["pg_stat_statements"]["ok"], checks["pg_stat_statements"]
    probes = checks["usdt probes"]
    assert not probes["ok"] and "0 USDT probes" in probes["detail"]
    assert "--enable-dtrace" in probes["fix"] and "checkpoints counted" in probes["needed_for"]
    assert not checks["collector usdt"]["ok"]
    assert "without --enable-dtrace" in checks["collector usdt"]["detail"]
    assert checks["collector pgstats"]["ok"] and checks["collector activity"]["ok"]


def test_doctor_names_what_16_lacks() -> None:
    """The 16 wheel ships no contrib: doctor says which findings that costs."""
    pg16 = pg_of_major(16)
    result = pgscope("doctor", "--json", "--pg-bin", str(pg16.bindir))
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    statements = checks["pg_stat_statements"]
    assert not statements["ok"] and "seq-scan" in statements["detail"], statements
    assert checks["checkpoint counters"]["detail"] == "pg_stat_bgwriter"
