"""What could lift the read-only guard on a user's server, found in a script before any load,
by reading it as pgbench and the server do; the guard's place in the connection options; text
from the database made inert for a terminal. No server: these run in milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgscope.drive.readonly import lifting_statement, with_read_only
from pgscope.drive.scriptlex import decode_unicode, read_script
from pgscope.labels import READ_ONLY_OPTION


def _judged(
    tmp_path: Path, text: str, protocol: str = "prepared", name: str = "s.sql"
) -> str | None:
    script = tmp_path / name
    script.write_text(text)
    return lifting_statement([script], protocol)


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
    why = _judged(tmp_path, text)
    assert why is not None and f"s.sql line {line}:" in why and what in why, why


# The red team's six scripts that wrote rows through the text filter (issue 27), and where
# each is found now.
RED_TEAM = {
    "comment-split READ WRITE": (
        "BEGIN READ/**/WRITE;\nINSERT INTO hits VALUES (1);\nEND;\n",
        1,
        "a READ WRITE transaction",
    ),
    "Unicode-escaped identifier": (
        'SET U&"default\\005ftransaction_read_only" = off;\nINSERT INTO hits VALUES (1);\n',
        1,
        "a change of the read-only setting",
    ),
    "DO block with a built string": (
        "DO $$ BEGIN EXECUTE 'SET default_transaction_read' || '_only = off'; END $$;\n"
        "INSERT INTO hits VALUES (1);\n",
        1,
        "a DO block, whose code cannot be judged",
    ),
    "comment-split SESSION CHARACTERISTICS": (
        "SET SESSION/**/CHARACTERISTICS AS TRANSACTION READ/**/WRITE;\n"
        "INSERT INTO hits VALUES (1);\n",
        1,
        "SET SESSION CHARACTERISTICS",
    ),
    "gset then SET :g": (
        "SELECT 'default_transaction_' || 'read_only' AS g \\gset\n"
        "SET :g = off;\nINSERT INTO hits VALUES (1);\n",
        2,
        ":g, which \\gset (s.sql line 1) can set to any text a query returns",
    ),
    "shell hidden between quoted comment marks": (
        "SELECT '/*';\n\\shell touch MARKER\nSELECT '*/';\n",
        2,
        "a shell command (\\shell)",
    ),
}


@pytest.mark.parametrize("form", sorted(RED_TEAM))
def test_the_red_teams_scripts_are_found(tmp_path: Path, form: str) -> None:
    """Under the simple protocol, where each of them wrote rows as the old text filter let
    it through."""
    text, line, what = RED_TEAM[form]
    why = _judged(tmp_path, text, "simple")
    assert why is not None and why.startswith(f"s.sql line {line}: {what}"), why


@pytest.mark.parametrize(
    ("text", "what"),
    [
        # The escape character a UESCAPE clause names, comments between.
        ("SET U&\"default!005ftransaction_read_only\" /* x */ UESCAPE '!' TO off;\n", "read-only"),
        ('SET "transaction_read_only" = off;\n', "read-only"),
        ("SELECT E'\\x64efault_transaction_read_only';\n", "read-only"),
        ("SELECT \"set_config\"('a', 'b', false);\n", "set_config"),
        ("SELECT 1 \\; begin/*\n*/read--\nwrite;\n", "READ WRITE"),
        ("SELECT 1; \\shell id\n", "shell"),
        ("SELECT 1;\n\\SETSHELL v id\n", "shell"),
        ("SELECT 1;\n\\ \\\nshell id\n", "shell"),  # spaces and a continuation before its name
        ("SELECT query_to_xml('SELECT 1', true, true, '');\n", "query_to_xml()"),
        ("SELECT * FROM ts_stat('SELECT 1');\n", "ts_stat()"),
        ("CREATE OR REPLACE FUNCTION f() RETURNS int AS 'SELECT 1' LANGUAGE sql;\n", "body"),
        ("SET standard_conforming_strings = off;\n", "reads the script's text"),
        ("SET NAMES 'SJIS';\n", "reads the script's text"),
    ],
)
def test_what_spelling_hides_is_found(tmp_path: Path, text: str, what: str) -> None:
    why = _judged(tmp_path, text)
    assert why is not None and what in why, (text, why)


def test_reading_scripts_comments_and_quoted_text_pass(tmp_path: Path) -> None:
    script = (
        "\\set aid random(1, 100000)\n-- not READ WRITE: a comment\n"
        "/* set_config( /* nested */ still a comment: \\shell */\nSELECT abalance FROM "
        "pgbench_accounts WHERE aid = :aid;\nBEGIN READ ONLY;\nSELECT 1;\nEND;\n"
        "SELECT 'read write', E'it\\'s \\\\shell', $q$ ; \\shell $x$ $q$, \"read\" \"write\";\n"
        "SELECT 1::int, max(aid) AS m FROM pgbench_accounts \\gset\n"
        "SELECT abalance FROM pgbench_accounts WHERE aid = :m;\n"
    )
    assert _judged(tmp_path, script) is None
    assert _judged(tmp_path, script, "extended") is None


def test_a_variable_a_query_set_is_pasted_only_by_the_simple_protocol(tmp_path: Path) -> None:
    """pgbench pastes a variable's text into SQL under the simple protocol, quotes and comments
    included; extended and prepared send it as a value. Variables are the client's: one
    script's \\gset fills another's :name. A prefix limits the names it sets."""
    (tmp_path / "set.sql").write_text("SELECT 'x' AS p_a \\gset p_\n")
    (tmp_path / "use.sql").write_text("SELECT ':p_a /* in a string */';\nSELECT :other;\n")
    scripts = [tmp_path / "set.sql", tmp_path / "use.sql"]
    why = lifting_statement(scripts, "simple")
    assert why is not None and why.startswith("use.sql line 1: :p_a, which \\gset (set.sql line 1)")
    assert lifting_statement(scripts, "prepared") is None
    assert lifting_statement(scripts, "extended") is None
    (tmp_path / "use.sql").write_text("SELECT :other;\n")
    assert lifting_statement(scripts, "simple") is None  # not one of p_'s names


def test_the_lexer_reads_commands_as_pgbench_does() -> None:
    commands = read_script(
        "SELECT 'a;b' AS x, $t$ \\x $t$ \\gset pre\n"
        "/* 1 /* 2 */ 3 */ SELECT U&'\\0041' UESCAPE '\\';\n"
        "\\set n 1 \\\n + 2\nSELECT \\:n\n"
    )
    assert [(c.line, c.meta) for c in commands] == [
        (1, None),
        (1, "gset"),
        (2, None),
        (3, "set"),
        (5, None),
    ]
    assert [t.text for t in commands[0].tokens] == ["select", "a;b", "as", "x", ",", " \\x "]
    assert commands[1].args == "pre"
    assert [t.text for t in commands[2].tokens] == ["select", "A"]
    assert commands[3].args == "n 1 \\\n + 2"
    assert commands[4].variables() == ["n"], "pgbench sends \\: as a colon"
    assert decode_unicode("d\\+000061t\\\\a") == "dat\\a"


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
    assert lifting_statement([script], "prepared") is None
    script.write_bytes("SELECT '\xe9';\nBEGIN READ WRITE;\n".encode("latin-1"))
    why = lifting_statement([script], "prepared")
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
