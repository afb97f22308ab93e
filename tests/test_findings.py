"""The diagnosis on short real runs: for each planted bottleneck, the top finding names the
planted cause (the field-case recipes get the same check in tests/test_recipes.py).

The same cases, recorded, are the fixtures of tests/test_diagnose.py: run this file with
PGSCOPE_RECORD_FACTS=1 to write them again (tests/data/facts/<case>.json)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import cli_processes, diagnosis, pgscope, run_doc, top_finding
from tests.plant import busy_neighbours, cold_page_cache, slow_writes, slow_writes_unavailable

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
statements = {}
pglocks = {}
waldevice = {}
"""

# name -> (spec text, files it needs, the finding that must come first); every case gets
# COMMON's settings, and its CASE_FLAGS after them (they win).
CASE_FLAGS = {
    "datafile-read": ["--set", "shared_buffers=16MB"],  # the table is ~20x that
    "small-shared-buffers": ["--set", "shared_buffers=16MB"],  # ~300 MB, in the OS cache
    "extension-lock-queue": ["--set", "synchronous_commit=off"],  # no commit flush to wait for
    "connection-overhead": ["--connect"],  # pgbench -C: a new connection per transaction
    # The CPU profile shows the lock manager's CPU beside its waits (40-45% of the samples).
    "partition-locks": ["--collectors", "activity,pgstats,host,statements,pglocks,perf"],
}
ONE = {"one.sql": "SELECT 1;\n"}
SLOW_WAL_DEVICE = 16 * 2**20  # bytes/s
PARTITIONS = 128
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
    # Beyond the named field cases: the work itself (statements, tables).
    # Every client bumps one counter row: they queue for its lock, and its old versions pile
    # up dead (autovacuum cannot keep up within seconds). The dead rows are the queue's
    # by-product; the queue is the cause.
    "hot-counter": (
        'scripts = ["bump.sql"]\ninit_sql = "schema.sql"\nscale = 0\nclients = [2, 8]\n',
        {
            "bump.sql": "begin;\nupdate counters set n = n + 1 where id = 1;\n"
            "select pg_sleep(0.001);\ncommit;\n",
            "schema.sql": "create table counters(id int primary key, n bigint);\n"
            "insert into counters values (1, 0), (2, 0);\n",
        },
        "hot-row-locks",
    ),
    "missing-index": (
        'scripts = ["lookup.sql"]\ninit_sql = "schema.sql"\nscale = 0\nclients = [4]\n',
        {
            "lookup.sql": "\\set k random(1, 100000)\nselect id, pad from items where val = :k;\n",
            "schema.sql": "create table items(id int primary key, val int, pad text);\n"
            "insert into items select g, g, md5(g::text) from generate_series(1, 100000) g;\n",
        },
        "seq-scan",
    ),
    "sort-spill": (
        'scripts = ["sort.sql"]\nscale = 0\nclients = [4]\n',
        {
            "sort.sql": "select * from (select g, md5(g::text) m from generate_series(1, 150000) g "
            "order by m) s offset 149999;\n"
        },
        "temp-spill",
    ),
    "dead-rows": (  # a large delete, and no vacuum after it
        'scripts = ["count.sql"]\ninit_sql = "schema.sql"\nscale = 0\nclients = [4]\n',
        {
            "count.sql": "select count(*) from events where kind = 1;\n",
            "schema.sql": "create table events(id int primary key, kind int, pad text) "
            "with (autovacuum_enabled = off);\n"
            "insert into events select g, g % 10, md5(g::text) from generate_series(1, 200000) g;\n"
            "delete from events where id > 10000;\n",
        },
        "dead-rows",
    ),
    "many-indexes": (
        'scripts = ["insert.sql"]\ninit_sql = "schema.sql"\nscale = 0\nclients = [4]\n',
        {
            "insert.sql": "insert into orders(a, b, c, d, e, f, g) "
            "select r, r, r, r, r, r, r from (select (random() * 1e6)::int r) s;\n",
            "schema.sql": "create table orders(id bigserial primary key, "
            "a int, b int, c int, d int, e int, f int, g int);\n"
            + "".join(f"create index on orders({c});\n" for c in "abcdefg"),
        },
        "index-write-amplification",
    ),
    "large-results": (
        'scripts = ["big.sql"]\nscale = 0\nclients = [4]\n',
        {"big.sql": "select g, repeat('x', 200) from generate_series(1, 20000) g;\n"},
        "large-results",
    ),
    # Rows of ~0.5 kB in 2,000-row transactions (1.3 MB of WAL each) on a disk that takes
    # 16 MB/s from the server (plant.slow_writes): the WAL's bytes, not its flushes, are the
    # limit. Unthrottled, this VM's disk takes ~300 MB/s and the same load is CPU- and
    # extension-lock-bound (test_bulk_writes_on_a_fast_disk_are_not_wal_volume).
    "wal-volume": (
        'scripts = ["bulk.sql"]\ninit_sql = "schema.sql"\nscale = 0\nclients = [2, 4]\n',
        {
            "bulk.sql": "insert into events(payload) "
            "select repeat(md5(random()::text), 16) from generate_series(1, 2000);\n",
            "schema.sql": "create table events(id bigserial primary key, "
            "at timestamptz default now(), payload text);\n",
        },
        "wal-volume",
    ),
    "small-shared-buffers": (
        'workload = "select-only"\nscale = 20\nclients = [4]\n',
        {},
        "shared-buffers-small",
    ),
    "busy-neighbours": (
        'workload = "select-only"\nscale = 1\nclients = [2]\n',
        {},
        "cpu-other-processes",
    ),
    # The trivial transaction, reconnecting for each one (CASE_FLAGS): the connection is the
    # work; test_connecting_once_is_no_connection_overhead is the same load connected once.
    "connection-overhead": (
        'scripts = ["one.sql"]\nscale = 0\nclients = [4]\n',
        ONE,
        "connection-overhead",
    ),
    # A lookup by the partition key, prepared: its generic plan prunes at run time, but
    # PostgreSQL 15 locks every partition of it first (129 relations, and the one index it
    # scans); a custom plan prunes while planning (3). The custom variant is the control: the
    # same table and query, pruned, where the rule must stay silent.
    "partition-locks": (
        'scripts = ["lookup.sql"]\ninit_sql = "schema.sql"\nscale = 0\nclients = [2, 4, 8]\n'
        'variants = {generic = {plan_cache_mode = "force_generic_plan"}, '
        'custom = {plan_cache_mode = "force_custom_plan"}}\n',
        {
            "lookup.sql": f"\\set k random(1, {PARTITIONS * 1000})\n"
            "select pad from orders where id = :k;\n",
            "schema.sql": "create table orders(id int, customer int, pad text) "
            "partition by hash (id);\n"
            "select format('create table orders_%s partition of orders "
            f"for values with (modulus {PARTITIONS}, remainder %s)', i, i) "
            f"from generate_series(0, {PARTITIONS - 1}) i \\gexec\n"
            "create index on orders(id);\n"
            "insert into orders select g, g % 1000, md5(g::text) "
            f"from generate_series(1, {PARTITIONS * 1000}) g;\n"
            "analyze orders;\n",
        },
        "lock-manager",
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
    if case == "busy-neighbours":
        planted = busy_neighbours(4)  # twice the host's cores: the server gets a part
    if case == "wal-volume":
        work = Path(tempfile.gettempdir())  # the clusters' disk (conftest)
        why_not = slow_writes_unavailable(work)
        if why_not:
            pytest.skip(f"cannot plant a slow WAL device: {why_not}")
        # From the first moment: the WAL device's probe runs right after the cluster starts.
        planted = slow_writes(work, SLOW_WAL_DEVICE, starters=cli_processes())
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
    doc = run_doc(result)
    diag = diagnosis(doc, case, expected)
    peaks = [s["facts"] for s in doc["facts"] if s["variant"] and s["peak"]]
    shown = {n: f["value"] for p in peaks for n, f in p.items() if n.startswith(("wal.", "wait."))}
    assert top_finding(diag) == expected, (
        json.dumps(diag["findings"][:3], indent=1)[:3000] + json.dumps(shown)[:1500]
    )
    assert not diag["weak"]
    if case == "partition-locks":
        _partition_locks(doc, diag)
    if case == "missing-index":
        _missing_index(diag)


def _missing_index(diag: dict[str, Any]) -> None:
    """The statement's generic plan names the column an index would serve."""
    evidence = {e["name"]: e for e in diag["findings"][0]["evidence"]}
    plan = evidence["plan.seq_filter.items"]
    assert "(val = $1)" in plan["label"], plan
    assert "CREATE INDEX CONCURRENTLY ON items (val)" in plan["label"], plan


def _partition_locks(doc: dict[str, Any], diag: dict[str, Any]) -> None:
    """The lock-manager finding names the table, on the variant that does not prune only."""
    top = diag["findings"][0]
    assert top["variant"] == "generic" and "orders" in top["title"], top["title"]
    assert not [
        f for f in diag["findings"] if f["id"] == "lock-manager" and f["variant"] != "generic"
    ]
    peaks = {s["variant"]: s["facts"] for s in doc["facts"] if s["variant"] and s["peak"]}
    generic, custom = peaks["generic"], peaks["custom"]
    assert generic["locks.per_backend"]["value"] > 16 >= custom["locks.per_backend"]["value"]
    assert f"{PARTITIONS} partitions" in generic["locks.table.orders"]["label"]
    assert generic["locks.non_fastpath_share"]["value"] > 0.5
    assert custom["locks.non_fastpath_share"]["value"] == 0.0
    assert generic["locks.manager_share"]["value"] > 0.1 > custom["locks.manager_share"]["value"]


def test_lock_manager_is_silent_where_locks_fit_the_fast_path_slots(tmp_path: Path) -> None:
    """tpcb-like, the hot-rows case: a transaction locks four tables and three indexes, all
    in its fast-path slots. The collector sees them (and not pgscope's own sessions reading
    pg_locks), and the lock-manager rule stays silent."""
    spec = tmp_path / "tpcb.toml"
    spec.write_text('workload = "tpcb-like"\nscale = 1\nclients = [4]\n' + COMMON)
    result = pgscope("run", str(spec), "--json", "--results-dir", str(tmp_path / "r"), timeout=600)
    doc = run_doc(result)
    facts = next(s["facts"] for s in doc["facts"] if s["variant"] and s["peak"])
    assert 0 < facts["locks.per_backend"]["value"] <= 8, facts["locks.per_backend"]
    assert facts["locks.non_fastpath_share"]["value"] < 0.05, facts["locks.non_fastpath_share"]
    tables = {n.removeprefix("locks.table.") for n in facts if n.startswith("locks.table.")}
    assert "pgbench_accounts" in tables and not tables & {"pg_catalog.pg_locks", "pg_locks"}
    assert "lock-manager" not in {f["id"] for f in doc["diagnosis"]["findings"]}


def test_connecting_once_is_no_connection_overhead(tmp_path: Path) -> None:
    """The connection-overhead case's load without --connect: each client connects once, so
    pgbench's connection time spread over the transactions is a sliver of their latency, the
    server starts no session per transaction, and the rule stays silent."""
    spec_text, files, _ = PLANTED["connection-overhead"]
    (tmp_path / "one.sql").write_text(files["one.sql"])
    spec = tmp_path / "once.toml"
    spec.write_text(spec_text + COMMON)
    result = pgscope("run", str(spec), "--json", "--results-dir", str(tmp_path / "r"), timeout=600)
    doc = run_doc(result)
    assert "connection-overhead" not in {f["id"] for f in doc["diagnosis"]["findings"]}
    [facts] = [s["facts"] for s in doc["facts"] if s["variant"] and s["peak"]]
    assert facts["conn.time_share"]["value"] < 0.05, facts["conn.time_share"]
    assert "one connection per client" in facts["conn.time_share"]["label"]
    assert facts["conn.sessions_per_xact"]["value"] < 0.01, facts["conn.sessions_per_xact"]


def test_a_hot_page_on_two_cores_shows_no_spinlock_or_snapshot_hot_spot(tmp_path: Path) -> None:
    """The seeds' s_lock case, as far as this VM goes: up to 64 clients read the one row of a
    one-row table, every one pinning the same page, with the CPU profiled. The talk's s_lock
    at 33% of the CPU came from pins taken under the buffer header's spinlock on 256 logical
    CPUs; PostgreSQL 15 pins by compare-and-swap, and on 2 cores almost nothing spins
    (measured: no spinning sample in 1,475 at 64 clients; GetSnapshotData 0.5%). So this is
    the rules' control on real profiles: the facts are there, the rules stay silent, and the
    load is what it is, CPU-bound. Recorded as `hot-page`: tests/test_hot_spots.py plants
    the hot spots in built profiles."""
    (tmp_path / "hot.sql").write_text("select v from hot where id = 1;\n")
    (tmp_path / "schema.sql").write_text(
        "create table hot(id int primary key, v int);\ninsert into hot values (1, 1);\n"
    )
    spec = tmp_path / "hot-page.toml"
    spec.write_text(
        'scripts = ["hot.sql"]\ninit_sql = "schema.sql"\nscale = 0\nclients = [2, 16, 64]\n'
        + COMMON
    )
    result = pgscope(
        "run",
        str(spec),
        "--collectors",
        "activity,pgstats,host,statements,pglocks,perf",
        "--json",
        "--results-dir",
        str(tmp_path / "r"),
        timeout=600,
    )
    doc = run_doc(result)
    diag = diagnosis(doc, "hot-page", "cpu-saturation")
    assert top_finding(diag) == "cpu-saturation", json.dumps(diag["findings"][:3])[:2000]
    found = {f["id"] for f in diag["findings"]}
    assert not found & {"spinlock-contention", "snapshot-cost"}, found
    [facts] = [s["facts"] for s in doc["facts"] if s["variant"] and s["peak"]]
    assert facts["cpu.samples"]["value"] >= 200, "a profile large enough to judge"
    assert facts["cpu.spin"]["value"] < 0.05, facts["cpu.spin"]
    assert facts["cpu.snapshot"]["value"] < 0.06, facts["cpu.snapshot"]
    # Every select takes a snapshot, on about 0.5% of the samples: 2 or 3 of a cell's few
    # hundred, so some cell (not always each) names the caller from real stacks.
    cells = [s["facts"] for s in doc["facts"] if s["variant"]]
    assert any("cpu.snapshot_caller.GetTransactionSnapshot" in c for c in cells), cells[-1]


CAN_TRACE = os.geteuid() == 0 and bool(shutil.which("bpftrace"))
WALWRITE = """
scripts = ["insert.sql"]
init_sql = "schema.sql"
scale = 0
clients = [8]
duration = 6
warmup = 1
repeats = 1
order = "sequential"
[settings]
shared_buffers = "128MB"
[variants]
sync = {}
async = {synchronous_commit = "off"}
[collectors]
activity = {}
pgstats = {}
host = {}
usdt = {programs = ["lwlock"]}
"""


@pytest.mark.tracing
@pytest.mark.skipif(not CAN_TRACE, reason="kernel-side tracing needs root and bpftrace")
def test_lwlock_hotspot_is_named_from_traced_time(tmp_path: Path) -> None:
    """Planted: 8 sessions each committing one-row inserts (synchronous_commit on): a commit
    waits for WALWriteLock while another session's flush holds it. The usdt lwlock program
    times every wait; lwlock-hotspot must name WALWrite from that traced time (not from the
    sampled share). The control is the same load with synchronous_commit = off: no commit
    waits for a flush, so WALWrite must fade and the rule must not name it."""
    (tmp_path / "insert.sql").write_text("insert into t(info) values (null);\n")
    (tmp_path / "schema.sql").write_text("create table t(id serial primary key, info text);\n")
    spec = tmp_path / "walwrite.toml"
    spec.write_text(WALWRITE)
    result = pgscope("run", str(spec), "--json", "--results-dir", str(tmp_path / "r"), timeout=600)
    doc = run_doc(result)
    diag = diagnosis(doc, "walwrite-traced", "commit-flush")
    assert top_finding(diag) == "commit-flush", json.dumps(diag["findings"][:3])[:2000]
    assert diag["findings"][0]["variant"] == "sync"
    hot = {f["variant"]: f for f in diag["findings"] if f["id"] == "lwlock-hotspot"}
    assert "sync" in hot, [(f["id"], f["variant"]) for f in diag["findings"]]
    assert hot["sync"]["title"].endswith("WALWrite") and hot["sync"]["confidence"] == "high"
    named = {e["name"]: e for e in hot["sync"]["evidence"]}
    assert named["lwlock.top.WALWrite"]["source"] == "usdt", named
    assert "traced in the kernel" in named["lwlock.top.WALWrite"]["label"]
    assert named["lwlock.top_waits_per_xact"]["value"] > 0.5, "most commits wait for it"
    sheets = {s["variant"]: s["facts"] for s in doc["facts"] if s["variant"]}
    traced = sheets["sync"]["lwlock.share.WALWrite"]["value"]
    sampled = sheets["sync"]["wait.share.LWLock:WALWrite"]["value"]
    assert traced > 0.3 and sampled > 0.3, (traced, sampled)  # two collectors, one answer
    # The control: no commit waits for a flush, and the rule names no WALWrite hot spot.
    control = sheets["async"].get("lwlock.share.WALWrite", {"value": 0.0})["value"]
    assert control < traced / 5, (control, traced)
    assert "async" not in hot or not hot["async"]["title"].endswith("WALWrite"), hot["async"]
