"""`pgscope doctor`: what this machine can do, and the fix for each missing piece."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from pgscope import leftovers
from pgscope.collect.tracing.elfprobes import list_probes
from pgscope.errors import EnvironmentProblem
from pgscope.proc import server_account
from pgscope.target.pgbin import PgBinaries, find_binaries

TRACEFS_PATHS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
APT_HINT = "apt-get install"
TESTED_MAJORS = (15, 16, 17, 18)  # the versions the suite runs (docs/versions.md)
# Rules whose facts come from pg_stat_statements and the per-table statistics only.
STATEMENT_RULES = "seq-scan, temp-spill, index-write-amplification, shared-buffers-small"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    needed_for: str = ""

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _version_of(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text and out.returncode == 0 else None


def tracefs_mount() -> Path | None:
    for path in TRACEFS_PATHS:
        if (path / "events").is_dir():
            return path
    return None


def collector_checks(pg_bin: Path | None) -> list[Check]:
    """Each collector's own verdict on this machine (for an embedded target)."""
    from pgscope.collect import registry
    from pgscope.collect.base import CollectorEnv

    try:
        pg = find_binaries(pg_bin)
    except EnvironmentProblem:
        return []
    env = CollectorEnv(pg, "embedded", None, os.geteuid() == 0)
    checks = []
    for name, cls in registry().items():
        verdict = cls.check(env)
        default = "on by default in runs" if cls.default_in_runs else "on request"
        checks.append(
            Check(
                f"collector {name}",
                verdict.ok,
                f"{cls.summary} ({default}; cost: {cls.cost})" if verdict.ok else verdict.reason,
                "" if verdict.ok else verdict.reason,
                f"collector {name}",
            )
        )
    return checks


def version_checks(pg: PgBinaries) -> list[Check]:
    """What this PostgreSQL version and installation give pgscope, and what not, and why
    (docs/versions.md is the same table for every version)."""
    major = pg.major_version()
    tested = major in TESTED_MAJORS
    checks = [
        Check(
            "version",
            tested,
            f"PostgreSQL {major}: tested"
            if tested
            else f"PostgreSQL {major} is not one pgscope is tested on "
            f"({', '.join(map(str, TESTED_MAJORS))}): views may have moved (docs/versions.md)",
            "" if tested else "pass --pg-bin DIR of PostgreSQL 15, 16, 17 or 18",
            "statistics read as documented",
        ),
        Check(
            "checkpoint counters",
            True,
            "pg_stat_checkpointer (PostgreSQL 17 moved them from pg_stat_bgwriter)"
            if major >= 17
            else "pg_stat_bgwriter",
            needed_for="checkpoint findings' counts",
        ),
        Check(
            "WAL writes, fsyncs",
            True,
            "pg_stat_io, object wal (PostgreSQL 18 moved them from pg_stat_wal)"
            if major >= 18
            else "pg_stat_wal",
            needed_for="counters per step",
        ),
        Check(
            "backend writes",
            True,
            "pg_stat_io (PostgreSQL 17 took buffers_backend out of pg_stat_bgwriter)"
            if major >= 17
            else "pg_stat_bgwriter.buffers_backend",
            needed_for="counters per step",
        ),
        Check(
            "wait event names",
            True,
            "PostgreSQL 17 renamed some (IO:WALSync is IO:WalSync ...): read under the "
            "names of 15 and 16, which the rules use (analyze/wait_names.toml)"
            if major >= 17
            else "as the rules name them",
            needed_for="wait-based findings",
        ),
    ]
    control = pg.sharedir() / "extension" / "pg_stat_statements.control"
    checks.append(
        Check(
            "pg_stat_statements",
            control.is_file(),
            str(control)
            if control.is_file()
            else f"not in this installation ({control} missing): no statement or table "
            f"facts, so {STATEMENT_RULES} are not assessed",
            ""
            if control.is_file()
            else f"a PostgreSQL {major} with its contrib extensions "
            f"({APT_HINT} postgresql-contrib on Debian)",
            "statement and table findings",
        )
    )
    return checks


def leftover_check(clean: bool, work_dirs: list[Path]) -> Check:
    """Directories (and servers) a killed run left in the temporary or work folders."""
    where = [Path(tempfile.gettempdir()), *work_dirs]
    found = leftovers.find(where)
    places = ", ".join(str(p) for p in dict.fromkeys(where))
    if not found:
        return Check("leftovers", True, f"none of killed runs in {places}")
    listed = "; ".join(f.describe() for f in found)
    if clean:
        for leftover in found:
            leftovers.remove(leftover)
        return Check("leftovers", True, f"removed {len(found)}: {listed}")
    return Check(
        "leftovers",
        False,
        f"{len(found)} left by killed runs: {listed}",
        "pgscope doctor --clean (stops their servers, then deletes them; the next run does too)",
        "disk space, free ports",
    )


def run_checks(
    pg_bin: Path | None = None, clean: bool = False, work_dirs: list[Path] | None = None
) -> list[Check]:
    checks: list[Check] = []
    is_root = os.geteuid() == 0
    checks.append(
        Check(
            "root",
            is_root,
            "running as root" if is_root else f"running as uid {os.geteuid()}",
            "" if is_root else "run as root (sudo) for tracing and profiling",
            "usdt tracing, perf profiles",
        )
    )
    postgres: Path | None = None
    try:
        pg = find_binaries(pg_bin)
        postgres = pg.path("postgres")
        checks.append(
            Check(
                "postgresql",
                True,
                f"{pg.version()} in {pg.bindir} (found via {pg.how_found})",
                needed_for="embedded clusters",
            )
        )
        checks.append(
            Check(
                "pgbench",
                pg.has("pgbench"),
                str(pg.bindir / "pgbench"),
                "" if pg.has("pgbench") else f"{APT_HINT} postgresql-client",
                "all load",
            )
        )
        checks.extend(version_checks(pg))
        control = pg.sharedir() / "extension" / "pg_wait_sampling.control"
        checks.append(
            Check(
                "pg_wait_sampling",
                control.is_file(),
                str(control) if control.is_file() else "extension not installed",
                ""
                if control.is_file()
                else f"{APT_HINT} postgresql-{pg.major_version()}-pg-wait-sampling",
                "second wait-event source (optional)",
            )
        )
    except EnvironmentProblem as exc:
        checks.append(
            Check(
                "postgresql",
                False,
                str(exc),
                f"{APT_HINT} postgresql postgresql-contrib",
                "embedded clusters",
            )
        )
    try:
        account = server_account(None)
        checks.append(
            Check(
                "server account",
                True,
                f"PostgreSQL runs as {account.name}",
                needed_for="embedded clusters",
            )
        )
    except EnvironmentProblem as exc:
        checks.append(
            Check(
                "server account", False, str(exc), "useradd --system postgres", "embedded clusters"
            )
        )
    if postgres is not None:
        try:
            probes = list_probes(postgres)
        except OSError as exc:
            probes = []
            detail = f"cannot read {postgres}: {exc.strerror}"
        else:
            guarded = sum(1 for p in probes if p.semaphore)
            detail = f"{len(probes)} USDT probes in {postgres}" + (
                f" ({guarded} behind semaphores)" if guarded else ""
            )
        checks.append(
            Check(
                "usdt probes",
                bool(probes),
                detail,
                ""
                if probes
                else "use a PostgreSQL built with --enable-dtrace "
                "(Debian's and PGDG's packages are)",
                "usdt tracing: LWLock and lock wait times, checkpoint phases (without it: "
                "sampled wait shares, checkpoints counted by the server)",
            )
        )
    bpftrace = shutil.which("bpftrace")
    version = _version_of([bpftrace, "--version"]) if bpftrace else None
    checks.append(
        Check(
            "bpftrace",
            version is not None,
            version or "not installed",
            "" if version else f"{APT_HINT} bpftrace",
            "usdt tracing, off-CPU",
        )
    )
    perf = shutil.which("perf")
    version = _version_of([perf, "--version"]) if perf else None
    checks.append(
        Check(
            "perf",
            version is not None,
            version or "not installed",
            "" if version else f"{APT_HINT} linux-perf",
            "CPU profiles",
        )
    )
    mount = tracefs_mount()
    checks.append(
        Check(
            "tracefs",
            mount is not None,
            f"mounted at {mount}" if mount else "not mounted",
            "" if mount else "mount -t tracefs nodev /sys/kernel/tracing",
            "usdt tracing, perf",
        )
    )
    checks.extend(collector_checks(pg_bin))
    paranoid = Path("/proc/sys/kernel/perf_event_paranoid")
    if paranoid.is_file():
        level = paranoid.read_text().strip()
        ok = is_root or (re.fullmatch(r"-?\d+", level) is not None and int(level) <= 1)
        checks.append(
            Check(
                "perf_event_paranoid",
                ok,
                f"level {level}",
                "" if ok else "sysctl kernel.perf_event_paranoid=1, or run as root",
                "CPU profiles",
            )
        )
    checks.append(leftover_check(clean, work_dirs or []))
    return checks
