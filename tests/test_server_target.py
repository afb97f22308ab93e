"""An existing server (--dsn): read-only by default, never reconfigured, no password kept."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import struct
import subprocess
import threading
from pathlib import Path

import pytest

from pgscope.target.embedded import EmbeddedCluster
from pgscope.target.pgbin import PgBinaries
from tests.cli import one_line_error, pgscope

SHORT = ["--duration", "1", "--warmup", "0", "--repeats", "1"]


def dsn(cluster: EmbeddedCluster, extra: str = "") -> str:
    return f"host={cluster.socket_dir} port={cluster.port} user=postgres dbname=postgres {extra}"


def reader_dsn(cluster: EmbeddedCluster, extra: str = "", grant: str = "") -> str:
    """A role that can only read (pg_monitor, and `grant`): user scripts run only as one."""
    with cluster.connect() as conn:
        conn.execute("CREATE ROLE reader LOGIN")
        conn.execute("GRANT pg_monitor TO reader")
        if grant:
            conn.execute(grant)
    return dsn(cluster, extra).replace("user=postgres", "user=reader")


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
    """Said before a run folder exists (`--scale 5 --dsn` used to make one first)."""
    results = tmp_path / "r"
    result = pgscope(
        "run",
        "scaling",
        "--dsn",
        dsn(cluster),
        "--clients",
        "1,2,3",
        *SHORT,
        "--scale",
        "5",
        "--results-dir",
        str(results),
    )
    assert result.returncode == 6
    assert "pgbench tables at scale 5 are needed but they do not exist" in one_line_error(result)
    assert user_tables(cluster) == []
    assert not results.exists(), "refused before any run folder is made"


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
    # The built-in read-only workload runs as a role that could write, and says so.
    assert (
        'role "postgres" is a superuser; the built-in select-only workload runs under the '
        "read-only guard only (a user script would be refused)"
    ) in read.stderr
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"password found in {path}"
    assert secret not in written.stdout + written.stderr + read.stdout + read.stderr


# What a role that can only read may still write: a temporary table of its session's own
# (every role has TEMP on the database). The read-only guard stops that too.
TEMP_WRITE = "CREATE TEMP TABLE IF NOT EXISTS scratch (id int);\nINSERT INTO scratch VALUES (1);\n"


def test_a_temporary_table_is_refused_before_any_load(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    """A role that can only read may still create a temporary table (every role has TEMP on
    the database), which the read-only guard rejected at the server; PostgreSQL's parser now
    finds the statement is not a read before any load (issue 37)."""
    script = tmp_path / "insert.sql"
    script.write_text(TEMP_WRITE)
    result = pgscope(
        "run", "--dsn", reader_dsn(cluster), "--script", str(script), "--scale", "0",
        "--clients", "1,2,3", *SHORT, "--results-dir", str(tmp_path / "r"),
    )  # fmt: skip
    assert result.returncode == 6, result.stderr
    assert "script insert.sql line 1: CREATE TABLE, which is not a read" in one_line_error(result)
    assert not (tmp_path / "r").exists(), "refused before any run folder is made"


# A read that fails unless its session is read-only: it shows the guard held in pgbench's own
# sessions (writes are refused before any load now).
# (The setting's name is spelled in two halves: a script naming it is refused as one that could
# change it.)
GUARD_HELD = (
    "SELECT 1 / count(*)::int FROM pg_settings "
    "WHERE name = 'transaction_' || 'read_only' AND setting = 'on';\n"
)


def test_a_dsn_options_entry_cannot_lift_the_read_only_guard(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    """`options=` in the DSN used to win over PGOPTIONS (a plain INSERT script wrote 130
    rows): the guard now goes last in the connection string pgbench uses. The script divides
    by zero in a session that is not read-only."""
    script = tmp_path / "guard.sql"
    script.write_text(GUARD_HELD)
    result = pgscope(
        "run",
        "--dsn",
        reader_dsn(cluster, "options='-c default_transaction_read_only=off'"),
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
    assert result.returncode == 0, result.stderr[-1500:]
    assert "division by zero" not in result.stdout


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

    from tests.poll import elapse, wait_until

    secret = "not-for-ps-4711"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgscope", "sample", "--dsn", dsn(cluster, f"password={secret}"),
         "--duration", "2", "--results-dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    cmdline = Path(f"/proc/{proc.pid}/cmdline")

    def title() -> str:
        try:
            return cmdline.read_bytes().decode(errors="replace")
        except OSError:
            return ""

    # Start-up: the interpreter, then pgscope's first import rewrites the title (its words
    # then joined by spaces, not the NULs between arguments).
    wait_until(
        lambda: "pgscope sample --dsn" in title() or proc.poll() is not None, "the new title"
    )
    titles = []
    while proc.poll() is None and (now := title()):
        titles.append(now)
        elapse(0.05, "between two readings of the title")
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
        "run", "--dsn", reader_dsn(cluster), "--clients", "1", "--scale", "0", "--script",
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


class OptionsDroppingProxy:
    """A TCP proxy to a cluster that removes `options` from each connection's startup packet,
    as a connection pooler that ignores that parameter does: pgbench's read-only guard never
    reaches the server through it."""

    def __init__(self, cluster: EmbeddedCluster) -> None:
        self.target = str(cluster.socket_dir / f".s.PGSQL.{cluster.port}")  # it has no TCP
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def dsn(self, extra: str = "") -> str:
        # No SSL or GSS negotiation: the first packet is then the startup packet.
        return (
            f"host=127.0.0.1 port={self.port} sslmode=disable gssencmode=disable "
            f"user=postgres dbname=postgres {extra}"
        )

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client, socket.socket(socket.AF_UNIX) as server:
            server.connect(self.target)
            (length,) = struct.unpack("!I", _receive(client, 4))
            body = _receive(client, length - 4)
            words = body[4:].split(b"\0")
            pairs = [(words[i], words[i + 1]) for i in range(0, len(words) - 1, 2) if words[i]]
            kept = b"".join(k + b"\0" + v + b"\0" for k, v in pairs if k != b"options")
            packet = body[:4] + kept + b"\0"
            server.sendall(struct.pack("!I", len(packet) + 4) + packet)
            back = threading.Thread(target=_pump, args=(server, client), daemon=True)
            back.start()
            _pump(client, server)
            back.join(timeout=30)


def _receive(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("closed during the startup packet")
        data += chunk
    return data


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def test_a_guard_dropped_on_the_way_is_refused_before_any_load(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    """The guard travels in the connection's `options`; a pooler may drop them. pgscope asks
    the server, in a session opened as pgbench's, and refuses when it is not read-only."""
    import psycopg

    with cluster.connect() as conn:
        conn.execute("CREATE TABLE hits (id int)")
    proxy = OptionsDroppingProxy(cluster)
    try:
        guarded = f"{proxy.dsn()} options='-c default_transaction_read_only=on'"
        with psycopg.connect(guarded, autocommit=True) as session:
            row = session.execute("SHOW default_transaction_read_only").fetchone()
        assert row == ("off",), "the proxy drops the guard, as the test needs"
        script = tmp_path / "insert.sql"
        script.write_text("INSERT INTO hits VALUES (1);\n")
        results = tmp_path / "r"
        result = pgscope(
            "run", "--dsn", proxy.dsn(), "--script", str(script), "--scale", "0",
            "--clients", "1", *SHORT, "--results-dir", str(results),
        )  # fmt: skip
    finally:
        proxy.close()
    assert result.returncode == 6, result.stderr[-1500:]
    message = one_line_error(result)
    assert "the read-only guard did not hold on" in message, message
    assert "default_transaction_read_only = off, transaction_read_only = off" in message
    assert "--allow-writes" in message
    assert not results.exists(), "refused before any run folder is made"
    with cluster.connect() as conn:
        assert conn.execute("SELECT count(*) FROM hits").fetchone() == (0,)


def _roles_on_pgbench_tables(cluster: EmbeddedCluster, pg: PgBinaries) -> None:
    """pgbench's tables at scale 1, and roles as a DBA would make them for pgscope: pg_monitor
    only (monitor), it and SELECT on pgbench_branches only (half), the recommended role
    (reader: pg_monitor and SELECT on the tables)."""
    subprocess.run(
        [pg.path("pgbench"), "-i", "-s", "1", "-q", cluster.conn.conninfo()],
        check=True, capture_output=True,
    )  # fmt: skip
    with cluster.connect() as conn:
        for role in ("monitor", "half", "reader"):
            conn.execute(f"CREATE ROLE {role} LOGIN")
            conn.execute(f"GRANT pg_monitor TO {role}")
        conn.execute("GRANT SELECT ON pgbench_branches TO half")
        conn.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader")


def test_a_role_without_table_grants_is_told_which_grant_it_needs(
    cluster: EmbeddedCluster, pg: PgBinaries, tmp_path: Path
) -> None:
    """A pg_monitor role without SELECT ended as 'internal error' (InsufficientPrivilege in
    drive/pgbench.py): now the run fails with the GRANT to give, summarised as far as it got."""
    _roles_on_pgbench_tables(cluster, pg)
    expected = {
        "monitor": "role monitor cannot read pgbench_branches (pgbench counts its rows for the "
        "scale): GRANT SELECT ON pgbench_branches TO monitor",
        "half": "role half cannot read pgbench_accounts (workload select-only): GRANT SELECT "
        "ON pgbench_accounts TO half",
    }
    for role, wanted in expected.items():
        results = tmp_path / role
        result = pgscope(
            "run", "--workload", "select-only", "--scale", "1", "--clients", "1", *SHORT,
            "--results-dir", str(results),
            env={"PGSCOPE_DSN": dsn(cluster).replace("user=postgres", f"user={role}")},
        )  # fmt: skip
        assert result.returncode == 5, (role, result.stderr[-1500:])
        assert one_line_error(result) == f"pgscope: error: {wanted}", role
        assert "failed (role " in result.stdout, "the summary, as far as the run got"
        [run_dir] = list(results.iterdir())
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "failed" and wanted in summary["status_reason"]
        assert summary["steps"] == []


def test_the_recommended_role_runs_read_only_to_the_end(
    cluster: EmbeddedCluster, pg: PgBinaries, tmp_path: Path
) -> None:
    """pg_monitor and SELECT on the tables: the run completes, its collectors all work, the
    statements collector too (pg_stat_statements installed, as a DBA would have it)."""
    _roles_on_pgbench_tables(cluster, pg)
    cluster.apply_settings({"shared_preload_libraries": "pg_stat_statements"})
    with cluster.connect() as conn:
        conn.execute("CREATE EXTENSION pg_stat_statements")
    dsn_file = tmp_path / "dsn"
    dsn_file.write_text(dsn(cluster).replace("user=postgres", "user=reader") + "\n")
    result = pgscope(
        "run", "--dsn-file", str(dsn_file), "--workload", "select-only", "--scale", "1",
        "--clients", "1,2", *SHORT, "--results-dir", str(tmp_path / "r"), "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-1500:]
    doc = json.loads(result.stdout)
    assert doc["status"] == "complete"
    assert [s["status"] for s in doc["steps"]] == ["ok", "ok"]
    assert all(s["tps"] > 0 for s in doc["steps"])
    collectors = {c["name"]: c for c in doc["environment"]["collectors"]}
    assert {"activity", "pgstats", "statements"} <= set(collectors)
    working = {n for n, c in collectors.items() if c["available"] and c["status"] != "failed"}
    # The one that writes (WAL, to measure the device) is no default on a server pgscope does
    # not own: not chosen at all, rather than chosen and unavailable.
    assert "waldevice" not in collectors, collectors["waldevice"]
    assert working == set(collectors), collectors
    assert doc["waits"]["overall"]["samples"] > 0, "pg_monitor lets it see the sessions"
    import duckdb

    store = duckdb.connect(str(Path(doc["run_dir"]) / "run.duckdb"), read_only=True)
    try:
        row = store.execute(
            "SELECT count(*) FROM statement_texts WHERE query LIKE '%FROM pgbench_accounts%'"
        ).fetchone()
        # This role cannot keep pgscope's statements out of pg_stat_statements: the sampler's
        # batch is counted there, seen running in pgscope's session, and left out below.
        sampler = {
            int(q)
            for (q,) in store.execute(
                "SELECT queryid FROM statement_texts WHERE query LIKE '%pg_sleep%'"
            ).fetchall()
        }
        own = {int(q) for (q,) in store.execute("SELECT queryid FROM statement_own").fetchall()}
    finally:
        store.close()
    assert row is not None and row[0] > 0, "the workload's statement, read as this role"
    assert sampler and sampler <= own, (sampler, own)
    analysed = {int(s["queryid"]) for s in doc["statements"]["statements"]}
    assert analysed and not analysed & own, "pgscope's own statements are not the workload's"


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
        "run", "--dsn", reader_dsn(cluster, grant="GRANT SELECT ON items TO reader"),
        "--script", str(script), "--scale", "0",
        "--clients", "2", "--duration", "3", "--warmup", "1", "--repeats", "1",
        "--collectors", "activity,pgstats,host,statements", "--json",
        "--results-dir", str(tmp_path / "r"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "pg_stat_statements is not installed in database postgres" in result.stderr
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
