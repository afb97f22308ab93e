"""It must show (issue 5, item 2): commit flushes dominate backend sleep in an insert-only run.

Field case 1's workload (`insert into test(info) values (null)`, one commit per insert) with
synchronous_commit=on: off CPU, backends spend a large share of their sleep in the commit
flush (CommitTransactionCommand -> XLogFlush -> fdatasync), more than waiting for the client.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pgscope.analyze.profile import Profile, load_profile, recordings
from pgscope.store import RunStore
from tests.cli import pgscope

pytestmark = [
    pytest.mark.server,
    pytest.mark.tracing,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("bpftrace") is None,
        reason="off-CPU tracing needs root and bpftrace (apt-get install bpftrace)",
    ),
]


def share_under(profile: Profile, function: str) -> float:
    """Share of the profile's value whose stack passes through `function`."""
    value = sum(v for (_, _, frames), v in profile.stacks.items() if function in frames)
    return value / profile.total


def test_insert_only_backends_sleep_in_the_commit_flush(tmp_path: Path) -> None:
    schema = tmp_path / "schema.sql"
    schema.write_text("create table test(id serial primary key, info text, crt_time timestamp);\n")
    script = tmp_path / "insert.sql"
    script.write_text("insert into test(info) values (null);\n")
    results = tmp_path / "results"
    run = pgscope(
        "run",
        "--script", str(script),
        "--init-sql", str(schema),
        "--scale", "0",
        "--clients", "2",
        "--duration", "4",
        "--warmup", "1",
        "--repeats", "1",
        "--set", "synchronous_commit=on",
        "--collectors", "offcpu",
        "--results-dir", str(results),
        "--json",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout)["status"] == "complete"
    (run_dir,) = results.iterdir()
    store = RunStore.open(run_dir)
    try:
        (recording,) = [r for r in recordings(store) if r.kind == "offcpu"]
        assert recording.step_id == 1 and recording.total > 0
        offcpu = load_profile(store, "offcpu", [1], label="insert")
        collectors = store.query("SELECT name, status, error FROM collectors")
    finally:
        store.close()
    assert collectors == [{"name": "offcpu", "status": "complete", "error": None}]

    sleeping = offcpu.only(roles=["backend"], states=["sleep", "blocked"])
    # Two backends for ~5 s: seconds of sleep in total, in microseconds.
    assert sleeping.total > 1_000_000, sleeping.total
    flush = share_under(sleeping, "XLogFlush")
    fsync = share_under(sleeping, "fdatasync")  # libc's wrapper, under XLogFlush
    client = share_under(sleeping, "secure_read")
    assert flush > 0.25, f"XLogFlush share of backend sleep {flush:.1%}"
    assert fsync > 0.2, f"fdatasync share of backend sleep {fsync:.1%}"
    assert flush > client, f"commit flush {flush:.1%} vs client reads {client:.1%}"
    # The fsync waits are uninterruptible (disk) sleeps.
    blocked = offcpu.only(roles=["backend"], states=["blocked"])
    assert share_under(blocked, "XLogFlush") > 0.5
