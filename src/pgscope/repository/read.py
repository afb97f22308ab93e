"""Runs read back from the repository: listed, their analysis, their store.

`runs --from` lists the repository's runs as `runs` lists a results folder (the same keys,
with the server each measured); `report --from` and `compare --from` render a run's analysis
as its push stored it (the summary.json its folder has: the same report, byte for byte);
`materialise` writes a run's tables back into a run store, for `pgscope pull` and for an
analysis made again by this pgscope (`report --from ... --reanalyse`).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgscope import tables
from pgscope.duck import STORAGE_VERSION, connect
from pgscope.errors import EnvironmentProblem, InputFileError, RefusedError, UsageError
from pgscope.files import make_private_folder
from pgscope.repository import schema
from pgscope.store import STORE_FILE
from pgscope.words import inert

# A run's id names its folder (results/<run-id>): one path component, of the characters
# pgscope's own ids are made of (a UTC time, the spec's safe name, four hex digits), led by
# a letter or digit: no "/", no "." or "..", nothing absolute, no NUL, no control character.
# A repository is data as a received folder is: an id from it becomes a path only once it
# is one of these (an absolute id made `pull` write run.duckdb wherever it named).
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")


def is_run_id(text: str) -> bool:
    """Whether `text` may name a run folder (RUN_ID)."""
    return RUN_ID.fullmatch(text) is not None


@dataclass(frozen=True)
class StoredRun:
    run_id: str
    server_id: int
    run_key: int
    state: str  # "open" (an observation still arriving) or "complete"
    watermarks: dict[str, int]
    series: tuple[int, int] | None  # the first and last time of its series' rows


def find_run(session: psycopg.Connection[Any], name: str) -> StoredRun:
    """A run by its id (a folder's name: `results/<run-id>` gives the id too). The id the
    repository returns is the one asked for, and a run id (RUN_ID), or refused: it becomes a
    folder's name."""
    run_id = Path(name).name if "/" in name else name
    if not is_run_id(run_id):
        raise UsageError(
            f"{inert(run_id)[:200]!r} is not a run id (letters, digits and . _ + -, as "
            f"`pgscope runs --from ...` lists them)"
        )
    rows = session.execute(
        "SELECT run_id, server_id, run_key, state, watermarks, series_from_us, series_to_us "
        "FROM pgscope.runs WHERE run_id = %s AND pushed_at IS NOT NULL",
        [run_id],
    ).fetchall()
    if not rows:
        raise InputFileError(
            f"{run_id}: no such run in the repository (`pgscope runs --from ...` lists them)"
        )
    if len(rows) > 1:
        raise UsageError(
            f"{run_id}: runs of {len(rows)} servers have this id in the repository; "
            f"report them from their folders"
        )
    r = rows[0]
    if not isinstance(r[0], str) or r[0] != run_id:
        raise RefusedError(
            f"{run_id}: the repository returned the run {inert(str(r[0]))[:200]!r} for it; "
            f"refused: a run's id becomes its folder's name"
        )
    span = None if r[5] is None else (int(r[5]), int(r[6]))
    return StoredRun(str(r[0]), int(r[1]), int(r[2]), str(r[3]), dict(r[4] or {}), span)


def document(session: psycopg.Connection[Any], run: StoredRun) -> dict[str, Any] | None:
    """The run's analysis, as pushed (its folder's summary.json); None before the last
    instalment of an observation still arriving."""
    row = session.execute(
        "SELECT document FROM pgscope.documents WHERE server_id = %s AND run_key = %s",
        [run.server_id, run.run_key],
    ).fetchone()
    if row is None:
        return None
    found = row[0]
    return found if isinstance(found, dict) else None


def materialise(session: psycopg.Connection[Any], run: StoredRun, run_dir: Path) -> Path:
    """The run's store, as its push found it, in a new run folder `run_dir`: every table the
    store held, its rows in the order the repository returns them. Returns `run_dir`."""
    if not is_run_id(run.run_id) or run_dir.name != run.run_id:
        raise RefusedError(
            f"{inert(run.run_id)[:200]!r}: not a run id to name a folder after; refused"
        )
    try:
        make_private_folder(run_dir)  # a pulled store holds the server's statement texts
    except FileExistsError:
        raise UsageError(f"{run_dir} exists: pull writes a new run folder") from None
    except OSError as exc:
        raise EnvironmentProblem(f"cannot create {run_dir}: {exc.strerror or exc}") from None
    held = [t for t in schema.store_tables() if t.name in run.watermarks]
    db = connect(str(run_dir / STORE_FILE), storage_version=STORAGE_VERSION)
    try:
        with _scratch(run_dir) as scratch:
            for t in held:
                db.execute(t.ddl())
                _copy_back(session, db, run, t, scratch / f"{t.name}.csv")
    finally:
        db.close()
    return run_dir


@contextlib.contextmanager
def _scratch(run_dir: Path) -> Iterator[Path]:
    """A private folder for the tables on their way (CSV from the repository into DuckDB)."""
    folder = Path(tempfile.mkdtemp(prefix=".pull-", dir=run_dir))
    try:
        yield folder
    finally:
        for name in os.listdir(folder):
            with contextlib.suppress(OSError):
                os.unlink(folder / name)
        with contextlib.suppress(OSError):
            folder.rmdir()


def _copy_back(
    session: psycopg.Connection[Any], db: Any, run: StoredRun, t: tables.Table, path: Path
) -> None:
    columns = sql.SQL(", ").join(sql.Identifier(n) for n in t.column_names)
    # By the run's key (a series' BRIN index), in the months of its series' rows only.
    within: sql.Composable = sql.SQL("")
    if t.series and run.series is not None:
        within = sql.SQL(" AND ({c} BETWEEN {lo} AND {hi} OR {c} IS NULL)").format(
            c=sql.Identifier(t.series), lo=sql.Literal(run.series[0]), hi=sql.Literal(run.series[1])
        )
    query = sql.SQL(
        "COPY (SELECT {} FROM {} WHERE server_id = {} AND run_key = {}{}) TO STDOUT (FORMAT csv)"
    ).format(
        columns,
        sql.Identifier(schema.SCHEMA, t.name),
        sql.Literal(run.server_id),
        sql.Literal(run.run_key),
        within,
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out, session.cursor() as cursor, cursor.copy(query) as copy:
        for data in copy:
            out.write(data)
    if path.stat().st_size:
        # PostgreSQL's CSV, read as it is written: no dialect guessed; "" an empty string,
        # nothing NULL; one reader, so the rows keep the repository's order.
        types = ", ".join(f"'{c.name}': '{c.type}'" for c in t.columns)
        quoted = "'" + str(path).replace("'", "''") + "'"
        db.execute(
            f'INSERT INTO "{t.name}" SELECT * FROM read_csv({quoted}, columns = {{{types}}}, '
            "auto_detect = false, header = false, delim = ',', quote = '\"', escape = '\"', "
            "allow_quoted_nulls = false, max_line_size = 1073741824, parallel = false)"
        )
    path.unlink()
