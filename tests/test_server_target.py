"""An existing server (--dsn): read-only by default, never reconfigured, no password kept."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pgscope.target.embedded import EmbeddedCluster
from tests.conftest import one_line_error, pgscope

SHORT = ["--duration", "1", "--warmup", "0", "--repeats", "1"]


def dsn(cluster: EmbeddedCluster, extra: str = "") -> str:
    return f"host={cluster.socket_dir} port={cluster.port} user=postgres dbname=postgres {extra}"


def user_tables(cluster: EmbeddedCluster) -> list[str]:
    with cluster.connect() as conn:
        rows = conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace ORDER BY 1"
        ).fetchall()
    return [str(r[0]) for r in rows]


def test_write_workload_is_refused_and_nothing_is_created(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    result = pgscope(
        "run",
        "scaling",
        "--dsn",
        dsn(cluster),
        "--workload",
        "tpcb-like",
        "--clients",
        "1,2,3",
        *SHORT,
        "--results-dir",
        str(results),
    )
    assert result.returncode == 6
    message = one_line_error(result)
    assert "workload tpcb-like writes to the server" in message and "--allow-writes" in message
    assert user_tables(cluster) == []
    assert not results.exists(), "refused before any run folder is made"


def test_read_only_workload_needs_existing_tables(cluster: EmbeddedCluster, tmp_path: Path) -> None:
    result = pgscope(
        "run",
        "scaling",
        "--dsn",
        dsn(cluster),
        "--clients",
        "1,2,3",
        *SHORT,
        "--scale",
        "1",
        "--results-dir",
        str(tmp_path),
    )
    assert result.returncode == 6
    assert "pgbench tables at scale 1 are needed but they do not exist" in one_line_error(result)
    assert user_tables(cluster) == []


def test_settings_and_variants_are_never_applied(cluster: EmbeddedCluster, tmp_path: Path) -> None:
    result = pgscope(
        "run",
        "scaling",
        "--dsn",
        dsn(cluster),
        "--set",
        "work_mem=64MB",
        "--allow-writes",
        "--results-dir",
        str(tmp_path),
    )
    assert result.returncode == 6
    message = one_line_error(result)
    assert "never changes settings on an existing server" in message and "work_mem" in message
    with cluster.connect() as conn:
        assert conn.execute("SHOW work_mem").fetchone() == ("4MB",)


def test_allow_writes_initialises_then_read_only_runs_and_no_password_is_kept(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    secret = "sekrit-PASSWORD-42"
    written = pgscope(
        "run",
        "scaling",
        "--dsn",
        dsn(cluster, f"password={secret}"),
        "--allow-writes",
        "--workload",
        "tpcb-like",
        "--scale",
        "1",
        "--clients",
        "1,2,3",
        *SHORT,
        "--json",
        "--results-dir",
        str(tmp_path),
    )
    assert written.returncode == 0, written.stderr
    assert {"pgbench_accounts", "pgbench_branches"} <= set(user_tables(cluster))
    doc = json.loads(written.stdout)
    assert doc["target"]["kind"] == "server" and len(doc["steps"]) == 3
    read = pgscope(
        "run",
        "scaling",
        "--dsn",
        dsn(cluster, f"password={secret}"),
        "--scale",
        "1",
        "--clients",
        "1,2,3",
        *SHORT,
        "--json",
        "--results-dir",
        str(tmp_path),
    )
    assert read.returncode == 0, read.stderr
    assert all(s["status"] == "ok" for s in json.loads(read.stdout)["steps"])
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"password found in {path}"
    assert secret not in written.stdout + written.stderr + read.stdout + read.stderr


def test_writing_script_without_allow_writes_is_stopped_by_the_server(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    with cluster.connect() as conn:
        conn.execute("CREATE TABLE t (id int)")
    script = tmp_path / "insert.sql"
    script.write_text("INSERT INTO t VALUES (1);\n")
    result = pgscope(
        "run",
        "--dsn",
        dsn(cluster),
        "--script",
        str(script),
        "--scale",
        "0",
        "--clients",
        "1,2,3",
        *SHORT,
        "--json",
        "--results-dir",
        str(tmp_path / "r"),
    )
    assert result.returncode == 7, result.stderr
    assert "all 3 steps failed" in one_line_error(result)
    steps = json.loads(result.stdout)["steps"]
    assert all("read-only transaction" in (s["error"] or "") for s in steps)
    with cluster.connect() as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_a_dsn_options_entry_cannot_lift_the_read_only_guard(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    """`options=` in the DSN used to win over PGOPTIONS (a plain INSERT script wrote 130
    rows): the guard now goes last in the connection string pgbench uses."""
    with cluster.connect() as conn:
        conn.execute("CREATE TABLE hits (id int)")
    script = tmp_path / "insert.sql"
    script.write_text("INSERT INTO hits VALUES (1);\n")
    result = pgscope(
        "run",
        "--dsn",
        dsn(cluster, "options='-c default_transaction_read_only=off'"),
        "--script",
        str(script),
        "--scale",
        "0",
        "--clients",
        "1",
        *SHORT,
        "--results-dir",
        str(tmp_path / "r"),
    )
    with cluster.connect() as conn:
        row = conn.execute("SELECT count(*) FROM hits").fetchone()
    assert row == (0,), f"the server took writes: {row}; {result.stderr[-1500:]}"
    assert "read-only transaction" in result.stderr or "read-only" in result.stdout


@pytest.mark.parametrize(
    "text",
    [
        "BEGIN READ WRITE;\nINSERT INTO hits VALUES (1);\nEND;\n",
        "SET default_transaction_read_only = off;\nINSERT INTO hits VALUES (1);\n",
        "SELECT set_config('default_transaction_read_only', 'off', false);\n",
        "\\shell id\nSELECT 1;\n",
    ],
)
def test_a_script_that_could_lift_the_guard_is_refused_before_any_load(
    cluster: EmbeddedCluster, tmp_path: Path, text: str
) -> None:
    with cluster.connect() as conn:
        conn.execute("CREATE TABLE hits (id int)")
    script = tmp_path / "lift.sql"
    script.write_text(text)
    results = tmp_path / "r"
    result = pgscope(
        "run", "--dsn", dsn(cluster), "--script", str(script), "--scale", "0",
        "--clients", "1", *SHORT, "--results-dir", str(results),
    )  # fmt: skip
    assert result.returncode == 6, result.stderr[-1500:]
    message = one_line_error(result)
    assert "lift.sql line" in message and "--allow-writes" in message
    assert not results.exists(), "refused before any run folder is made"
    with cluster.connect() as conn:
        assert conn.execute("SELECT count(*) FROM hits").fetchone() == (0,)


def test_pgscopes_own_process_title_never_shows_the_password(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    """`ps` shows every process's arguments to every user: a --dsn's password is masked in
    pgscope's own title once start-up has read it (a fresh interpreter, as a user starts it)."""
    import subprocess
    import sys
    import time

    secret = "not-for-ps-4711"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgscope", "sample", "--dsn", dsn(cluster, f"password={secret}"),
         "--duration", "2", "--results-dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    time.sleep(0.5)  # start-up: the interpreter, then pgscope's first import rewrites it
    titles = []
    while proc.poll() is None:
        try:
            titles.append(cmdline.read_bytes().decode(errors="replace"))
        except OSError:
            break
        time.sleep(0.05)
    proc.wait(timeout=30)
    assert any("pgscope sample --dsn" in t for t in titles), titles[:3]
    assert not any(secret in t for t in titles), "the password in pgscope's process title"


def test_a_users_server_gets_no_kernel_tracing_unless_asked(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    """usdt is on by default on clusters pgscope starts; on a server it did not start it would
    attach to that server's binary (every cluster of it pays the probe traps), so by default it
    does not run there, and the run says how to ask for it."""
    import duckdb

    subprocess_run = pgscope(
        "run", "--dsn", dsn(cluster), "--clients", "1", "--scale", "0", "--script",
        str(_select_one(tmp_path)), *SHORT, "--results-dir", str(tmp_path / "r"), "--json",
    )  # fmt: skip
    assert subprocess_run.returncode == 0, subprocess_run.stderr[-1500:]
    assert "usdt: not by default on a server pgscope did not start" in subprocess_run.stderr
    run_dir = Path(json.loads(subprocess_run.stdout)["run_dir"])
    db = duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)
    try:
        names = {r[0] for r in db.execute("SELECT name FROM collectors").fetchall()}
    finally:
        db.close()
    assert not names & {"usdt", "perf", "offcpu"}, names
    assert "activity" in names


def _select_one(tmp_path: Path) -> Path:
    script = tmp_path / "select.sql"
    script.write_text("SELECT 1;\n")
    return script


def test_a_server_without_pg_stat_statements_is_diagnosed_from_what_it_has(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    """Issue 13, must-show 4: a server without pg_stat_statements (this fixture's cluster does
    not load it) gets a diagnosis from the rest of the evidence, and the rules that judge
    statements are listed as not assessed with that reason, in the JSON and on the console."""
    with cluster.connect() as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'"
        ).fetchone() == (0,)
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, val int, pad text)")
        conn.execute(
            "INSERT INTO items SELECT g, g, md5(g::text) FROM generate_series(1, 100000) g"
        )
        conn.execute("ANALYZE items")
    script = tmp_path / "lookup.sql"
    script.write_text("\\set k random(1, 100000)\nSELECT id, pad FROM items WHERE val = :k;\n")
    result = pgscope(
        "run", "--dsn", dsn(cluster), "--script", str(script), "--scale", "0",
        "--clients", "2", "--duration", "3", "--warmup", "1", "--repeats", "1",
        "--collectors", "activity,pgstats,host,statements", "--json",
        "--results-dir", str(tmp_path / "r"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "pg_stat_statements is not installed in the target database" in result.stderr
    doc = json.loads(result.stdout)
    diagnosis = doc["diagnosis"]
    assert diagnosis["findings"] and not diagnosis["weak"], diagnosis["verdict"]
    [facts] = [s["facts"] for s in doc["facts"] if s["variant"] and s["peak"]]
    assert not any(name.startswith("stmt.") for name in facts)
    assert facts["scan.seq_rows.items"]["value"] > 50_000, "the table statistics were read"
    # The server behind the DSN runs here: its processes are the server's CPU, not another
    # workload's. They were, before the host collector looked its postmaster up (server 0%,
    # other processes 99%), and cpu-other-processes was the top finding. Two clients scanning
    # a table keep the server on CPU (98% of this 2-CPU host when alone; less beside other
    # loads, which this shared host may run: those are other processes' by right).
    assert "host: the server is postmaster" in result.stderr
    assert facts["host.server_cpu"]["value"] > 0.3, facts["host.server_cpu"]
    unjudged = {n["id"]: n for n in diagnosis["not_assessed"]}
    statement_rules = {"seq-scan", "temp-spill", "index-write-amplification"}
    statement_rules.add("shared-buffers-small")
    assert statement_rules <= set(unjudged), sorted(unjudged)
    for rule in statement_rules:
        assert "pg_stat_statements (the statements collector)" in unjudged[rule]["needs"]
        [why] = unjudged[rule]["why"]
        assert why.startswith("pg_stat_statements is absent from the target database"), why
    # Judged from the table statistics and the sampled waits, which this server still gives.
    assert not {"dead-rows", "large-results"} & set(unjudged)
    summary = " ".join((Path(doc["run_dir"]) / "summary.txt").read_text().split())
    said = re.search(r"not assessed \(([^)]*)\): pg_stat_statements is absent", summary)
    assert said and statement_rules <= set(said[1].split(", ")), summary[:3000]
