"""The bpftrace programs against the real binary's USDT notes, and the pure parts of the usdt
collector: argument layouts, checkpoint phase bounds, names, options. No tracing here."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgscope.collect import validate_options
from pgscope.collect.tracing.bpf import (
    PROGRAMS,
    Program,
    argument_problems,
    checkpoint_flags_text,
    checkpoint_phases,
    lock_type_name,
)
from pgscope.collect.tracing.elfprobes import UsdtProbe, list_probes
from pgscope.collect.tracing.usdthost import capability_problems
from pgscope.collect.tracing.usdtoptions import UsdtOptions
from pgscope.target.pgbin import PgBinaries


@pytest.fixture(scope="module")
def probes(pg: PgBinaries) -> list[UsdtProbe]:
    found = list_probes(pg.path("postgres"))
    if not found:
        pytest.skip(f"{pg.path('postgres')} has no USDT probes (built without --enable-dtrace)")
    return found


def test_every_program_reads_its_arguments_from_this_binary(probes: list[UsdtProbe]) -> None:
    for name, program in PROGRAMS.items():
        assert argument_problems(program, probes) == [], name


def test_every_probe_a_program_attaches_is_in_its_source() -> None:
    for program in PROGRAMS.values():
        source = program.source().read_text()
        for probe in program.probes:
            assert f"usdt:$1:postgresql:{probe}\n" in source or (
                f"usdt:$1:postgresql:{probe}," in source
            ), f"{program.file} does not attach {probe}"
        assert source.count("usdt:$1:postgresql:") == len(program.probes), program.file


def test_lwlock_probes_pass_the_tranche_name_then_the_mode(probes: list[UsdtProbe]) -> None:
    """PostgreSQL 13+: lwlock__wait__start/done(const char *tranche, LWLockMode mode). Every
    site passes a pointer, then a 4-byte mode (a register, or the constant LW_EXCLUSIVE)."""
    sites = [p.arguments.split() for p in probes if p.name == "lwlock__wait__done"]
    assert len(sites) >= 2
    for args in sites:
        assert args[0].startswith("8@"), args
        assert args[1] == "-4@$0" or args[1].startswith("4@%"), args


def test_checkpoint_done_arguments_are_rip_relative_so_no_program_reads_them(
    probes: list[UsdtProbe],
) -> None:
    """Why checkpoint.bt takes buffers written from buffer__sync__done instead."""
    reading = Program("x", "x.bt", {"checkpoint__done": {0: 4}})
    problems = argument_problems(reading, probes)
    assert len(problems) == 1 and "%rip-relative" in problems[0], problems
    assert PROGRAMS["checkpoint"].probes["checkpoint__done"] == {}


def test_argument_problems_name_missing_probes_and_wrong_sizes(
    probes: list[UsdtProbe],
) -> None:
    wrong = Program(
        "x", "x.bt", {"no__such__probe": {}, "lwlock__wait__done": {0: 4}, "wal__insert": {5: 1}}
    )
    problems = argument_problems(wrong, probes)
    assert "probe no__such__probe is missing" in problems
    assert any("lwlock__wait__done argument 0" in p and "not 4 bytes" in p for p in problems)
    assert "probe wal__insert has no argument 5" in problems


def test_phases_of_a_postgresql_15_checkpoint() -> None:
    """PG 14+ order: buffer__checkpoint__start comes before the SLRU steps. The numbers are
    one traced CHECKPOINT (ns of the monotonic clock)."""
    events = {
        "start": 966489820,
        "buffer_start": 968936626,
        "clog_start": 968953708,
        "clog_done": 969142480,
        "subtrans_start": 969241635,
        "subtrans_done": 969342984,
        "multixact_start": 969377749,
        "multixact_done": 969596648,
        "sync_start": 969891728,
        "sync_done": 996791066,
        "fsync_start": 996899979,
        "fsync_done": 1006060734,
        "done": 1007735569,
    }
    phases = checkpoint_phases(events)
    assert [p[0] for p in phases] == [
        "prepare",
        "clog",
        "subtrans",
        "multixact",
        "marking",
        "write",
        "sync",
        "finish",
    ]
    spans = {name: end - start for name, start, end in phases}
    assert spans["prepare"] == events["buffer_start"] - events["start"]
    assert spans["marking"] == events["sync_start"] - events["multixact_done"]
    assert spans["write"] == events["sync_done"] - events["sync_start"]
    assert spans["finish"] == events["done"] - events["fsync_done"]
    total = events["done"] - events["start"]
    assert 0.99 < sum(spans.values()) / total <= 1.0


def test_phases_of_an_older_order_and_of_a_checkpoint_with_nothing_to_write() -> None:
    """PG <= 13: the SLRU steps first, then buffer__checkpoint__start. And when no buffer is
    dirty, BufferSync returns before its probes: no marking, no write phase."""
    old = {
        "start": 0,
        "clog_start": 10,
        "clog_done": 20,
        "subtrans_start": 21,
        "subtrans_done": 25,
        "multixact_start": 26,
        "multixact_done": 30,
        "buffer_start": 40,
        "sync_start": 50,
        "sync_done": 90,
        "fsync_start": 91,
        "fsync_done": 95,
        "twophase_start": 96,
        "twophase_done": 97,
        "done": 100,
    }
    spans = {name: (start, end) for name, start, end in checkpoint_phases(old)}
    assert spans["prepare"] == (0, 10)
    assert spans["marking"] == (40, 50)
    assert spans["twophase"] == (96, 97)
    assert spans["finish"] == (97, 100)
    idle = {k: v for k, v in old.items() if k not in ("sync_start", "sync_done")}
    names = [name for name, _, _ in checkpoint_phases(idle)]
    assert "marking" not in names and "write" not in names and "sync" in names


def test_names_for_postgresql_numbers() -> None:
    assert checkpoint_flags_text(0x6C) == "immediate force wait"  # CHECKPOINT's own flags
    assert checkpoint_flags_text(0x105) == "shutdown immediate time"
    assert lock_type_name(5, 150000) == "transactionid"
    assert lock_type_name(4, 150000) == "tuple"
    assert lock_type_name(4, 120000) == "transactionid"  # before frozenid was inserted
    assert lock_type_name(42, 150000) == "type 42"


def test_options_default_to_the_cheap_programs_and_refuse_unknown_ones() -> None:
    assert UsdtOptions().program_names() == ["lwlock", "locks", "checkpoint"]
    assert UsdtOptions(programs=["io", "io"], lwlock_hold=True).program_names() == [
        "io",
        "lwlock_hold",
    ]
    assert validate_options("usdt", {"programs": ["io"]}) is None
    error = validate_options("usdt", {"programs": ["lwlocks"]})
    assert error is not None and "programs.0" in error
    assert validate_options("usdt", {"hz": 5}) is not None
    assert validate_options("usdt", {"programs": []}) is not None


def test_without_root_only_root_and_bpftrace_are_reported(tmp_path: Path) -> None:
    problems = capability_problems(False, None)
    assert problems[0].startswith("tracing needs root")
    assert all("tracefs" not in p for p in problems)
    empty = tmp_path / "postgres"
    empty.write_bytes(b"\x7fELF not really")
    as_root = capability_problems(True, empty)
    assert any("has no USDT probes" in p for p in as_root), as_root
