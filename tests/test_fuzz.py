"""Bad input, generated: no spec file and no command line makes pgscope print a traceback.
Every error is one line with an exit code from the documented table (docs/exit-codes.md).
Runs never start here: every fuzzed `run` gets --plan."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgscope.cli import main
from pgscope.errors import ExitCode, PgscopeError
from pgscope.spec import Spec, load_spec

CODES = {int(c) for c in ExitCode}
FIELDS = sorted(Spec.model_fields)
FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

scalars = st.one_of(
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.text(string.printable, max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.text(string.ascii_letters + "._", min_size=1, max_size=12), inner, max_size=3
        ),
    ),
    max_leaves=8,
)
keys = st.one_of(
    st.sampled_from(FIELDS), st.text(string.ascii_letters + "_-.", min_size=1, max_size=15)
)


def toml_value(value: Any) -> str:
    """TOML for the values above (strings as JSON strings, which TOML accepts)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def check_one_line(exc: PgscopeError) -> None:
    message = str(exc)
    assert message and "\n" not in message and "Traceback" not in message
    assert int(exc.exit_code) in CODES


@FUZZ
@given(st.dictionaries(keys, values, max_size=6))
def test_generated_spec_files_load_or_fail_in_one_line(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    path = tmp_path / "fuzz.toml"
    path.write_text("\n".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in document.items()))
    try:
        load_spec(str(path))
    except PgscopeError as exc:
        check_one_line(exc)


@FUZZ
@given(st.binary(max_size=400))
def test_arbitrary_bytes_as_a_spec_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "garbage.toml"
    path.write_bytes(content)
    try:
        load_spec(str(path))
    except PgscopeError as exc:
        check_one_line(exc)


RUN_OPTIONS = [
    "--clients",
    "--duration",
    "--warmup",
    "--repeats",
    "--scale",
    "--workload",
    "--script",
    "--init-sql",
    "--set",
    "--protocol",
    "--order",
    "--seed",
    "--action",
    "--collectors",
    "--pg-bin",
    "--results-dir",
    "--run-as",
    "--work-dir",
]
FLAGS = [
    *("--quick", "--no-collectors", "--no-xact-log", "--allow-writes", "--connect"),
    *("--json", "--debug"),
]
option_values = st.one_of(
    st.text(string.printable.strip(), max_size=12),
    st.sampled_from(
        [
            "0",
            "-1",
            "1,2,3",
            "1-4",
            "x",
            "1e9",
            "nan",
            "select-only",
            "work_mem=64MB",
            "shared_buffers=lots",
            "5:CHECKPOINT",
            ":",
            "@",
            "a@0",
        ]
    ),
)


@FUZZ
@given(
    st.sampled_from(["scaling", "logging", "nope", "x.toml", ""]),
    st.lists(st.tuples(st.sampled_from(RUN_OPTIONS), option_values), max_size=4),
    st.lists(st.sampled_from(FLAGS), max_size=2, unique=True),
)
def test_generated_run_command_lines(
    capsys: pytest.CaptureFixture[str],
    recipe: str,
    options: list[tuple[str, str]],
    flags: list[str],
) -> None:
    argv = [
        "run",
        *([recipe] if recipe else []),
        *[x for pair in options for x in pair],
        *[f for f in flags if f != "--debug"],
        "--plan",
    ]
    code = main(argv)
    captured = capsys.readouterr()
    assert code in CODES, (argv, code)
    assert "Traceback" not in captured.err, (argv, captured.err)
    if code != 0:
        errors = [ln for ln in captured.err.splitlines() if ln.strip()]
        assert len(errors) == 1 and errors[0].startswith("pgscope: error: "), (argv, errors)


@FUZZ
@given(
    st.sampled_from(
        [
            ["fit", "usl"],
            ["report"],
            ["recipes"],
            ["runs", "--results-dir"],
            ["compare"],
            ["doctor", "--pg-bin"],
            [],
        ]
    ),
    st.lists(option_values, max_size=3),
)
def test_generated_command_lines_of_the_other_commands(
    capsys: pytest.CaptureFixture[str], command: list[str], args: list[str]
) -> None:
    code = main([*command, *args])
    captured = capsys.readouterr()
    assert code in CODES, (command, args, code)
    assert "Traceback" not in captured.err, (command, args, captured.err)
    if code != 0:
        errors = [ln for ln in captured.err.splitlines() if ln.strip()]
        assert len(errors) == 1 and errors[0].startswith("pgscope: error: "), (
            command,
            args,
            errors,
        )
