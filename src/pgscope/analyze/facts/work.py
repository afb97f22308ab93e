"""Facts about the work itself, per cell: which statements took the execution time and how they
did it (rows, blocks, temp files, WAL), and what the tables went through (sequential scans,
dead rows, index writes, buffer misses). From the `statements` section of the analysis; the
statement facts need pg_stat_statements, the table facts only the statistics views.

Each fact names the statement (id and normalised text) or the table it is about in its label,
and the table in its name's last part where a rule names it (`scan.seq_rows.<table>`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, fields

from pgscope.analyze.facts import CellFacts, FactKind, FactSheet, Family
from pgscope.analyze.statements import (
    BLOCK_BYTES,
    TABLE_GAUGES,
    SeqFilter,
    StatementStep,
    TableStep,
)
from pgscope.words import n_clients, plain

# A statement touching this many blocks (8 kB) per row it returns reads far more than it
# gives: a lookup by index touches 3-5 (the tree's levels and the heap page).
SCAN_BLOCKS_PER_ROW = 100
SOURCES = ("statements",)
PGSS = "pg_stat_statements (the statements collector)"
TABLES = "the statements collector (table statistics)"
PLANS = (
    "the statements collector's EXPLAIN of generic plans (embedded clusters), or the explain "
    "collector's (other servers)"
)

SEQ_FILTER = FactKind(
    "plan.seq_filter.<table>",
    "share",
    "the busiest statement whose generic plan filters a table by a sequential scan: its share "
    "of the statements' execution time",
    PLANS,
    SOURCES,
)
TOP_SHARE = FactKind(
    "stmt.top_share",
    "share",
    "the busiest statement's share of the statements' execution time",
    PGSS,
    SOURCES,
)
TOP_ROWS_PER_CALL = FactKind(
    "stmt.top.rows_per_call",
    "count",
    "rows returned or changed per call of the busiest statement",
    PGSS,
    SOURCES,
)
TOP_BLOCKS_PER_ROW = FactKind(
    "stmt.top.blocks_per_row",
    "count",
    "shared blocks touched per row of the busiest statement (a lookup by index touches 3-5)",
    PGSS,
    SOURCES,
)
# A statement run this often per transaction, returning a few rows each time, is an
# application fetching row by row what one statement could fetch at once (N+1).
REPEATED_MIN_SHARE = 0.10
REPEATED_CALLS = FactKind(
    "stmt.repeated.calls_per_xact",
    "count",
    "calls per transaction of the statement run most often per transaction, of those holding "
    f"≥{REPEATED_MIN_SHARE:.0%} of the execution time",
    PGSS,
    SOURCES,
)
REPEATED_ROWS = FactKind(
    "stmt.repeated.rows_per_call",
    "count",
    "rows returned or changed per call of that statement",
    PGSS,
    SOURCES,
)
REPEATED_SHARE = FactKind(
    "stmt.repeated.share",
    "share",
    "that statement's share of the statements' execution time",
    PGSS,
    SOURCES,
)
SCAN_HEAVY = FactKind(
    "stmt.scan_heavy_share",
    "share",
    f"execution time in statements touching ≥{SCAN_BLOCKS_PER_ROW} blocks per row they return",
    PGSS,
    SOURCES,
)
TEMP_SHARE = FactKind(
    "stmt.temp_share",
    "share",
    "execution time in statements that write temporary files",
    PGSS,
    SOURCES,
)
TEMP_PER_CALL = FactKind(
    "stmt.temp_bytes_per_call",
    "bytes",
    "temporary file bytes written per call of the busiest statement that writes them",
    PGSS,
    SOURCES,
)
WORK_MEM_FIT = FactKind(
    "stmt.work_mem_fit",
    "bytes",
    "a work_mem that would keep that statement in memory",
    PGSS,
    SOURCES,
)
WRITE_SHARE = FactKind(
    "stmt.write_share",
    "share",
    "execution time in statements that write WAL (change rows)",
    PGSS,
    SOURCES,
)
WAL_TOP = FactKind(
    "stmt.wal_top_share",
    "share",
    "the statement writing most WAL: its share of the WAL",
    PGSS,
    SOURCES,
)
PLAN_SHARE = FactKind(
    "stmt.plan_share", "share", "planning's share of the statements' time", PGSS, SOURCES
)
MISS_SHARE = FactKind(
    "buffers.miss_share",
    "share",
    "shared blocks not found in shared_buffers (read from the OS)",
    PGSS,
    SOURCES,
)
SEQ_SHARE = FactKind(
    "scan.seq_share",
    "share",
    "rows read by sequential scans, of all rows read from tables",
    TABLES,
    SOURCES,
)
# Rows read per row returned: the rows returned are the statements'.
SEQ_ROWS_PER_ROW = FactKind(
    "scan.seq_rows_per_row",
    "count",
    "rows read by sequential scans per row the statements returned",
    PGSS,
    SOURCES,
)
SEQ_ROWS = FactKind(
    "scan.seq_rows.<table>",
    "count",
    "rows of a table read by sequential scans per transaction",
    TABLES,
    SOURCES,
)
READ_SHARE = FactKind(
    "table.read_share",
    "share",
    "share of the rows read from tables that come from the most-read",
    TABLES,
    SOURCES,
)
READ_DEAD_SHARE = FactKind(
    "table.read_dead_share", "share", "dead rows in the most-read table", TABLES, SOURCES
)
READ_DEAD = FactKind(
    "table.read_dead.<table>", "share", "dead rows' share of a table", TABLES, SOURCES
)
READ_BLOCKS_PER_ROW = FactKind(
    "table.read_blocks_per_row",
    "ratio",
    "heap blocks of the most-read table touched per live row read",
    TABLES,
    SOURCES,
)
NON_HOT = FactKind(
    "table.non_hot_share",
    "share",
    "updates of the most-written table that could not be HOT (each writes every index)",
    TABLES,
    SOURCES,
)
INDEX_WRITES_PER_ROW = FactKind(
    "table.index_writes_per_row",
    "count",
    "index entries written per row changed in the most-written table",
    TABLES,
    SOURCES,
)
INDEX_WRITES = FactKind(
    "table.index_writes.<table>",
    "count",
    "index entries written per row changed in a table",
    TABLES,
    SOURCES,
)


@dataclass
class _Sum:
    """A statement's or table's counters summed over a cell's steps."""

    values: dict[str, float]

    def __getitem__(self, key: str) -> float:
        return self.values.get(key, 0.0)


def _summed(rows: Sequence[StatementStep | TableStep], key: str) -> dict[str, _Sum]:
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in sorted(rows, key=lambda r: r.step_id):
        target = out[str(getattr(row, key))]
        for f in fields(row):
            value = getattr(row, f.name)
            if f.name in ("step_id", key) or isinstance(value, bool):
                continue
            if not isinstance(value, int | float):
                continue
            if f.name in TABLE_GAUGES:
                target[f.name] = float(value)  # the last step's reading
            else:
                target[f.name] += float(value)
    return {k: _Sum(dict(v)) for k, v in out.items()}


def _quoted(text: str | None, width: int = 90) -> str:
    if not text:
        return "(text not kept)"
    flat = " ".join(text.split())
    return f'"{flat[:width]}{"…" if len(flat) > width else ""}"'


class WorkFamily(Family):
    name = "work"
    order = 100

    def fill(self, sheet: FactSheet, cell: CellFacts) -> None:
        work_facts(sheet, cell)


def work_facts(sheet: FactSheet, cell: CellFacts) -> None:
    section = cell.analysis.statements
    if not section.read:
        return
    n = cell.clients
    steps = {s.step_id for s in cell.steps()}
    xacts = sum(s.xacts or 0 for s in cell.steps())
    # Top-level statements only: a nested one's time is inside the statement that ran it.
    statements = _summed(
        [s for s in section.statements if s.step_id in steps and s.toplevel], "queryid"
    )
    tables = _summed([t for t in section.tables if t.step_id in steps], "relname")
    rows_returned = None
    if section.statements_read:
        rows_returned = _statement_facts(sheet, statements, section.texts, n)
        xacts_read = _xacts_read(cell, section.xacts_read)
        _repeated_facts(sheet, statements, section.texts, xacts_read)
        _plan_facts(sheet, statements, section.seq_filters, section.texts, n)
    _table_facts(sheet, tables, rows_returned, xacts, n)


def _plan_facts(
    sheet: FactSheet,
    statements: dict[str, _Sum],
    filters: dict[str, list[SeqFilter]],
    texts: dict[str, str],
    n: int,
) -> None:
    """The busiest statement whose generic plan scans a table sequentially to filter it: the
    table and the columns an index would serve (`plan.seq_filter.<table>`)."""
    total_ms = sum(s["exec_ms"] for s in statements.values())
    planned = [q for q in statements if filters.get(q) and statements[q]["exec_ms"] > 0]
    if total_ms <= 0 or not planned:
        return
    queryid = max(planned, key=lambda q: statements[q]["exec_ms"])
    scan = filters[queryid][0]
    columns = ", ".join(scan.columns) or "?"
    sheet.add(
        SEQ_FILTER,
        statements[queryid]["exec_ms"] / total_ms,
        f"query {queryid} {_quoted(texts.get(queryid))}, whose generic plan reads {scan.relation} "
        f"by a sequential scan with the filter {scan.filter} (an index to try: CREATE INDEX "
        f"CONCURRENTLY ON {scan.relation} ({columns})); its share of the statements' execution "
        f"time at {n_clients(n)}",
        thing=scan.relation,
    )


def _xacts_read(cell: CellFacts, xacts_read: dict[int, float]) -> float:
    """The transactions of the cell's steps over the span pg_stat_statements' counts cover:
    all pgbench ran in each step, its warm-up included; else the step's own count (an
    observation's window, read at its edges)."""
    return sum(xacts_read.get(s.step_id, s.xacts or 0) for s in cell.steps())


def _repeated_facts(
    sheet: FactSheet, statements: dict[str, _Sum], texts: dict[str, str], xacts: float
) -> None:
    """The statement run most often per transaction, of those that hold a good part of the
    execution time: how often, how many rows each call, its share."""
    work = {q: s for q, s in statements.items() if s["calls"] > 0}
    total_ms = sum(s["exec_ms"] for s in work.values())
    if not xacts or total_ms <= 0:
        return
    heavy = {q: s for q, s in work.items() if s["exec_ms"] / total_ms >= REPEATED_MIN_SHARE}
    if not heavy:
        return
    queryid, top = max(heavy.items(), key=lambda kv: (kv[1]["calls"], kv[0]))
    calls, rows = top["calls"] / xacts, top["rows"] / top["calls"]
    ms = (top["exec_ms"] + top["plan_ms"]) / top["calls"]
    said = f"query {queryid} {_quoted(texts.get(queryid))}"
    sheet.add(
        REPEATED_CALLS,
        calls,
        f"{said}: {plain(calls, 3)} calls per transaction, {plain(rows, 3)} rows per call, "
        f"{ms:.3g} ms per call",
    )
    sheet.add(REPEATED_ROWS, rows, f"rows returned or changed per call of query {queryid}")
    sheet.add(
        REPEATED_SHARE,
        top["exec_ms"] / total_ms,
        f"query {queryid}: its share of the statements' execution time",
    )


def _kib(n: float) -> str:
    return f"{n / 1024:,.0f} kB" if n >= 1024 else f"{n:,.0f} bytes"


def _statement_facts(
    sheet: FactSheet, statements: dict[str, _Sum], texts: dict[str, str], n: int
) -> float | None:
    """Facts from pg_stat_statements; returns the rows the statements returned in all."""
    work = {q: s for q, s in statements.items() if s["calls"] > 0}
    total_ms = sum(s["exec_ms"] for s in work.values())
    if not work or total_ms <= 0:
        return None

    def share(chosen: dict[str, _Sum]) -> float:
        return sum(s["exec_ms"] for s in chosen.values()) / total_ms

    def name(queryid: str) -> str:
        return f"query {queryid} {_quoted(texts.get(queryid))}"

    top_id, top = max(work.items(), key=lambda kv: kv[1]["exec_ms"])
    sheet.add(
        TOP_SHARE,
        top["exec_ms"] / total_ms,
        f"{name(top_id)}: its share of the statements' execution time at {n_clients(n)}",
    )
    sheet.add(
        TOP_ROWS_PER_CALL,
        top["rows"] / top["calls"],
        f"{name(top_id)}: {plain(top['rows'] / top['calls'], 3)} rows returned or changed per call",
    )
    sheet.add(
        TOP_BLOCKS_PER_ROW,
        (top["shared_hit"] + top["shared_read"]) / max(top["rows"], top["calls"]),
        f"shared blocks touched per row of query {top_id} (a lookup by index touches 3-5)",
    )
    heavy = {
        q: s
        for q, s in work.items()
        if (s["shared_hit"] + s["shared_read"]) / max(s["rows"], s["calls"]) >= SCAN_BLOCKS_PER_ROW
    }
    heaviest = max(heavy, key=lambda q: heavy[q]["exec_ms"], default=None)
    sheet.add(
        SCAN_HEAVY,
        share(heavy),
        f"execution time in statements touching ≥{SCAN_BLOCKS_PER_ROW} blocks per row they "
        f"return{f', most of it {name(heaviest)}' if heaviest else ''}, at {n_clients(n)}",
    )
    spilling = {q: s for q, s in work.items() if s["temp_written"] > 0}
    sheet.add(
        TEMP_SHARE,
        share(spilling),
        f"execution time in statements that write temporary files, at {n_clients(n)}",
    )
    if spilling:
        spill_id, spill = max(spilling.items(), key=lambda kv: kv[1]["exec_ms"])
        per_call = spill["temp_written"] * BLOCK_BYTES / spill["calls"]
        sheet.add(
            TEMP_PER_CALL,
            per_call,
            f"temporary file bytes written per call of {name(spill_id)}",
        )
        fit_mb = 1
        while fit_mb * 2**20 < 2 * per_call:  # in memory a sort takes about twice its file
            fit_mb *= 2
        sheet.add(
            WORK_MEM_FIT,
            fit_mb * 2**20,
            f"a work_mem that would keep it in memory: {fit_mb} MB (set per session or role)",
        )
    writing = {q: s for q, s in work.items() if s["wal_bytes"] > 0}
    sheet.add(
        WRITE_SHARE,
        share(writing),
        f"execution time in statements that write WAL (change rows), at {n_clients(n)}",
    )
    wal_total = sum(s["wal_bytes"] for s in writing.values())
    if wal_total > 0:
        wal_id, wal = max(writing.items(), key=lambda kv: kv[1]["wal_bytes"])
        sheet.add(
            WAL_TOP,
            wal["wal_bytes"] / wal_total,
            f"{name(wal_id)}: its share of the WAL the statements wrote at {n_clients(n)}, "
            f"{_kib(wal['wal_bytes'] / wal['calls'])} of WAL per call",
        )
    plan_ms = sum(s["plan_ms"] for s in work.values())
    sheet.add(
        PLAN_SHARE,
        plan_ms / (plan_ms + total_ms),
        f"planning's share of the statements' time at {n_clients(n)}",
    )
    hit = sum(s["shared_hit"] for s in work.values())
    read = sum(s["shared_read"] for s in work.values())
    if hit + read > 0:
        sheet.add(
            MISS_SHARE,
            read / (hit + read),
            f"shared blocks not found in shared_buffers (read from the OS) at {n_clients(n)}",
        )
    return sum(s["rows"] for s in work.values())


def _table_facts(
    sheet: FactSheet, tables: dict[str, _Sum], rows_returned: float | None, xacts: int, n: int
) -> None:
    if not tables:
        return
    seq = sum(t["seq_tup_read"] for t in tables.values())
    fetched = sum(t["idx_tup_fetch"] for t in tables.values())
    if seq + fetched > 0:
        sheet.add(
            SEQ_SHARE,
            seq / (seq + fetched),
            f"rows read by sequential scans, of all rows read from tables, at {n_clients(n)}",
        )
    if rows_returned:
        sheet.add(
            SEQ_ROWS_PER_ROW,
            seq / rows_returned,
            f"rows read by sequential scans per row the statements returned, at {n_clients(n)}",
        )
    if xacts:
        for rel, t in tables.items():
            if t["seq_tup_read"] > 0:
                sheet.add(
                    SEQ_ROWS,
                    t["seq_tup_read"] / xacts,
                    f"rows of {rel} read by sequential scans per transaction "
                    f"({plain(t['seq_scan'] / xacts, 2)} scans per transaction)",
                    thing=rel,
                )
    _dead_row_facts(sheet, tables, n)
    _index_write_facts(sheet, tables, n)


def _dead_row_facts(sheet: FactSheet, tables: dict[str, _Sum], n: int) -> None:
    """The most-read table's dead rows: every scan of it, sequential or by index, visits them."""
    read = {r: t["seq_tup_read"] + t["idx_tup_fetch"] for r, t in tables.items()}
    total = sum(read.values())
    if total <= 0:
        return
    rel = max(read, key=lambda r: read[r])
    t = tables[rel]
    rows = t["n_live_tup"] + t["n_dead_tup"]
    if rows <= 0:
        return
    sheet.add(
        READ_SHARE,
        read[rel] / total,
        f"share of the rows read from tables that come from {rel}, at {n_clients(n)}",
    )
    sheet.add(
        READ_DEAD_SHARE,
        t["n_dead_tup"] / rows,
        f"dead rows in {rel}, the most-read table: {t['n_dead_tup']:,.0f} dead, "
        f"{t['n_live_tup']:,.0f} live",
    )
    sheet.add(
        READ_DEAD,
        t["n_dead_tup"] / rows,
        f"dead rows' share of {rel}",
        thing=rel,
    )
    blocks = t["heap_blks_hit"] + t["heap_blks_read"]
    if read[rel] > 0 and blocks > 0:
        sheet.add(
            READ_BLOCKS_PER_ROW,
            blocks / read[rel],
            f"heap blocks of {rel} touched per live row read",
        )


def _index_write_facts(sheet: FactSheet, tables: dict[str, _Sum], n: int) -> None:
    """The most-written table: every row inserted or updated without HOT writes an entry in
    each of its indexes, and the WAL for it."""
    written = {r: t["n_tup_ins"] + t["n_tup_upd"] + t["n_tup_del"] for r, t in tables.items()}
    if not written or max(written.values()) <= 0:
        return
    rel = max(written, key=lambda r: written[r])
    t = tables[rel]
    non_hot = t["n_tup_upd"] - t["n_tup_hot_upd"]
    entries = t["indexes"] * (t["n_tup_ins"] + non_hot)
    if t["n_tup_upd"] > 0:
        sheet.add(
            NON_HOT,
            non_hot / t["n_tup_upd"],
            f"updates of {rel} that could not be HOT (each writes every index)",
        )
    per_row = entries / written[rel]
    sheet.add(
        INDEX_WRITES_PER_ROW,
        per_row,
        f"index entries written per row changed in {rel}, the most-written table "
        f"({t['indexes']:.0f} indexes) at {n_clients(n)}",
    )
    sheet.add(
        INDEX_WRITES,
        per_row,
        f"index entries written per row changed in {rel}",
        thing=rel,
    )
