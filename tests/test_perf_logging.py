"""It must show (issue 5, item 1): statement logging shows up in a differential CPU profile.

A select-only run with two variants, log_statement=none and =all (logging collector on, as in
the field case), profiled per step by the perf collector: two profiles, and a differential in
which the logging path (errfinish -> EmitErrorReport -> write_pipe_chunks -> write ->
pipe_write) is among the top growths.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pgscope.analyze.profile import differential, load_profile, recordings, steps_of
from pgscope.render.flame import diff_flame_html
from pgscope.store import RunStore
from tests.conftest import pgscope

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("perf") is None,
    reason="perf profiles need root and perf (apt-get install linux-perf)",
)

SPEC = """
name = "logging-profile"
description = "select-only with and without statement logging, profiled per step"
workload = "select-only"
scale = 1
protocol = "prepared"
clients = [2]
duration = 4
warmup = 1
repeats = 1
order = "sequential"

[settings]
logging_collector = "on"
shared_buffers = "128MB"
max_wal_size = "1GB"

[variants]
none = { log_statement = "none" }
all = { log_statement = "all" }

[collectors]
perf = {}
"""

# The logging path in the backend and in this kernel, leaf to caller.
LOGGING_PATH = {
    "errfinish",
    "EmitErrorReport",
    "send_message_to_server_log",
    "write_pipe_chunks",
    "write",
    "__libc_write",
    "pipe_write_[k]",
    "anon_pipe_write_[k]",  # pipe_write since Linux 6.14
    "__GI___libc_write",  # libc6-dbg names the wrapper so
    "vfs_write_[k]",
    "ksys_write_[k]",
    "__x64_sys_write_[k]",
}


def test_log_statement_all_grows_the_logging_path(tmp_path: Path) -> None:
    spec = tmp_path / "logging.toml"
    spec.write_text(SPEC)
    results = tmp_path / "results"
    run = pgscope("run", str(spec), "--results-dir", str(results), "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout)["status"] == "complete"
    (run_dir,) = results.iterdir()

    store = RunStore.open(run_dir)
    try:
        cpu = [r for r in recordings(store) if r.kind == "cpu"]
        assert sorted((r.variant, r.total > 0) for r in cpu) == [("all", True), ("none", True)]
        quiet = load_profile(store, "cpu", steps_of(store, "none"), label="none")
        logged = load_profile(store, "cpu", steps_of(store, "all"), label="all")
    finally:
        store.close()
    # ~4-5 s of two busy backends at 99 Hz on 2 CPUs: hundreds of samples each.
    assert quiet.total > 200 and logged.total > 200, (quiet.total, logged.total)
    backends = logged.only(roles=["backend"])
    assert backends.total > 0.5 * logged.total

    diff = differential(quiet, logged, limit=12)
    top = [d.name for d in diff.grew]
    assert LOGGING_PATH & set(top), f"no logging frame among the top growths: {top}"
    errfinish = next(
        d for d in differential(quiet, logged, limit=10_000).grew if d.name == "errfinish"
    )
    assert errfinish.total_a < 0.01 < errfinish.total_b, errfinish
    # The syslogger (reading the pipe) works only when statements are logged.
    logger_share = logged.only(roles=["logger"]).total / logged.total
    assert logger_share > quiet.only(roles=["logger"]).total / quiet.total

    page = diff_flame_html(quiet, logged, diff, "log_statement none -> all")
    assert "errfinish" in page and '"differential":true' in page
