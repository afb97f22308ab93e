"""Text from the database made inert before a terminal or a spreadsheet sees it: the function,
the console every command writes through, and exported CSV. No server."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from rich.table import Table
from rich.text import Text

from pgscope.render.inert import InertConsole
from pgscope.words import inert


def test_text_from_the_database_is_inert() -> None:
    assert inert("a\x1b]0;owned\x07b\x9b2Jc\rd\x08e\u202ef") == (
        "a\\x1b]0;owned\\x07b\\x9b2Jc\\x0dd\\x08e\\u202ef"
    )
    assert inert("tab\tand\nnewline, ünïcode") == "tab\tand\nnewline, ünïcode"
    assert inert(inert("\x1b")) == inert("\x1b"), "escaping twice changes nothing more"


def test_the_console_writes_no_control_character_it_was_given() -> None:
    """Strings, rich Text and table cells alike: the console is the choke point."""
    out = io.StringIO()  # not a terminal: rich writes no escape of its own
    console = InertConsole(file=out, width=80)
    table = Table()
    table.add_column("query")
    table.add_row("SELECT 1 /* \x1b[2J */")
    console.print("[red]red[/red] \x1b]8;;http://x\x1b\\link\x9b1m :smile:")
    console.print(Text("raw \x1b[31m text"))
    console.print(table)
    written = out.getvalue()
    assert "\x1b" not in written and "\x9b" not in written, repr(written)
    assert "red \\x1b]8;;http://x\\x1b\\link\\x9b1m :smile:" in written
    assert "raw \\x1b[31m text" in written and "\\x1b[2J" in written


def test_exported_csv_has_no_formula_cell(tmp_path: Path) -> None:
    """A spreadsheet evaluates a cell that starts with = + - @ (or a tab or CR): text from the
    server (an application name `=HYPERLINK(...)`) is exported with a `'` before it; numbers,
    negative ones too, stay numbers."""
    import duckdb

    from pgscope.export import export_run
    from tests.stores import measured_run

    run_dir = measured_run(tmp_path / "run", [(1, 100.0), (2, 180.0)])
    db = duckdb.connect(str(run_dir / "run.duckdb"))
    try:
        db.execute(
            'UPDATE run SET command_line = \'=HYPERLINK("http://example.com","x")\', '
            "status_reason = '@SUM(1)', recipe = '-2+3', spec_source = chr(9) || 'tab'"
        )
        db.execute(
            "INSERT INTO events (ts_us, step_id, kind, detail) VALUES "
            "(-5, -5, '+cmd|'' /C calc''!A0', 'plain')"
        )
    finally:
        db.close()
    written = {w.table: w.path for w in export_run(run_dir, "csv", tmp_path / "csv")}
    cells = []
    for path in written.values():
        with path.open(newline="") as f:
            cells += [(path.stem, c) for row in csv.reader(f) for c in row]
    assert not [c for c in cells if c[1][:1] in ("=", "+", "@", "\t", "\r")], cells
    assert ("run", '\'=HYPERLINK("http://example.com","x")') in cells
    assert ("run", "'-2+3") in cells and ("events", "-5") in cells
    assert ("events", "'+cmd|' /C calc'!A0") in cells and ("events", "plain") in cells
