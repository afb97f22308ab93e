"""scripts/setup.sh's own steps, run on folders laid out as the installs leave them. No network,
no server."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).parent.parent
SETUP = ROOT / "scripts" / "setup.sh"


def _functions(*names: str) -> str:
    """The shell functions `names` as setup.sh defines them."""
    lines, keep = [], False
    for line in SETUP.read_text().splitlines():
        keep = keep or any(line.startswith(f"{name}() {{") for name in names)
        if keep:
            lines.append(line)
        if keep and line == "}":
            keep = False
    return "\n".join(lines)


def test_the_duckdb_cli_folder_holds_only_a_duckdb_that_runs(tmp_path: Path) -> None:
    """Issue 30: .tools/duckdb-cli/site/bin/duckdb, the Python launcher pip's --target install
    writes, failed with ModuleNotFoundError. After setup's linking, the folder's one duckdb is
    the binary, and a folder installed before the fix is tidied too."""
    for folder in (tmp_path / "fresh", tmp_path / "installed-before"):
        binary = folder / "site" / "duckdb_cli" / "duckdb"
        binary.parent.mkdir(parents=True)
        binary.write_text("#!/bin/sh\necho 'v1.5.6 duckdb'\n")
        binary.chmod(0o755)
        launcher = folder / "site" / "bin" / "duckdb"
        launcher.parent.mkdir(parents=True)
        launcher.write_text("#!/usr/bin/python3\nfrom duckdb_cli.__main__ import main\n")
        launcher.chmod(0o755)
    script = (
        _functions("link_duckdb_cli", "tidy_duckdb_cli")
        + f'\nlink_duckdb_cli "{tmp_path / "fresh"}" requirements'
        + f'\ntidy_duckdb_cli "{tmp_path / "installed-before"}"\n'
    )
    subprocess.run(["bash", "-euo", "pipefail", "-c", script], check=True)
    for folder in (tmp_path / "fresh", tmp_path / "installed-before"):
        found = sorted(
            str(Path(root, name).relative_to(folder))
            for root, _, names in os.walk(folder)
            for name in names
            if name == "duckdb" and not Path(root, name).is_symlink()
        )
        assert found == ["site/duckdb_cli/duckdb"], found
    linked = tmp_path / "fresh" / "bin" / "duckdb"
    assert subprocess.run([linked], capture_output=True, text=True, check=True).stdout.startswith(
        "v1.5.6"
    )
