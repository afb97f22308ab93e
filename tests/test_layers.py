"""The layers hold: import-linter's contracts (.importlinter), and no import cycle between any
two modules of pgscope, type-only imports included. No server: these run in seconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).parent.parent
BIN = Path(sys.executable).parent


def test_import_contracts_are_kept() -> None:
    result = subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_no_module_imports_itself_through_others() -> None:
    graph = grimp.build_graph("pgscope", exclude_type_checking_imports=False, cache_dir=None)
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                cycles.append(" -> ".join((module, *back)))
    assert not cycles, "\n".join(cycles[:10])


def test_the_cycle_check_sees_a_type_only_cycle(tmp_path: Path) -> None:
    """The check above is not vacuous: a cycle hidden behind TYPE_CHECKING is found."""
    package = tmp_path / "cyclic"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cyclic import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cyclic import a\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        graph = grimp.build_graph("cyclic", exclude_type_checking_imports=False, cache_dir=None)
    finally:
        sys.path.remove(str(tmp_path))
    assert graph.find_shortest_chain(importer="cyclic.b", imported="cyclic.a") is not None
