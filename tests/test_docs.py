"""The docs against the CLI: every command and flag README.md and docs/*.md name exists (each
command's own --help shows it), and the version numbers the docs give are the code's. No
server."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import pgscope.cli  # noqa: F401  (registers every command on the app)
from pgscope.cli.app import app

ROOT = Path(__file__).parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Flags the docs quote on their own from other programs, never as pgscope's.
OTHER_PROGRAMS_FLAGS = {
    "--enable-dtrace": "PostgreSQL's configure (USDT probes)",
    "--failures-detailed": "pgbench",
    "--show-task-events": "bpftrace",
    "--usdt-file-activation": "bpftrace",
}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# pgscope and its words, where a line runs it: at its start, or after a shell's `$`, a pipe,
# `&&`, `;` or a wrapper (`taskset -c 0 pgscope run ...`); not "role pgscope cannot ...".
INVOCATION = re.compile(
    r"(?:^|\$ |[|;&] *|taskset -c \S+ |flock \S+ )pgscope((?: +[a-z][\w.-]*)*)(.*)"
)


def _commands() -> dict[tuple[str, ...], Any]:
    """Every command path of the CLI (() is pgscope itself) and its click command."""

    def walk(command: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, (*path, name))

    return dict(walk(typer.main.get_command(app), ()))


COMMANDS = _commands()


def _code(text: str) -> list[str]:
    """The code in a markdown file, a line at a time: fenced blocks (continued lines joined)
    and inline spans; make's RUN_ARGS as the `pgscope run` arguments they are."""
    blocks = re.findall(r"```[^\n]*\n(.*?)```", text, re.S)
    lines = [line for b in blocks for line in b.replace("\\\n", " ").splitlines()]
    lines += re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return [re.sub(r'RUN_ARGS="([^"]*)"', r"pgscope run \1", line) for line in lines]


def _documented() -> tuple[set[tuple[str, tuple[str, ...], str]], set[tuple[str, str]]]:
    """(file, command path, flag) for each pgscope invocation in the docs (flag "" for the
    command itself), and (file, flag) for each flag quoted on its own."""
    invoked: set[tuple[str, tuple[str, ...], str]] = set()
    alone: set[tuple[str, str]] = set()
    for doc in DOCS:
        for line in _code(doc.read_text()):
            code = line.split(" # ")[0].strip()
            found = INVOCATION.search(code)
            if found is None:
                if code.startswith("--"):  # a flag quoted on its own: `--allow-writes`
                    alone |= {(doc.name, flag) for flag in FLAG.findall(code)}
                continue
            words = found[1].split()
            if not words and not found[2].startswith(" -"):
                continue  # "pgscope: error: ...", pgscope's output
            path: tuple[str, ...] = ()
            while words and (*path, words[0]) in COMMANDS:  # the rest are arguments
                path = (*path, words.pop(0))
            if words and not path:
                path = ("?" + words[0],)  # names no command
            invoked.add((doc.name, path, ""))
            invoked |= {(doc.name, path, flag) for flag in FLAG.findall(found[1] + found[2])}
    return invoked, alone


def _help(path: tuple[str, ...]) -> str:
    shown = CliRunner().invoke(app, [*path, "--help"], terminal_width=200)
    assert shown.exit_code == 0, (path, shown.output)
    return shown.output


def test_every_documented_command_and_flag_is_in_its_help() -> None:
    invoked, alone = _documented()
    assert len({path for _, path, _ in invoked}) >= 10, "the docs' invocations were not found"
    helps = {path: _help(path) for path in COMMANDS}
    wrong = []
    for doc, path, flag in sorted(invoked):
        if path not in COMMANDS:
            wrong.append(f"{doc}: pgscope {path[0][1:]}: no such command")
        elif flag and flag != "--help" and not re.search(rf"{flag}(?![\w-])", helps[path]):
            wrong.append(f"{doc}: pgscope {' '.join(path)} {flag}: not in its --help")
    every_flag = {flag for text in helps.values() for flag in FLAG.findall(text)}
    for doc, flag in sorted(alone):
        if flag not in every_flag and flag not in OTHER_PROGRAMS_FLAGS:
            wrong.append(f"{doc}: {flag}: no pgscope command has it")
    assert not wrong, "\n".join(wrong)


def test_a_flag_that_does_not_exist_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a doc naming a flag or a command pgscope lacks."""
    planted = "Try `pgscope report RUN --pdf` or `pgscope frobnicate`; `--no-such-flag`.\n"
    real_read = Path.read_text

    def read(self: Path, *args: Any, **kwargs: Any) -> str:
        text = real_read(self, *args, **kwargs)
        return text + planted if self.name == "README.md" else text

    monkeypatch.setattr(Path, "read_text", read)
    with pytest.raises(AssertionError) as caught:
        test_every_documented_command_and_flag_is_in_its_help()
    message = str(caught.value)
    assert "pgscope report --pdf: not in its --help" in message
    assert "pgscope frobnicate: no such command" in message
    assert "--no-such-flag: no pgscope command has it" in message


def test_the_versions_the_docs_give_are_the_codes() -> None:
    from pgscope.analyze.model import DOCUMENT_VERSION
    from pgscope.duck import STORAGE_VERSION
    from pgscope.tables import STORE_VERSION as SCHEMA_VERSION

    store_md = (ROOT / "docs" / "store.md").read_text()
    said = re.search(r"the schema version, currently (\d+)", store_md)
    assert said and int(said[1]) == SCHEMA_VERSION, (said and said[0], SCHEMA_VERSION)
    assert "DuckDB 1.0's storage format" in store_md and STORAGE_VERSION == "v1.0.0"
    json_md = (ROOT / "docs" / "json.md").read_text()
    said = re.search(r"Schema version (\d+) is the JSON form", json_md)
    assert said and int(said[1]) == DOCUMENT_VERSION
    assert f"| `schema_version` | `{DOCUMENT_VERSION}` |" in json_md


def test_start_here_names_both_ways_to_a_diagnosis() -> None:
    """`pgscope --help` opens with the commands a new user starts from: a sweep of pgscope's
    own load (`run`) and a user's server's own workload (`observe`, which issue 30 found
    missing), each a command that exists."""
    from pgscope.cli.app import HELP

    start = HELP.split("Start here:", 1)[1]
    named = re.findall(r"^\s+pgscope ([a-z]+)", start, re.M)
    assert {"run", "observe", "sample", "doctor"} <= set(named), named
    assert all((name,) in COMMANDS for name in named), named


def test_the_quick_sweep_takes_the_same_time_wherever_it_is_said() -> None:
    """Issue 30: "3-minute" (--help), "2 min 30 s" (README), "under 4 minutes" (the recipe),
    3 min 10 s measured. Each place now says "about N minutes", N the plan's own estimate of
    `run scaling --quick` rounded up (set-up comes on top)."""
    import json
    import math

    from pgscope.cli.app import HELP

    result = CliRunner().invoke(app, ["run", "scaling", "--quick", "--plan", "--json"])
    assert result.exit_code == 0, result.output
    minutes = math.ceil(json.loads(result.stdout)["estimated_seconds"] / 60)
    said = {
        "--help": HELP,
        "README.md": (ROOT / "README.md").read_text(),
        "scaling.toml": (ROOT / "src/pgscope/recipes/scaling.toml").read_text(),
    }
    for where, text in said.items():
        quick = [line for line in text.splitlines() if "quick" in line]
        figures = re.findall(r"about (\d+) minutes", " ".join(quick))
        assert figures == [str(minutes)], (where, quick)


def test_the_wait_samplers_cost_is_one_figure_everywhere() -> None:
    """Issue 30: doctor said 0.15 ms per sample, observe.md 0.115 (sql) and 0.040 (memory).
    The figures docs/observe.md measured are the ones doctor (the collector's cost) and
    `observe --help` state."""
    from pgscope.collect.sampling.activity import ActivityCollector

    text = " ".join((ROOT / "docs" / "observe.md").read_text().split())
    memory = re.search(r"\*\*(\d\.\d+) ms of CPU per sample", text)
    sql = re.search(r"Same run: (\d\.\d+) ms per sample", text)
    assert memory and sql, "docs/observe.md no longer states both sources' cost"
    observe_help = " ".join(
        CliRunner().invoke(app, ["observe", "--help"], terminal_width=200).stdout.split()
    )
    for figure in (memory[1], sql[1]):
        assert f"{figure} ms" in ActivityCollector.cost, ActivityCollector.cost
        assert f"{figure} ms" in observe_help, observe_help
    assert re.findall(r"\d\.\d+ ms", ActivityCollector.cost) == [f"{sql[1]} ms", f"{memory[1]} ms"]
