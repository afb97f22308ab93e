"""Lint, format and types are part of the suite, so CI enforces them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
BIN = Path(sys.executable).parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_lint_and_format() -> None:
    lint = run(str(BIN / "ruff"), "check", "src", "tests", "bench")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = run(str(BIN / "ruff"), "format", "--check", "src", "tests", "bench")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_mypy_strict_on_the_package() -> None:
    result = run(str(BIN / "mypy"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_commands_start_imports_no_heavy_library() -> None:
    """Every command pays for what the CLI imports before it runs: the command modules import
    numpy, DuckDB, psycopg, SciPy and plotly inside the commands that use them (`pgscope
    --version` took 1.1 s when they came at import, `runs --from` 1.2 s of which 26 ms was
    its query; 0.36 s without them)."""
    heavy = ("numpy", "duckdb", "psycopg", "scipy", "plotly", "pyarrow", "jinja2")
    code = f"import sys, pgscope.cli; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
