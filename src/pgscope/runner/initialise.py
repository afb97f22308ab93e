"""Before the first step: the server's version recorded, the workload's tables created."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from pgscope.drive.loaduser import LoadUser
from pgscope.errors import TargetError
from pgscope.proc import spawn, stop_process
from pgscope.runner.context import RunContext
from pgscope.target.conn import ConnParams
from pgscope.target.introspect import server_identity, server_version
from pgscope.target.pgbin import PgBinaries


def initialise_target(ctx: RunContext) -> int:
    """Record the server's version, then create pgbench's tables at the spec's scale and run
    its init_sql. Returns the server's version number (server_version_num)."""
    spec, store, reporter = ctx.spec, ctx.store, ctx.reporter
    conn = ctx.pgbench.conn
    server = ctx.servers.server
    allow_writes = server is None or server.allow_writes
    with conn.connect() as session:
        version, version_num = server_version(session)
        identity = server_identity(session)
    store.set_server(version, version_num, identity)
    if spec.scale > 0:
        if ctx.pgbench.initialise(spec.scale, allow_writes=allow_writes, say=reporter.phase):
            store.add_event("init", f"pgbench -i -s {spec.scale}")
        else:
            reporter.phase(f"using the pgbench tables already at scale {spec.scale}")
    init_sql = ctx.loaded.init_sql_path()
    if init_sql is not None:
        reporter.phase(f"running {init_sql.name}")
        run_init_sql(ctx.pgbench.pg, conn, init_sql, ctx.pgbench.user)
        store.add_event("init", f"init_sql {init_sql}")
    return version_num


def run_init_sql(pg: PgBinaries, conn: ConnParams, path: Path, user: LoadUser) -> None:
    """Run a SQL file with psql: statement by statement (VACUUM and CREATE INDEX
    CONCURRENTLY cannot run in the one transaction a multi-statement query would be), with
    psql's own parsing of quoting and meta-commands, stopping at the first error.

    psql runs as the load's account (`\\!` runs a shell) and reads the file from its stdin,
    which pgscope opens: the account need not be able to read it. It starts in the file's
    directory, so `\\i` and `\\ir` find the files the account may read there."""
    argv = [
        str(pg.path("psql")),
        "-X",
        "-q",
        "-v",
        "ON_ERROR_STOP=1",
        "-f",
        "-",
        conn.conninfo(),
    ]
    with path.open("rb") as script:
        proc = spawn(
            argv,
            run_as=user.run_as,
            cwd=path.parent,
            env=user.libpq_env(conn),
            stdin=script,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        _, err = proc.communicate(timeout=3600)
    except BaseException:
        stop_process(proc, signal.SIGINT, grace_s=5)
        raise
    if proc.returncode != 0:
        lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
        reason = next((ln for ln in lines if "ERROR" in ln or "FATAL" in ln), None)
        if reason is None:
            reason = lines[-1] if lines else f"psql exited with {proc.returncode}"
        raise TargetError(f"init_sql failed: {reason}")
