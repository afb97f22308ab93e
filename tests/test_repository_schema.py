"""The repository without a server: its schema derived from the declared tables, the keys it
files runs under, the CSV a push sends, and the command line's refusals. The repository
itself, for real, is tests/test_repository.py's."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest

from pgscope import tables
from pgscope.errors import ExitCode, UsageError
from pgscope.repository import schema
from pgscope.repository.push import StoreReader, month_starts, server_id, server_of
from tests.cli import one_line_error, pgscope

UNREACHABLE = "host=127.0.0.1 port=1 dbname=fleet user=me connect_timeout=2"


def test_every_declared_table_and_column_is_in_the_repository_as_declared() -> None:
    """Derived, never written again: each store table has its repository table, the run's
    keys first, then every declared column with its type mapped and its NOT NULL kept; a
    series is partitioned by month on its time column, with a default partition; every
    column is also added to an older repository's table."""
    for t in tables.declared().values():
        create, *rest = schema.store_table_ddl(t)
        assert create.startswith(f'CREATE TABLE IF NOT EXISTS "pgscope"."{t.name}" (')
        body = create.split("(\n", 1)[1]
        lines = [line.strip().rstrip(",") for line in body.splitlines()[:-1]]
        assert lines[:2] == ["server_id bigint NOT NULL", "run_key bigint NOT NULL"]
        for line, column in zip(lines[2:], t.columns, strict=True):
            name, kind = line.split(" ", 1)
            assert name == f'"{column.name}"'
            assert kind.removesuffix(" NOT NULL") == schema.PG_TYPES[column.type]
            assert kind.endswith("NOT NULL") == bool(column.constraint), (t.name, line)
        if t.series:
            assert create.endswith(f'PARTITION BY RANGE ("{t.series}")')
            assert any("PARTITION OF" in s and "DEFAULT" in s for s in rest)
        else:
            assert "PARTITION" not in create
        added = [s for s in rest if "ADD COLUMN IF NOT EXISTS" in s]
        assert len(added) == len(t.columns)
        [index] = [s for s in rest if s.startswith("CREATE INDEX")]
        if t.series:  # cheap to keep as millions of rows arrive, a push's rows together
            assert index.endswith(" USING brin (run_key) WITH (pages_per_range = 32)")
        else:
            assert index.endswith(f'ON "pgscope"."{t.name}" (run_key)')


def test_the_repository_page_lists_every_table_as_the_repository_holds_it() -> None:
    text = (Path(__file__).parent.parent / "docs" / "repository.md").read_text()
    section = re.search(
        r"<!-- repository tables: begin -->\n(.*)<!-- repository tables: end -->", text, re.S
    )
    assert section, "docs/repository.md lost its generated table list"
    assert section[1] == schema.markdown(), (
        "docs/repository.md's table list differs from the declarations: replace it with "
        "pgscope.repository.schema.markdown()"
    )


def test_the_functions_know_the_series_and_the_tables_sent_whole() -> None:
    sql = schema.functions_ddl()
    series = re.search(r"p_table = ANY \((ARRAY\[[^]]*\])", sql.split("add_partition", 1)[1])
    whole = re.search(r"p_table = ANY \((ARRAY\[[^]]*\])", sql.split("clear_rows", 1)[1])
    assert series and whole
    assert re.findall(r"'(\w+)'", series[1]) == [t.name for t in schema.series_tables()]
    assert re.findall(r"'(\w+)'", whole[1]) == [t.name for t in schema.updated_tables()]
    assert {"activity_samples", "timeline", "pgstats_counters"} <= {
        t.name for t in schema.series_tables()
    }
    assert {t.name for t in schema.updated_tables()} == {
        *("run", "steps", "collectors", "windows", "timeline")
    }
    for function in schema.PUSH_FUNCTIONS:
        name = function.split("(")[0]
        definition = sql.split(f"FUNCTION pgscope.{name}(", 1)[1].split("$f$")[0]
        assert "SECURITY DEFINER SET search_path = pg_catalog, pg_temp" in definition, name


def test_a_server_is_keyed_by_its_identity_the_same_everywhere() -> None:
    key = server_id(7391, "db1", 5432)
    assert key == server_id(7391, "db1", 5432) and 0 < key < 2**63
    # A standby shares its primary's system identifier, and pgscope's clusters one initdb's.
    assert len({key, server_id(7391, "db1", 5433), server_id(7391, "db2", 5432)}) == 3
    assert server_id(None, "db1", 5432) != key
    # A store before version 7: the connection string's host and port, else this host's name.
    old = {"target_conninfo": "host=db9 port=6432 dbname=app", "host_json": "{}"}
    assert (server_of(old).host, server_of(old).port) == ("db9", 6432)
    embedded = {"target_conninfo": "embedded", "host_json": '{"hostname": "box"}'}
    assert (server_of(embedded).host, server_of(embedded).port) == ("box", None)
    socket = {"target_conninfo": "host=/run/postgresql", "host_json": '{"hostname": "box"}'}
    assert server_of(socket).host == "box"
    new = {"system_identifier": 7391, "server_host": "db1", "server_port": 5432}
    assert server_of(new).server_id == key


def test_months_are_utc_calendar_months() -> None:
    dec_31 = 1_767_225_599_000_000  # 2025-12-31 23:59:59 UTC
    feb_1 = 1_769_904_000_000_000  # 2026-02-01 00:00:00 UTC
    assert month_starts(dec_31, feb_1) == [
        1_764_547_200_000_000,  # 2025-12-01
        1_767_225_600_000_000,  # 2026-01-01
        1_769_904_000_000_000,  # 2026-02-01
    ]


def test_rows_go_out_as_csv_that_reads_back_the_same(tmp_path: Path) -> None:
    """Quotes, commas, new lines, empty strings and NULL; doubles to their last digit,
    infinite and not a number; a column the store predates empty (NULL)."""
    db = duckdb.connect()
    db.execute(tables.of("events").ddl())
    db.execute(
        "INSERT INTO events VALUES (1, 1, 'a \"b\", c', 'new\nline'), (2, NULL, '', NULL), "
        "(-9223372036854775808, 3, ',', '\"'), (4, 4, ' padded ', 'cr\rhere'), "
        "(5, 5, '\\.', '\\N')"
    )
    db.execute("CREATE TABLE host_cpu (ts_us BIGINT, busy DOUBLE)")  # an older store's
    db.execute(
        "INSERT INTO host_cpu VALUES (1, 'inf'), (2, 'nan'), (3, 0.30000000000000004), "
        "(4, -0.0), (5, NULL)"
    )
    reader = StoreReader(db, tmp_path)
    for t in (tables.of("events"), tables.of("host_cpu")):
        text = b"".join(reader.csv_stream(t, (11, 22), -1, reader.last_rowid(t))).decode()
        path = tmp_path / f"{t.name}.csv"
        path.write_text(text)
        types = {"k1": "BIGINT", "k2": "BIGINT"} | {c.name: c.type for c in t.columns}
        back = db.execute(
            f"SELECT * FROM read_csv('{path}', columns = {types}, auto_detect = false, "
            "header = false, quote = '\"', escape = '\"', allow_quoted_nulls = false)"
        ).fetchall()
        have = [c for c in t.columns if c.name in reader.columns[t.name]]
        stored = db.execute(
            f"SELECT {', '.join(c.name for c in have)} FROM {reader.source(t)} ORDER BY rowid"
        ).fetchall()
        names = [c.name for c in t.columns]
        assert [row[:2] for row in back] == [(11, 22)] * len(stored)
        got = [tuple(row[2 + names.index(c.name)] for c in have) for row in back]
        assert [tuple(map(str, r)) for r in got] == [tuple(map(str, r)) for r in stored]
        if t.name == "host_cpu":  # the columns an older store lacks read as NULL
            assert all(row[2 + names.index("cpus")] is None for row in back)


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        (["push", "x"], ExitCode.USAGE, "which repository? give --to, --to-file or"),
        (["repository", "init"], ExitCode.USAGE, "which repository?"),
        (["runs", "--server", "db1"], ExitCode.USAGE, "--server: with --from only"),
        (["report", "x", "--reanalyse"], ExitCode.USAGE, "--reanalyse: with --from only"),
        (["push", "x", "--to", "a=b=c"], ExitCode.USAGE, "not a valid connection string"),
        (
            ["runs", "--from", "host=x", "--from-file", "/nonexistent"],
            ExitCode.USAGE,
            "--from and --from-file: give one of them",
        ),
        (
            ["runs", "--from", UNREACHABLE, "--since", "last tuesday"],
            ExitCode.USAGE,
            "--since 'last tuesday': expected an age",
        ),
    ],
)
def test_bad_repository_input_is_one_line_with_a_documented_code(
    args: list[str], code: int, expected: str
) -> None:
    result = pgscope(*args, timeout=60)
    assert result.returncode == code, result.stderr
    assert expected in one_line_error(result)


def test_an_unreachable_repository_is_named_without_its_password(tmp_path: Path) -> None:
    secret = "hunter2-fleet"
    to_file = tmp_path / "to"
    to_file.write_text(f"{UNREACHABLE} password={secret}\n")
    for args, env in (
        (["repository", "init", "--to-file", str(to_file)], {}),
        (["push", str(tmp_path), "--to", f"{UNREACHABLE} password={secret}"], {}),
        (["runs", "--from", f"{UNREACHABLE} password={secret}"], {}),
        (["repository", "prune", "--older-than", "90d"], {
            "PGSCOPE_REPOSITORY": f"{UNREACHABLE} password={secret}"}),
    ):  # fmt: skip
        result = pgscope(*args, env=env, timeout=60)
        assert result.returncode == ExitCode.TARGET, (args, result.stderr)
        message = one_line_error(result)
        assert "cannot connect to the repository" in message and "port=1" in message
        assert secret not in result.stderr + result.stdout


def test_every_connection_string_leaves_the_recorded_command_line_without_its_password() -> None:
    from pgscope.cli.title import safe_command_line

    line = safe_command_line(
        ["pgscope", "observe", "--dsn", "host=a password=s1", "--push=host=b password=s2",
         "--to", "host=c password=s3", "--from", "host=d password=s4"]
    )  # fmt: skip
    assert not re.search(r"s[1-4]\b", line), line
    assert all(f"host={h}" in line for h in "abcd")


def test_when_reads_ages_and_utc_dates() -> None:
    from pgscope.cli.options import parse_when

    assert parse_when("2026-11-01", "--since") == 1_793_491_200_000_000
    assert parse_when("2026-11-01T12:00", "--since") == 1_793_491_200_000_000 + 43_200_000_000
    assert parse_when("2026-11-01T12:00+01:00", "--since") == 1_793_491_200_000_000 + 39_600_000_000
    import time

    assert abs(parse_when("90d", "--older-than") - (time.time() - 90 * 86400) * 1e6) < 5e6
    with pytest.raises(UsageError, match="--older-than 'soon'"):
        parse_when("soon", "--older-than")
