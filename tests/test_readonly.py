"""What could lift the read-only guard on a user's server, found in a script before any load;
the guard's place in the connection options. No server: these run in milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgscope.drive.readonly import READ_ONLY_OPTION, lifting_statement, with_read_only


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ("SELECT 1;\nbegin read   write;\n", 2, "READ WRITE"),
        ("START TRANSACTION ISOLATION LEVEL SERIALIZABLE, READ WRITE;\n", 1, "READ WRITE"),
        ("SET SESSION default_transaction_read_only TO off;\n", 1, "read-only setting"),
        ("SET transaction_read_only = off;\n", 1, "read-only setting"),
        ("SELECT pg_catalog.set_config('x', 'y', false);\n", 1, "set_config"),
        ("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY;\n", 1, "CHARACTERISTICS"),
        ("RESET ALL;\n", 1, "RESET ALL"),
        ("SELECT 1;\n\\setshell x echo 1\n", 2, "shell"),
    ],
)
def test_statements_that_lift_the_guard_are_found(
    tmp_path: Path, text: str, line: int, what: str
) -> None:
    script = tmp_path / "s.sql"
    script.write_text(text)
    why = lifting_statement(script)
    assert why is not None and f"s.sql line {line}:" in why and what in why, why


def test_reading_scripts_and_comments_pass(tmp_path: Path) -> None:
    script = tmp_path / "ok.sql"
    script.write_text(
        "\\set aid random(1, 100000)\n-- not READ WRITE: a comment\n"
        "/* set_config(\n in a block comment */\nSELECT abalance FROM pgbench_accounts "
        "WHERE aid = :aid;\nBEGIN READ ONLY;\nSELECT 1;\nEND;\n"
    )
    assert lifting_statement(script) is None


def test_the_guard_goes_last_in_the_options() -> None:
    assert with_read_only(None) == READ_ONLY_OPTION
    assert with_read_only("  ") == READ_ONLY_OPTION
    assert with_read_only("-c default_transaction_read_only=off") == (
        f"-c default_transaction_read_only=off {READ_ONLY_OPTION}"
    )


def test_a_script_in_another_encoding_is_read_not_a_crash(tmp_path: Path) -> None:
    """pgbench takes a script's bytes as they are: a Latin-1 comment used to end the check
    with UnicodeDecodeError (exit 1), and a lifting statement after it must still be found."""
    script = tmp_path / "latin1.sql"
    script.write_bytes("-- caf\xe9\nSELECT 'd\xe9j\xe0';\n".encode("latin-1"))
    assert lifting_statement(script) is None
    script.write_bytes("SELECT '\xe9';\nBEGIN READ WRITE;\n".encode("latin-1"))
    why = lifting_statement(script)
    assert why is not None and "latin1.sql line 2: a READ WRITE transaction" in why


def test_a_missing_grant_is_named_with_the_statement_that_gives_it() -> None:
    from pgscope.drive.pgbench import BUILTIN_PRIVILEGES
    from pgscope.errors import ExitCode
    from pgscope.target.server import missing_grants

    read = missing_grants("mon", {"pgbench_branches": ["SELECT"]}, "why")
    assert read.exit_code == ExitCode.TARGET
    assert str(read) == (
        "role mon cannot read pgbench_branches (why): GRANT SELECT ON pgbench_branches TO mon"
    )
    tpcb = missing_grants('"Odd Role"', BUILTIN_PRIVILEGES["tpcb-like"], "workload tpcb-like")
    assert str(tpcb) == (
        'role "Odd Role" lacks SELECT/UPDATE on pgbench_accounts, SELECT/UPDATE on '
        "pgbench_tellers, SELECT/UPDATE on pgbench_branches, INSERT on pgbench_history "
        "(workload tpcb-like): GRANT SELECT, UPDATE ON pgbench_accounts, pgbench_tellers, "
        'pgbench_branches TO "Odd Role"; GRANT INSERT ON pgbench_history TO "Odd Role"'
    )
