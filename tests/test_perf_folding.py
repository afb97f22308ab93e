"""Folding and the profile analysis, on perf's own output format and on small known profiles:
no sample is ever dropped, unknown frames are marked, shares and deltas are what they claim."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pgscope.analyze.profile import (
    Profile,
    diff_flame_tree,
    differential,
    flame_tree,
    kernel_lock_share,
    kernel_user_split,
    top_functions,
    wait_sites,
)
from pgscope.collect.profiles.elfsymbols import AddressSymbolizer
from pgscope.collect.profiles.offcpufold import fold_offcpu_key, state_name
from pgscope.collect.profiles.perffold import ProcessTree, fold_perf_script
from pgscope.collect.roles import process_role
from pgscope.render.flame import folded_text

PERF_SCRIPT = """\
postgres 4711/4711
\tffffffff821f8914 __schedule ([kernel.kallsyms])
\tffffffff81000130 entry_SYSCALL_64_after_hwframe ([kernel.kallsyms])
\t          10ab59 __send (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t          34b06c [unknown] (/usr/lib/postgresql/15/bin/postgres)
\t          472bf6 PostgresMain (/usr/lib/postgresql/15/bin/postgres)

postgres 4711/4711
\t          5a5c16 errfinish (/usr/lib/postgresql/15/bin/postgres)
\t          472bf6 PostgresMain (/usr/lib/postgresql/15/bin/postgres)

postgres: walwriter 4700/4700

postgres 4711/4711
\t          deadbeef [unknown] ([unknown])
\t          deadbeef [unknown] ([unknown])
\t          deadbeef [unknown] ([unknown])
\t          10cafe _IO_file_seekoff@@GLIBC_2.2.5 (/usr/lib/x86_64-linux-gnu/libc.so.6)
"""


def test_perf_script_folds_every_sample_and_marks_what_has_no_name() -> None:
    folded = fold_perf_script(PERF_SCRIPT.splitlines(keepends=True))
    assert folded.total == 4  # four sample headers, four samples, whatever their stacks
    assert folded.counts == {
        (
            4711,
            "PostgresMain;postgres+0x34b06c;__send;entry_SYSCALL_64_after_hwframe_[k];"
            "__schedule_[k]",
        ): 1,
        (4711, "PostgresMain;errfinish"): 1,
        (4700, "[no stack]"): 1,
        # A walk through code without frame pointers: one [unknown] for the run of them.
        (4711, "_IO_file_seekoff;[unknown]"): 1,
    }
    assert folded.user_frames == 7 and folded.unknown_user_frames == 2


SYSTEM_WIDE = """\
postgres 100/100 PERF_RECORD_FORK(200:200):(100:100)
pgbench 300/300
\t          1234 threadRun (/usr/lib/postgresql/15/bin/pgbench)
postgres 200/200
\t          472bf6 PostgresMain (/usr/lib/postgresql/15/bin/postgres)
postgres 200/200 PERF_RECORD_EXIT(200:200):(200:200)
sh 400/400 PERF_RECORD_FORK(200:200):(400:400)
sh 200/200
\t          1234 main (/usr/bin/dash)
postgres 100/100
\t          3f0c65 PostmasterMain (/usr/lib/postgresql/15/bin/postgres)
"""


def test_system_wide_folding_keeps_the_process_tree_only() -> None:
    """A backend forked during the recording is kept; pgbench is not; after the backend
    exits, a stranger reusing its PID is not."""
    tree = ProcessTree({100}, postmaster=100)
    folded = fold_perf_script(SYSTEM_WIDE.splitlines(keepends=True), tree)
    assert folded.counts == {(200, "PostgresMain"): 1, (100, "PostmasterMain"): 1}
    assert folded.other == 2
    assert tree.seen == {100, 200} and tree.members == {100}


@pytest.mark.parametrize(
    ("title", "role"),
    [
        ("/usr/lib/postgresql/15/bin/postgres -D /srv/data", "postmaster"),
        ("postgres: walwriter ", "walwriter"),
        ("postgres: checkpointer", "checkpointer"),
        ("postgres: background writer", "bgwriter"),
        ("postgres: logger", "logger"),
        ("postgres: main: autovacuum worker bench", "autovacuum"),
        ("postgres: bench bench [local] SELECT", "backend"),
        ("postgres: walwriter_fan db 127.0.0.1(5000) idle", "backend"),
    ],
)
def test_process_roles_from_titles(title: str, role: str) -> None:
    assert process_role(title) == role


def test_offcpu_keys_and_states() -> None:
    key = "4711,2,\n    __schedule+1560\n    io_schedule+70\n,\n\t7f0c2e9b10f4 0x7f0c2e9b10f4 ([unknown])\n\t55d6a1b3c2a1 0x55d6a1b3c2a1 ([unknown])\n"  # noqa: E501
    pid, state, kernel, user = fold_offcpu_key(key)
    assert (pid, state) == (4711, 2)
    assert kernel == ["__schedule", "io_schedule"]
    assert user == [0x7F0C2E9B10F4, 0x55D6A1B3C2A1]
    assert [state_name(s) for s in (0, 0x100, 1, 2, 0x402)] == [
        "runnable",
        "runnable",
        "sleep",
        "blocked",
        "runnable",
    ]


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc")
def test_symbolizer_names_exported_functions_of_a_live_process() -> None:
    """Our own interpreter: the address of libc's `getpid` must come back as that name."""
    import ctypes

    libc = ctypes.CDLL(None)
    address = ctypes.cast(libc.getpid, ctypes.c_void_p).value
    assert address is not None
    name, known = AddressSymbolizer.of_process(os.getpid()).frame(address)
    assert known and name in {"getpid", "__getpid"}, name
    assert AddressSymbolizer.of_process(os.getpid()).frame(8) == ("[unknown]", False)


def profile(kind: str, stacks: dict[str, int], label: str = "") -> Profile:
    return Profile(
        kind, {("backend", None, tuple(s.split(";"))): v for s, v in stacks.items()}, label
    )


def test_shares_split_and_kernel_locks() -> None:
    p = profile(
        "cpu",
        {
            "main;PostgresMain;ExecScan": 60,
            "main;PostgresMain;write;pipe_write_[k];__mutex_lock.constprop.0_[k]": 30,
            "main;PostgresMain;write;pipe_write_[k]": 10,
        },
    )
    top = {f.name: f for f in top_functions(p, 10, "self")}
    assert top["ExecScan"].self_share == 0.6
    assert top["__mutex_lock.constprop.0_[k]"].self_share == 0.3
    total = {f.name: f for f in top_functions(p, 10, "total")}
    assert total["PostgresMain"].total_share == 1.0
    assert total["pipe_write_[k]"].total_share == 0.4
    split = kernel_user_split(p)
    assert (split.kernel, split.user, split.kernel_share) == (40, 60, 0.4)
    locks = kernel_lock_share(p)
    assert locks.share == 0.3 and locks.functions == [("__mutex_lock", 30)]


def test_differential_is_normalised_per_sample() -> None:
    # b is ten times longer, with the same shape except that errfinish appeared.
    a = profile("cpu", {"main;Exec": 100}, "none")
    b = profile("cpu", {"main;Exec": 800, "main;errfinish;write": 200}, "all")
    diff = differential(a, b)
    grew = {d.name: d for d in diff.grew}
    shrank = {d.name: d for d in diff.shrank}
    assert set(grew) == {"errfinish", "write"} and grew["errfinish"].total_delta == 0.2
    assert shrank["Exec"].total_delta == pytest.approx(-0.2)
    assert "main" not in grew and "main" not in shrank  # 100% in both

    tree = diff_flame_tree(a, b)
    assert tree["value"] == 1000 and tree["delta"] == 0
    (backend,) = tree["children"]
    (main,) = backend["children"]
    kids = {c["name"]: c for c in main["children"]}
    assert kids["errfinish"]["delta"] == 200 and kids["Exec"]["delta"] == -200
    plain = flame_tree(b)
    assert plain["value"] == 1000 and plain["children"][0]["name"] == "backend"


def test_wait_sites_and_folded_text() -> None:
    p = Profile(
        "offcpu",
        {
            ("backend", "blocked", ("PostgresMain", "XLogFlush", "fdatasync", "do_fsync_[k]")): 7,
            ("backend", "sleep", ("PostgresMain", "secure_read", "postgres+0x1", "epoll_wait")): 3,
            ("walwriter", "sleep", ("libc.so.6+0x85e96", "futex_wait_[k]")): 1,
        },
    )
    sites = wait_sites(p)
    assert sites[0][:2] == ("XLogFlush > fdatasync", 7)
    assert sites[1][:2] == ("secure_read > epoll_wait", 3)
    assert sites[2][:2] == ("[no user stack]", 1)
    text = folded_text(p)
    assert (
        text.splitlines()[0] == "backend;[blocked];PostgresMain;XLogFlush;fdatasync;do_fsync_[k] 7"
    )
    assert sum(int(line.rsplit(" ", 1)[1]) for line in text.splitlines()) == p.total


@pytest.mark.tracing
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("perf") is None, reason="needs root and perf")
def test_folding_real_perf_output_keeps_every_sample(tmp_path: Path) -> None:
    """A real recording of a busy shell loop: perf's own sample count equals the folded one."""
    data = tmp_path / "perf.data"
    subprocess.run(
        ["perf", "record", "-q", "-e", "cpu-clock", "-F", "499", "-g", "-o", str(data), "--",
         "sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"],
        check=True, capture_output=True,
    )  # fmt: skip
    script = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "comm,pid,tid,ip,sym,dso"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    count = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "pid"], check=True, capture_output=True, text=True
    )
    expected = len(count.stdout.split())
    folded = fold_perf_script(script.stdout.splitlines(keepends=True))
    assert expected > 20 and folded.total == expected
    assert any(stack.endswith("_[k]") or "sh" in stack for _, stack in folded.counts)
