"""A run store's last words on a full disk (issue 27): the room a session keeps is given back
for its status, even after a checkpoint that failed for want of room has invalidated the
database. On a small tmpfs, no server: a second or two."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from pgscope.store import RESERVE_FILE, RunMeta, RunStore
from tests.servers import tmpfs


def filled(store: RunStore) -> duckdb.Error:
    """Rows from a collector's cursor until the disk takes no more; the error it met."""
    writer = store.writer()
    writer.db.execute("CREATE TABLE rows (a BIGINT, b VARCHAR)")
    for i in range(100_000):
        try:
            writer.db.execute(
                "INSERT INTO rows SELECT range, md5(range::VARCHAR) FROM range(?, ?)",
                [i * 1000, (i + 1) * 1000],
            )
        except duckdb.Error as exc:
            return exc
    raise AssertionError("the disk never filled")


@pytest.mark.parametrize("checkpoint", ["fails", "never runs"])
def test_the_status_is_written_after_the_disk_filled(tmp_path: Path, checkpoint: str) -> None:
    """ "fails": the write-ahead log is checkpointed every MB, and the checkpoint the full
    disk refuses invalidates the database (DuckDB: "reopen the database instance"), which is
    opened again for the last words. "never runs": a commit itself is refused."""
    with tmpfs(tmp_path / "small", "8m") as mount:
        run_dir = mount / "run"
        meta = RunMeta("run", "observe", "", "", "{}", "pgscope observe", "0", "server", "x", {})
        store = RunStore.create(run_dir, meta)
        store.reserve()
        assert (run_dir / RESERVE_FILE).stat().st_size == 2 << 20
        size = "1MB" if checkpoint == "fails" else "1TB"
        store.db.execute(f"SET wal_autocheckpoint = '{size}'")
        error = filled(store)
        assert "No space left on device" in str(error), error
        if checkpoint == "fails":
            with pytest.raises(duckdb.Error, match="invalidated"):
                store.db.execute("SELECT 1")
        assert store.last_writes(lambda s: s.finish_run("stopped", "the results disk is full"))
        assert not (run_dir / RESERVE_FILE).exists()
        store.close()
        read = RunStore.open(run_dir)  # the disk still full: the log is replayed in memory
        try:
            run = read.run_row()
            rows = read.query("SELECT count(*) AS n FROM rows")[0]["n"]
        finally:
            read.close()
    assert (run["status"], run["status_reason"]) == ("stopped", "the results disk is full")
    assert rows > 0  # what was committed before is kept
