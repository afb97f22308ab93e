"""The store's tables, declared once (pgscope.tables): the docs list them as declared, every
table the code writes is declared, and a store written before a column or a table existed
reads as the declarations say."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest

from pgscope import tables
from pgscope.duck import connect
from pgscope.errors import InputFileError
from pgscope.store import STORE_FILE, RunStore

ROOT = Path(__file__).parent.parent
SOURCE = ROOT / "src" / "pgscope"


def test_the_store_page_lists_every_table_as_declared() -> None:
    text = (ROOT / "docs" / "store.md").read_text()
    section = re.search(
        r"<!-- declared tables: begin -->\n(.*)<!-- declared tables: end -->", text, re.S
    )
    assert section, "docs/store.md lost its generated table list"
    assert section[1] == tables.markdown(), (
        "docs/store.md's table list differs from pgscope.tables: replace it with the output "
        "of `python -m pgscope.tables`"
    )


def test_every_table_the_code_writes_is_declared() -> None:
    written = set()
    for path in SOURCE.rglob("*.py"):
        code = path.read_text()
        # A store's table by its plain name (pgscope.x is the repository's, in PostgreSQL).
        written |= set(re.findall(r"INSERT (?:OR REPLACE )?INTO (\w+)\b(?!\.)", code))
        written |= set(re.findall(r"(?:store|writer|out)\.append\(\s*\"(\w+)\"", code))
    assert written, "the scan found no writes: its patterns are stale"
    assert written - set(tables.declared()) == set()


def test_every_table_whose_rows_the_code_changes_is_declared_updated() -> None:
    """A repository takes an unfinished run in instalments, a table from the last rowid it
    has, but a table declared `updated` whole each time: a table the code updates, or
    replaces rows of, must be declared so. The one exception: the memory sampler naming the
    waits it wrote by number, which it records as a `wait-names` event for the repository."""
    changed = set()
    for path in SOURCE.rglob("*.py"):
        code = path.read_text()
        changed |= set(
            re.findall(r"(?:UPDATE|INSERT OR REPLACE INTO|DELETE FROM) (\w+)\b(?!\.)", code)
        )
    assert "steps" in changed, "the scan found no updates: its patterns are stale"
    declared = {t.name for t in tables.declared().values() if t.updated}
    assert changed & set(tables.declared()) - declared == {"activity_samples"}
    renaming = (SOURCE / "collect" / "activitymem.py").read_text()
    assert '"wait-names"' in renaming and "UPDATE activity_samples" in renaming


def test_each_declaration_is_well_formed() -> None:
    for t in tables.declared().values():
        assert len(set(t.column_names)) == len(t.column_names), t.name
        assert all(c.since >= t.since for c in t.columns), t.name
        assert max(c.since for c in t.columns) <= tables.STORE_VERSION, t.name
    with pytest.raises(ValueError, match="type TEXTT"):
        tables.table("x", "run", "a TEXTT")


def _store_of_version_one(run_dir: Path) -> None:
    """A store as pgscope wrote it at store version 1: steps without the outcome columns (4)
    and the connection columns (5), no collectors table (2), no timeline.instance (3)."""
    run_dir.mkdir()
    with contextlib.closing(connect(str(run_dir / STORE_FILE))) as db:
        db.execute("CREATE TABLE schema_info (version INTEGER NOT NULL)")
        db.execute("INSERT INTO schema_info VALUES (1)")
        for t in (tables.of("run"), tables.of("steps"), tables.of("timeline")):
            old = [c for c in t.columns if c.since == 1]
            db.execute(f"CREATE TABLE {t.name} ({', '.join(c.ddl() for c in old)})")
        db.execute("INSERT INTO run (run_id, status, spec_json) VALUES ('old', 'complete', '{}')")
        db.execute(
            "INSERT INTO steps (step_id, variant, clients, repeat, status, tps) "
            "VALUES (1, 'base', 2, 1, 'ok', 100.0)"
        )
        db.execute("INSERT INTO timeline (step_id, ts_us, tps) VALUES (1, 1, 100.0)")


def test_a_store_of_version_one_reads_as_declared(tmp_path: Path) -> None:
    run_dir = tmp_path / "old"
    _store_of_version_one(run_dir)
    store = RunStore.open(run_dir)
    try:
        step = store.steps()[0]
        assert set(step) == set(tables.of("steps").column_names)
        assert step["succeeded"] is None and step["connection_ms"] is None
        assert step["tps"] == 100.0
        assert store.query("SELECT instance FROM timeline") == [{"instance": None}]
        assert store.query("SELECT * FROM collectors") == []  # a table it never had: empty
        assert store.has_table("steps") and not store.has_table("collectors")
    finally:
        store.close()


def test_a_view_in_place_of_a_table_is_never_read(tmp_path: Path) -> None:
    """A received store whose table is a view (it could call any function) is not read as a
    store at all; the temporary views pgscope shows the tables through are its own, and do
    not count as the store's."""
    run_dir = tmp_path / "planted"
    _store_of_version_one(run_dir)
    store = RunStore.open(run_dir)  # its own temporary views: read as usual
    store.close()
    with contextlib.closing(connect(str(run_dir / STORE_FILE))) as db:
        db.execute("ALTER TABLE run RENAME TO run_kept")
        db.execute("CREATE VIEW run AS SELECT * FROM run_kept")
    with pytest.raises(InputFileError, match="defines view run"):
        RunStore.open(run_dir)
