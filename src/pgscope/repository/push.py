"""A run's store copied into the repository: every declared table, and the analysis.

One push is one transaction on the repository. A finished run goes in one push, and is
then complete: pushing it again sends nothing (`open_run` says so, under a lock that makes a
second, concurrent push of it wait and then find it done). An observation still running goes
in instalments (`observe --push`), each one transaction that brings the repository from where
the last stopped to the store as it is now, and the last (final) one makes it complete. A
push killed midway leaves nothing: its transaction never committed, and the next push starts
again from the last one that did.

Where each push stopped is the repository's to say (`runs.watermarks`, written in the same
transaction as the rows): the store's rowid, per table, up to which its rows are in. A
store's tables only grow (DuckDB gives a row the next rowid when it commits, and a store
never deletes one), but for those whose rows change after they are written (`Table.updated`:
the run, its steps, collectors and windows), which each push sends whole, in place of what an
earlier one sent. The one other change a store makes in place, the memory sampler naming
waits it wrote by number (collect/sampling/activitymem.py), travels as an event (`wait-names`) that
the push applies to the rows already in the repository.

Rows travel as CSV that DuckDB's own writer makes, through a FIFO in a private folder (the one
folder a confined store may write in), into `COPY ... FROM STDIN`: nothing lands on a disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import select
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.copy import QueuedLibpqWriter
from psycopg.types.json import Json, Jsonb

from pgscope import __version__, leftovers, tables
from pgscope.errors import InputFileError, TargetError
from pgscope.labels import listed_run
from pgscope.repository import schema
from pgscope.store import RunStore

FIFO_READ = 1 << 20  # bytes read from DuckDB's CSV at a time
SCRATCH_PREFIX = f"{leftovers.PREFIX}push-"
SAY_ROWS = 100_000  # a table at least this long is named as it is copied
WAIT_NAMES = "wait-names"  # the event the memory sampler writes when it names waits late


@dataclass(frozen=True)
class Server:
    """The server a run measured, as the repository files it."""

    server_id: int
    system_identifier: int | None
    host: str
    port: int | None


@dataclass(frozen=True)
class Pushed:
    run_id: str
    state: str  # "pushed" (now complete), "sent" (an instalment), "already" (nothing sent)
    rows: int
    tables: int
    seconds: float
    through_step: int | None
    server: Server


def server_id(system_identifier: int | None, host: str, port: int | None) -> int:
    """A server's key: the same on every host and every push (no round trip to allocate it),
    a positive bigint. A system identifier alone is not one server: a physical standby
    shares its primary's, and pgscope's throw-away clusters are copies of one initdb."""
    text = f"{system_identifier or ''}|{host}|{port or ''}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def server_of(run: dict[str, Any]) -> Server:
    """The server of a store's run row: its own identity (store version 7), else what an
    older store knows (the connection string's host and port; this host for a cluster
    pgscope started or a Unix socket)."""
    host, port = run.get("server_host"), run.get("server_port")
    if not host:
        conninfo = run.get("target_conninfo") or ""
        try:
            params = conninfo_to_dict(conninfo) if "=" in conninfo else {}
        except psycopg.ProgrammingError:
            params = {}
        host = str(params.get("host") or params.get("hostaddr") or "")
        port = port or (int(str(params["port"])) if str(params.get("port", "")).isdigit() else None)
        if not host or host.startswith("/"):
            try:
                host = str(json.loads(run.get("host_json") or "{}").get("hostname") or "")
            except (ValueError, AttributeError):
                host = ""
        host = host or "unknown"
    system_identifier = run.get("system_identifier")
    return Server(server_id(system_identifier, str(host), port), system_identifier, str(host), port)


class StoreReader:
    """The store's base tables, read in one snapshot: their highest rowid, and their rows
    after a rowid as CSV for COPY (each line led by the run's two repository keys)."""

    def __init__(self, db: duckdb.DuckDBPyConnection, scratch: Path) -> None:
        self.db = db
        self.scratch = scratch  # a private folder DuckDB may write in (its FIFOs)
        self.catalog = tables.catalog_of(db)
        self.columns = tables.stored_columns(db)

    def holds(self, t: tables.Table) -> bool:
        return t.name in self.columns

    def source(self, t: tables.Table) -> str:
        return f'{self.catalog}.main."{t.name}"'

    def last_rowid(self, t: tables.Table) -> int:
        row = self.db.execute(f"SELECT max(rowid) FROM {self.source(t)}").fetchone()
        return -1 if row is None or row[0] is None else int(row[0])

    def count(self, t: tables.Table, after: int, upto: int) -> int:
        row = self.db.execute(
            f"SELECT count(*) FROM {self.source(t)} WHERE rowid > ? AND rowid <= ?",
            [after, upto],
        ).fetchone()
        return 0 if row is None else int(row[0])

    def span(self, tables_: list[tables.Table]) -> tuple[int, int] | None:
        """The first and last time (epoch µs) of the series' rows, None without any."""
        lows, highs = [], []
        for t in tables_:
            assert t.series is not None
            row = self.db.execute(
                f'SELECT min("{t.series}"), max("{t.series}") FROM {self.source(t)}'
            ).fetchone()
            if row is not None and row[0] is not None:
                lows.append(int(row[0]))
                highs.append(int(row[1]))
        return (min(lows), max(highs)) if lows else None

    def months(self, t: tables.Table, lo: int, hi: int) -> list[int]:
        """The first microsecond of each UTC month a series has rows in, from `lo` to `hi`."""
        assert t.series is not None
        rows = self.db.execute(
            f"SELECT DISTINCT epoch_us(date_trunc('month', make_timestamp(\"{t.series}\"))) "
            f'FROM {self.source(t)} WHERE "{t.series}" BETWEEN ? AND ?',
            [lo, hi],
        ).fetchall()
        return sorted(int(r[0]) for r in rows)

    def csv_stream(
        self, t: tables.Table, keys: tuple[int, int], after: int, upto: int
    ) -> Generator[bytes, None, None]:
        """The rows after rowid `after` up to `upto`, as CSV lines `server_id,run_key,col,...`
        that DuckDB's own CSV writer makes (a string quoted where it must be, an empty one
        "", NULL nothing; doubles exact, `inf`, `nan`; a column the store predates NULL),
        through a FIFO in the scratch folder: nothing lands on a disk. Close the iterator to
        stop early: DuckDB's write then fails, and its thread ends."""
        have = self.columns[t.name]
        selected = ", ".join(
            [f"{keys[0]}::BIGINT", f"{keys[1]}::BIGINT"]
            + [
                f'"{c.name}"' if c.name in have else f'CAST(NULL AS {c.type}) AS "{c.name}"'
                for c in t.columns
            ]
        )
        fifo = self.scratch / f"{t.name}-{secrets.token_hex(6)}.csv"
        os.mkfifo(fifo, 0o600)
        target = "'" + str(fifo).replace("'", "''") + "'"
        failed: list[BaseException] = []

        def write() -> None:
            # The same connection, in this push's snapshot: the reading thread does not use
            # it meanwhile.
            try:
                self.db.execute(
                    f"COPY (SELECT {selected} FROM {self.source(t)} WHERE rowid > {after} "
                    f"AND rowid <= {upto}) TO {target} (FORMAT csv, HEADER false)"
                )
            except BaseException as exc:  # raised in the reading thread
                failed.append(exc)

        # Opened before the writer starts, without waiting for it: a writer that fails before
        # it opens the FIFO leaves no reader waiting forever.
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        writer = threading.Thread(target=write, name="pgscope-push-csv", daemon=True)
        writer.start()
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while True:
                ready = poller.poll(100)
                try:
                    data = os.read(fd, FIFO_READ)
                except BlockingIOError:
                    if ready or writer.is_alive():
                        continue
                    break  # the writer ended without opening the FIFO
                if data:
                    yield data
                elif ready or not writer.is_alive():
                    break  # end of file: the writer closed it (Linux reports no hang-up
                    # on a FIFO that no writer has opened yet)
        finally:
            os.close(fd)  # a writer still writing gets EPIPE and stops
            writer.join()
            fifo.unlink()
        if failed:
            raise failed[0]

    def wait_names(self, after: int, upto: int) -> list[tuple[str, str, str]]:
        """Waits the memory sampler named after writing them by number, from its events."""
        if "events" not in self.columns:
            return []
        found: list[tuple[str, str, str]] = []
        for (detail,) in self.db.execute(
            f'SELECT detail FROM {self.catalog}.main."events" WHERE kind = ? '
            "AND rowid > ? AND rowid <= ?",
            [WAIT_NAMES, after, upto],
        ).fetchall():
            try:
                found += [(str(k), str(n), str(e)) for k, n, e in json.loads(detail)]
            except (TypeError, ValueError):
                continue
        return found


def month_starts(lo_us: int, hi_us: int) -> list[int]:
    """The first microsecond of every UTC month from the one of `lo_us` to the one of `hi_us`."""
    t = time.gmtime(lo_us / 1e6)
    year, month = t.tm_year, t.tm_mon
    end = time.gmtime(hi_us / 1e6)
    starts = []
    while (year, month) <= (end.tm_year, end.tm_mon):
        starts.append(int(_epoch(year, month) * 1_000_000))
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return starts


def _epoch(year: int, month: int) -> int:
    import calendar

    return calendar.timegm((year, month, 1, 0, 0, 0, 0, 0, 0))


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    """A private folder for the CSV FIFOs of a push (give it to `RunStore.open(writable=)`:
    the one folder a confined store may write in), marked as this process's: a push killed
    before it removed its folder leaves it for the next push (or run, or `doctor --clean`)
    to remove."""
    parent = Path(tempfile.gettempdir())
    for leftover in leftovers.find([parent]):
        if leftover.path.name.startswith(SCRATCH_PREFIX) and not leftover.servers:
            leftovers.remove(leftover)
    folder = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=parent))
    try:
        leftovers.claim(folder)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def push(
    repo: psycopg.Connection[Any],
    store: RunStore,
    *,
    scratch: Path,
    document: dict[str, Any] | None,
    final: bool,
    say: Callable[[str], None] = lambda _: None,
) -> Pushed:
    """Bring the repository up to `store` as it is now, in one transaction on `repo` (an
    autocommit session, schema checked for writing). `scratch`: a private folder DuckDB may
    write in (`scratch()`). `final`: the run is over and `document` is its analysis; the run
    is then complete in the repository. Not final: an instalment of a run still being
    written (no document needed)."""
    begun = time.monotonic()
    db = store.db
    reader = StoreReader(db, scratch)
    if "run" not in reader.columns:
        raise InputFileError(f"{store.run_dir}: the run store has no run table")
    db.execute("BEGIN TRANSACTION")  # one snapshot of the store for the whole push
    try:
        run = RunStore(db, store.run_dir).query(f"SELECT * FROM {reader.source(tables.of('run'))}")
        if not run:
            raise InputFileError(f"{store.run_dir}: the run store has no run record")
        run_id = str(run[0]["run_id"])
        server = server_of(run[0])
        present = [t for t in schema.store_tables() if reader.holds(t)]
        last = {t.name: reader.last_rowid(t) for t in present}
        series = [t for t in present if t.series is not None]
        span = reader.span(series)
        _partitions(repo, reader, series)
        listing = _listing(store, run_id, document, final)
        # Which months the run's series rows fall in: what prune asks before dropping one.
        listing["series_from_us"], listing["series_to_us"] = span or (None, None)
        try:
            with repo.transaction():
                row = repo.execute(
                    "SELECT * FROM pgscope.open_run(%s, %s, %s, %s, %s)",
                    [server.server_id, server.system_identifier, server.host, server.port, run_id],
                ).fetchone()
                assert row is not None
                run_key, state, marks = int(row[0]), str(row[1]), dict(row[2] or {})
                if state == "complete":
                    return Pushed(run_id, "already", 0, 0, 0.0, None, server)
                keys = (server.server_id, run_key)
                sent = copied = 0
                for t in present:
                    after = -1 if t.updated else int(marks.get(t.name, -1))
                    if t.updated:
                        repo.execute(
                            "SELECT pgscope.clear_rows(%s, %s, %s)",
                            [server.server_id, run_key, t.name],
                        )
                    rows = _copy(repo, reader, t, keys, after, last[t.name], say, run_id)
                    sent += rows
                    copied += rows > 0
                renames = reader.wait_names(int(marks.get("events", -1)), last.get("events", -1))
                if renames:
                    kinds, numbers, names = (list(x) for x in zip(*renames, strict=True))
                    repo.execute(
                        "SELECT pgscope.rename_waits(%s, %s, %s, %s, %s)",
                        [server.server_id, run_key, kinds, numbers, names],
                    )
                through = _through_step(reader)
                repo.execute(
                    "SELECT pgscope.close_push(%s, %s, %s, %s, %s, %s, %s, %s)",
                    [
                        server.server_id,
                        run_key,
                        # Every table the store holds (so a run read back has the same ones),
                        # with its last rowid (unused for a table sent whole).
                        Jsonb(last),
                        Jsonb(listing),
                        None if document is None else Json(document),
                        through,
                        sent,
                        final,
                    ],
                )
        except psycopg.OperationalError as exc:
            raise TargetError(
                f"lost the repository while pushing {run_id}: {_one_line(exc)}; nothing of "
                f"this push was kept (the next one sends it again)"
            ) from None
        except psycopg.Error as exc:
            raise TargetError(
                f"the repository refused {run_id}: {_one_line(exc)}; nothing of this push was kept"
            ) from None
        return Pushed(
            run_id,
            "pushed" if final else "sent",
            sent,
            copied,
            time.monotonic() - begun,
            through,
            server,
        )
    finally:
        db.execute("ROLLBACK")  # only read: nothing to keep


def _partitions(
    repo: psycopg.Connection[Any], reader: StoreReader, series: list[tables.Table]
) -> None:
    """Every month a series has rows in has its partition, each made in a transaction of its
    own before the push's: a push holding its tables never waits for another's. Only months
    the repository makes partitions for (schema.PARTITION_FROM to a month ahead): rows of a
    store whose clock said 1970, or planted at 9e18 µs, go to the default partition, and a
    store's rows at two ends of the calendar do not make every month between them."""
    earliest = int(_epoch(*map(int, schema.PARTITION_FROM.split("-")[:2])) * 1_000_000)
    latest = int((time.time() + 28 * 86_400) * 1_000_000)
    for t in series:
        for start in reader.months(t, earliest, latest):
            try:
                repo.execute("SELECT pgscope.add_partition(%s, %s)", [t.name, start])
            except psycopg.Error as exc:
                raise TargetError(
                    f"the repository could not make {t.name}'s partition for "
                    f"{time.strftime('%Y-%m', time.gmtime(start / 1e6))}: {_one_line(exc)}"
                ) from None


def _copy(
    repo: psycopg.Connection[Any],
    reader: StoreReader,
    t: tables.Table,
    keys: tuple[int, int],
    after: int,
    upto: int,
    say: Callable[[str], None],
    run_id: str,
) -> int:
    rows = reader.count(t, after, upto)
    if rows == 0:
        return 0
    if rows >= SAY_ROWS:
        say(f"{run_id}: {t.name}, {rows:,} rows")
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
        sql.Identifier(schema.SCHEMA, t.name),
        sql.SQL(", ").join(sql.Identifier(n) for n in (*schema.KEY_COLUMNS, *t.column_names)),
    )
    # DuckDB writes the CSV from a thread of its own, psycopg sends it from another.
    with (
        repo.cursor() as cursor,
        cursor.copy(statement, writer=QueuedLibpqWriter(cursor)) as copy,
        contextlib.closing(reader.csv_stream(t, keys, after, upto)) as stream,
    ):
        for chunk in stream:
            copy.write(chunk)
    return rows


def _through_step(reader: StoreReader) -> int | None:
    """The last step that is over: a run's step measured, an observation's window closed
    (its figures in)."""
    if "steps" not in reader.columns:
        return None
    row = reader.db.execute(
        f"SELECT max(step_id) FROM {reader.catalog}.main.\"steps\" WHERE status <> 'running'"
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def _listing(
    store: RunStore, run_id: str, document: dict[str, Any] | None, final: bool
) -> dict[str, Any]:
    """What `runs --from` lists of the run: as `runs` lists a folder, from the store's summary
    and the analysis' verdict, with the findings' ids (a filter) and the versions. An
    instalment's run is still running (a folder's reads as interrupted: its writer is gone)."""
    run_dir = str(document["run_dir"]) if document else str(Path(store.run_dir).resolve())
    summary = RunStore(store.db, store.run_dir).summary()
    verdict = document.get("verdict") if document else None
    listed = listed_run(
        {"run_id": run_id, "run_dir": run_dir, **summary},
        verdict if isinstance(verdict, str) else None,
    )
    findings = (document or {}).get("findings") or []
    if not final and summary["status"] == "interrupted":
        listed["status"] = "running"
    listed["finding_ids"] = [str(f["id"]) for f in findings if isinstance(f, dict) and "id" in f]
    listed["store_version"] = _store_version(store)
    listed["pushed_by"] = __version__
    scale = listed.get("scale")
    listed["scale"] = scale if isinstance(scale, int) else None
    return listed


def _store_version(store: RunStore) -> int | None:
    rows = store.query("SELECT max(version) AS v FROM schema_info")
    return None if not rows or rows[0]["v"] is None else int(rows[0]["v"])


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
