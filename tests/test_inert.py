"""Text from the database made inert before a terminal sees it: the function, and the console
every command writes through. No server."""

from __future__ import annotations

import io

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
