"""Bad input: each case is one line on stderr and a documented exit code, never a traceback."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pgscope.errors import ExitCode
from pgscope.target.pgbin import find_binaries
from tests.cli import one_line_error, pgscope


def test_help_and_version() -> None:
    result = pgscope("--help")
    assert result.returncode == 0 and "pgscope run scaling --quick" in result.stdout
    for command in ("run", "recipes", "runs", "report", "doctor", "fit", "fit usl"):
        sub = pgscope(*command.split(), "--help")
        assert sub.returncode == 0, (command, sub.stderr)
        assert "Usage:" in sub.stdout
    version = pgscope("--version")
    assert version.returncode == 0 and version.stdout.startswith("pgscope ")


def test_recipes_lists_one_line_each() -> None:
    result = pgscope("recipes")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert any(line.startswith("scaling ") for line in lines)
    shown = pgscope("recipes", "scaling")
    assert shown.returncode == 0 and "[quick]" in shown.stdout


def _bad_spec(tmp_path: Path, text: str) -> str:
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return str(path)


def _pg_bin_without_pgbench(tmp_path: Path) -> str:
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("postgres", "initdb"):
        (fake / name).symlink_to(find_binaries().path(name))
    return str(fake)


# Port 1 on loopback: nothing listens, the connection is refused at once.
UNREACHABLE = "host=127.0.0.1 port=1 dbname=x connect_timeout=3"


def _unreachable(command: str) -> tuple[Callable[[Path], list[str]], ExitCode, str]:
    """`command` against a server that cannot be reached: exit 5, before any run folder."""
    return (
        lambda t: [command, "--dsn", UNREACHABLE, "--results-dir", str(t / "r")],
        ExitCode.TARGET,
        "cannot connect to",
    )


CASES = {
    "unknown recipe": (
        lambda t: ["run", "nonesuch"],
        ExitCode.SPEC,
        "unknown recipe 'nonesuch'; available:",
    ),
    "malformed TOML": (
        lambda t: ["run", _bad_spec(t, "clients = [1,\n")],
        ExitCode.SPEC,
        "malformed TOML",
    ),
    "unknown setting in a variant": (
        lambda t: [
            "run",
            _bad_spec(
                t, "clients = [1,2,3]\nduration = 1\n[variants]\nx = {no_such_setting = 1}\n"
            ),
            "--results-dir",
            str(t / "r"),
        ],
        ExitCode.SPEC,
        "variant 'x': setting no_such_setting = '1': unrecognized configuration parameter",
    ),
    "client count of 0": (
        lambda t: ["run", "--clients", "0,1,2"],
        ExitCode.SPEC,
        "--clients: Input should be greater than or equal to 1 (got 0)",
    ),
    "client list garbage": (
        lambda t: ["run", "--clients", "two"],
        ExitCode.SPEC,
        "--clients 'two'",
    ),
    "a rate that is no rate": (
        lambda t: ["run", "capacity", "--rate", "20%,2x"],
        ExitCode.SPEC,
        "--rate: '2x' is not a rate: tps (2000), a share of the peak (20%), or a range",
    ),
    "an objective that is no objective": (
        lambda t: ["run", "capacity", "--slo", "p99<5"],
        ExitCode.SPEC,
        "--slo: 'p99<5' is not an objective: expected pNN<LATENCY",
    ),
    "an objective without rates": (
        lambda t: ["run", "scaling", "--slo", "p99<5ms", "--plan"],
        ExitCode.SPEC,
        "--slo: a latency objective is judged on open-loop steps, and this run has none",
    ),
    "no clients for the rates": (
        lambda t: ["run", "capacity", "--rate-clients", "0"],
        ExitCode.SPEC,
        "--rate-clients: Input should be greater than or equal to 1 (got 0)",
    ),
    "missing pgbench": (
        lambda t: ["run", "--pg-bin", _pg_bin_without_pgbench(t), "--results-dir", str(t / "r")],
        ExitCode.ENVIRONMENT,
        "pgbench not found in",
    ),
    "unreachable DSN": _unreachable("run"),
    "malformed DSN": (
        lambda t: ["run", "--dsn", "not a dsn", "--results-dir", str(t / "r")],
        ExitCode.USAGE,
        "--dsn: not a valid connection string",
    ),
    "DSN not UTF-8": (
        # `--dsn $'host=/tmp dbname=\xff'`: the byte reaches argv as a lone surrogate.
        lambda t: ["run", "--dsn", "host=/tmp dbname=\udcff", "--results-dir", str(t / "r")],
        ExitCode.USAGE,
        "--dsn: not a valid connection string: byte 0xff at position 17 is not UTF-8 text",
    ),
    "DSN not UTF-8, sample": (
        lambda t: ["sample", "--dsn", "dbname=\udcff", "--results-dir", str(t / "r")],
        ExitCode.USAGE,
        "--dsn: not a valid connection string: byte 0xff at position 7",
    ),
    "DSN file missing": (
        lambda t: ["run", "--dsn-file", str(t / "nope"), "--results-dir", str(t / "r")],
        ExitCode.SPEC,
        "nope: no such file",
    ),
    "DSN file empty": (
        lambda t: ["sample", "--dsn-file", _write(t / "dsn", b"\n"), "--results-dir", str(t)],
        ExitCode.USAGE,
        "the file is empty; expected a connection string",
    ),
    "DSN file not UTF-8": (
        lambda t: ["run", "--dsn-file", _write(t / "dsn", b"dbname=\xff\n"), "--plan"],
        ExitCode.USAGE,
        "/dsn: not a valid connection string: byte 0xff at position 7 is not UTF-8 text",
    ),
    "DSN and DSN file": (
        lambda t: ["run", "--dsn", "dbname=x", "--dsn-file", _write(t / "dsn", b"dbname=y")],
        ExitCode.USAGE,
        "--dsn and --dsn-file: give one of them",
    ),
    "sample without a server": (
        lambda t: ["sample", "--results-dir", str(t)],
        ExitCode.USAGE,
        "which server? give --dsn, --dsn-file or $PGSCOPE_DSN",
    ),
    "observe without a server": (
        lambda t: ["observe", "--results-dir", str(t)],
        ExitCode.USAGE,
        "which server? give --dsn, --dsn-file, $PGSCOPE_DSN, --data-dir or --pid",
    ),
    "observe with both --data-dir and --pid": (
        lambda t: ["observe", "--data-dir", str(t), "--pid", "1", "--results-dir", str(t)],
        ExitCode.USAGE,
        "--data-dir and --pid: give one of them",
    ),
    "observe a data directory that is none": (
        lambda t: ["observe", "--data-dir", str(t), "--results-dir", str(t / "r")],
        ExitCode.USAGE,
        "not a PostgreSQL data directory",
    ),
    "observe a process that is no server": (
        lambda t: ["observe", "--pid", str(os.getpid()), "--results-dir", str(t / "r")],
        ExitCode.TARGET,
        "is not a PostgreSQL server",
    ),
    "observe an unreachable DSN": _unreachable("observe"),
    "sample an unreachable DSN": _unreachable("sample"),
    "unknown option": (lambda t: ["run", "--colour"], ExitCode.USAGE, "No such option"),
    "missing argument": (lambda t: ["report"], ExitCode.USAGE, "Missing argument"),
    "not a run folder": (lambda t: ["report", str(t)], ExitCode.SPEC, "not a pgscope run folder"),
    "bad report format": (
        lambda t: ["report", str(t), "--format", "pdf"],
        ExitCode.USAGE,
        "--format 'pdf'",
    ),
    "json and html": (
        lambda t: ["report", str(t), "--json", "--format", "html"],
        ExitCode.USAGE,
        "choose one",
    ),
    "script missing": (
        lambda t: ["run", "--script", str(t / "nope.sql")],
        ExitCode.SPEC,
        "nope.sql: no such file",
    ),
    "script is a directory": (
        lambda t: ["run", "--plan", "--script", str(t)],
        ExitCode.SPEC,
        "is a directory, not a file",
    ),
    "negative script weight": (
        lambda t: ["run", "--plan", "--script", _select_one(t) + "@-3"],
        ExitCode.SPEC,
        "weight '-3' must be a whole number >= 1",
    ),
    "duration below a second": (
        lambda t: ["run", "--plan", "--duration", "1e-9"],
        ExitCode.SPEC,
        "--duration: must be at least 1 s",
    ),
    "reversed client range": (
        lambda t: ["run", "--plan", "--clients", "8-1"],
        ExitCode.SPEC,
        "the range '8-1' is reversed",
    ),
    "bad --set": (lambda t: ["run", "--set", "work_mem"], ExitCode.SPEC, "expected NAME=VALUE"),
    # A plan of ten million steps filled the memory (MemoryError, exit 1) before it said so.
    "too many steps": (
        lambda t: ["run", "--plan", "--clients", "1-10000", "--repeats", "1000"],
        ExitCode.SPEC,
        "the experiment has 10,000,000 steps (1 variant x 10000 client counts x 1000 "
        "repeats); at most 10,000 can run",
    ),
    # `fit` read /dev/zero until the memory ran out.
    "fit an endless binary file": (
        lambda t: ["fit", "usl", "/dev/zero"],
        ExitCode.SPEC,
        "/dev/zero: binary (a NUL byte), not a CSV file of measurements",
    ),
    "fit a file too large": (
        lambda t: ["fit", "usl", _write(t / "big.csv", b"1,100\n" * 800_000)],
        ExitCode.SPEC,
        "big.csv: more than 4 MiB; a CSV of measurements is a few lines",
    ),
    "fit a file that is not text": (
        lambda t: ["fit", "usl", _write(t / "x.csv", b"1,100\n2,\xff\xfe\n")],
        ExitCode.SPEC,
        "x.csv: not a CSV text file: byte 0xff at offset 8 is not UTF-8",
    ),
    "sslpassword with a service": (
        lambda t: ["run", "--plan", "--dsn", "service=app sslpassword=k3y"],
        ExitCode.USAGE,
        "--dsn: sslpassword with service=app: pgscope passes the SSL key's passphrase to "
        "pgbench in a service file of its own",
    ),
}


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _select_one(tmp_path: Path) -> str:
    script = tmp_path / "select.sql"
    script.write_text("SELECT 1;\n")
    return str(script)


NEEDS_SERVER = {"unknown setting in a variant"}  # the server's own parser judges settings


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.server) if c in NEEDS_SERVER else c for c in sorted(CASES)],
)
def test_bad_input_is_one_line_with_a_documented_code(case: str, tmp_path: Path) -> None:
    make_args, code, expected = CASES[case]
    result = pgscope(*make_args(tmp_path), timeout=120)
    assert result.returncode == code, (result.returncode, result.stderr)
    assert expected in one_line_error(result)


def test_results_folder_not_writable_fails_before_starting(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        target = "/proc/pgscope-results"  # even root cannot create folders in /proc
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        target = str(locked / "results")
    result = pgscope("run", "scaling", "--quick", "--results-dir", target)
    assert result.returncode == ExitCode.ENVIRONMENT
    assert "cannot create run folder" in one_line_error(result)


def test_exit_codes_are_documented() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "exit-codes.md").read_text()
    for code in ExitCode:
        assert f"| {int(code)} " in doc, f"exit code {int(code)} ({code.name}) not documented"


@pytest.mark.parametrize("command", ["run", "sample"])
def test_the_dsn_comes_from_a_file_or_the_environment_and_its_password_stays_hidden(
    command: str, tmp_path: Path
) -> None:
    """The server named by --dsn-file or $PGSCOPE_DSN is the one connected to (port 1: nothing
    listens), said where it came from, without the password; --dsn wins over the variable."""
    secret = "hunter2-in-a-file"
    dsn_file = tmp_path / "dsn"
    dsn_file.write_text(f"{UNREACHABLE} password={secret}\n")
    results = ["--results-dir", str(tmp_path / "r")]
    from_file = pgscope(command, "--dsn-file", str(dsn_file), *results, timeout=60)
    from_env = pgscope(command, *results, env={"PGSCOPE_DSN": f"{UNREACHABLE} user=envuser"})
    overridden = pgscope(
        command, "--dsn", f"{UNREACHABLE} user=flaguser", *results,
        env={"PGSCOPE_DSN": "host=/nonexistent user=envuser"},
    )  # fmt: skip
    for result, user in ((from_file, None), (from_env, "envuser"), (overridden, "flaguser")):
        assert result.returncode == ExitCode.TARGET, result.stderr
        message = one_line_error(result)
        assert "cannot connect to" in message and "port=1" in message
        assert user is None or f"user={user}" in message
        assert secret not in result.stderr + result.stdout
    # Refused before any run folder: a server never reached leaves no failed run behind.
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())
    if command == "run":
        assert f"· server from --dsn-file {dsn_file}: " in from_file.stderr
        assert "· server from $PGSCOPE_DSN: " in from_env.stderr
        assert "server from" not in overridden.stderr


def test_help_says_a_password_on_the_command_line_is_visible() -> None:
    for command in ("run", "sample"):
        shown = " ".join(pgscope(command, "--help").stdout.split())
        assert "--dsn-file" in shown and "$PGSCOPE_DSN" in shown, command
        assert "A password on the command line is visible to other users" in shown, command
        assert "PGPASSWORD, ~/.pgpass or a service file" in shown, command
