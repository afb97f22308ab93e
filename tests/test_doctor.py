"""`pgscope doctor` and the USDT probe reader, on this machine's real binaries."""

from __future__ import annotations

import json
from pathlib import Path

from pgscope.collect.elfprobes import list_probes
from pgscope.target.pgbin import PgBinaries
from tests.cli import pgscope


def test_probes_are_read_from_the_stripped_server_binary(pg: PgBinaries) -> None:
    probes = list_probes(pg.path("postgres"))
    names = {p.name for p in probes}
    assert {p.provider for p in probes} == {"postgresql"}
    # The probes the checkpoint and lock field cases rely on.
    assert {
        "checkpoint__start",
        "checkpoint__done",
        "buffer__sync__start",
        "lwlock__wait__start",
        "lwlock__wait__done",
        "lock__wait__start",
    } <= names
    wait_start = next(p for p in probes if p.name == "lwlock__wait__start")
    # PG 15: (const char *tranche_name, LWLockMode mode): an 8-byte pointer, a 4-byte int.
    sizes = [arg.split("@")[0] for arg in wait_start.arguments.split()]
    assert sizes == ["8", "4"] or sizes == ["8", "-4"], wait_start.arguments


def test_a_binary_without_probes_has_none(tmp_path: Path) -> None:
    assert list_probes(Path("/bin/true")) == []
    not_elf = tmp_path / "x"
    not_elf.write_text("#!/bin/sh\n")
    assert list_probes(not_elf) == []


def test_doctor_json_reports_each_capability(pg: PgBinaries) -> None:
    result = pgscope("doctor", "--json")
    assert result.returncode == 0, result.stderr
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert {
        "root",
        "postgresql",
        "pgbench",
        "usdt probes",
        "bpftrace",
        "perf",
        "tracefs",
        "server account",
        "pg_wait_sampling",
    } <= set(checks)
    assert checks["postgresql"]["ok"] and str(pg.bindir) in checks["postgresql"]["detail"]
    count = len(list_probes(pg.path("postgres")))
    assert checks["usdt probes"]["ok"] and f"{count} USDT probes" in checks["usdt probes"]["detail"]
    for check in checks.values():
        if not check["ok"]:
            assert check["fix"], f"{check['name']} is missing but doctor gives no fix"


def test_doctor_explains_a_missing_postgresql(tmp_path: Path) -> None:
    result = pgscope("doctor", "--json", "--pg-bin", str(tmp_path))
    assert result.returncode == 0
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert not checks["postgresql"]["ok"]
    assert "postgres not found there" in checks["postgresql"]["detail"]
    assert "apt-get install postgresql" in checks["postgresql"]["fix"]
    text = pgscope("doctor", "--pg-bin", str(tmp_path))
    assert "MISSING" in text.stdout and "fix: apt-get install postgresql" in text.stdout
