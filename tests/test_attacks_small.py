"""Issue 37, the smaller attacks: each run again here as it was run, and shown to do no harm.

A libpq parse error quoted part of a password; a NUL in a received spec's script path was an
internal ValueError; a folder named like a pgbench log ended the run; `ALTER ROLE ... PASSWORD`
texts went from pg_stat_statements into the store; a variant's name put a link in a chart;
a rate of 1e23 tps, 0% of it completed, was reported as a capacity beyond it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgscope.analyze import capacity
from pgscope.analyze.capacity import ObjectiveResult
from pgscope.analyze.scaling import analyse as scaling_analyse
from pgscope.errors import ExitCode, SpecError, UsageError
from pgscope.spec import load_spec, parse_rates
from pgscope.target.conn import ConnParams
from tests.cli import one_line_error, pgscope
from tests.stores import HOST, measured_run

SECRET = "Secret-7f3a"


# --- a connection string that does not parse is said without its text ------------------------


@pytest.mark.parametrize(
    "dsn",
    [
        f"host=db1 password=Pw {SECRET}",  # unquoted: 'missing "=" after "Secret-7f3a"'
        f"host=db1 password='{SECRET}",  # unterminated
        f"host=db1 password=x {SECRET}=1",  # 'invalid connection option "Secret-7f3a"'
        f"postgresql://u:{SECRET}@db1/?{SECRET}",
        f"postgresql://u:{SECRET}@[db1",
    ],
)
def test_a_connection_string_that_does_not_parse_is_said_without_its_text(dsn: str) -> None:
    with pytest.raises(UsageError) as raised:
        ConnParams.from_dsn(dsn, "--to")
    said = str(raised.value)
    assert said.startswith("--to: not a valid connection string: ")
    assert SECRET not in said and "Secret" not in said, said
    assert "\n" not in said


def test_the_cli_says_a_bad_connection_string_in_one_line_without_the_password(
    tmp_path: Path,
) -> None:
    for args in (
        ["push", str(tmp_path), "--to", f"host=db1 password=Pw {SECRET}"],
        ["sample", "--dsn", f"host=db1 password=Pw {SECRET}", "--results-dir", str(tmp_path)],
    ):
        result = pgscope(*args)
        assert result.returncode == ExitCode.USAGE, result.stderr
        line = one_line_error(result)
        assert "not a valid connection string" in line
        assert SECRET not in result.stderr + result.stdout


# --- a NUL in a received spec's file names ----------------------------------------------------


@pytest.mark.parametrize(
    ("field", "toml"),
    [
        ("scripts", 'scripts = ["inputs/a\\u0000b.sql"]'),
        ("init_sql", 'init_sql = "inputs/a\\u0000b.sql"'),
    ],
)
def test_a_nul_in_a_received_specs_file_name_is_a_spec_error_naming_the_field(
    tmp_path: Path, field: str, toml: str
) -> None:
    folder = measured_run(tmp_path / "20261128-000000-x-0000", [(1, 10.0)])
    (folder / "inputs").mkdir(parents=True)
    (folder / "spec.toml").write_text(f'name = "x"\n{toml}\n')
    with pytest.raises(SpecError) as raised:  # was ValueError: embedded null byte
        loaded = load_spec(str(folder / "spec.toml"), kept_in=folder)
        loaded.scripts()
        loaded.init_sql_path()
    said = str(raised.value)
    assert f"field {field}" in said and "NUL" in said, said
    again = pgscope("run", "--again", str(folder), "--plan")
    assert again.returncode == ExitCode.SPEC, again.stderr
    assert f"field {field}" in one_line_error(again)


# --- a folder named like a pgbench log --------------------------------------------------------


def test_a_folder_named_like_a_pgbench_log_is_left_out_not_fatal(tmp_path: Path) -> None:
    """A script's `\\shell mkdir pgbench_log.4242` in its step folder: the logs taken back are
    the regular files, the folder is removed (it ended the run with IsADirectoryError)."""
    from pgscope.drive.loaduser import LoadUser, load_account

    base = tmp_path / "load"
    base.mkdir()
    os.chmod(tmp_path, 0o755)
    with LoadUser.private(load_account(None), base) as user:
        step = user.step_folder("0001")
        prefix = step / "pgbench_log"  # as pgbench was told: in the step folder
        log = step / "pgbench_log.4241"
        log.write_text("0 1 500 0 1700000000 0\n")
        user.run_as.chown(log)
        planted = step / "pgbench_log.4242"
        (planted / "inside").mkdir(parents=True)
        (planted / "inside" / "x").write_text("x")
        for path in (planted, planted / "inside", planted / "inside" / "x"):
            user.run_as.chown(path)
        kept = user.take_logs(prefix)
        assert [p.name for p in kept] == ["pgbench_log.4241"]
        assert kept[0].read_text() == "0 1 500 0 1700000000 0\n"
        assert not planted.exists() and not (kept[0].parent / "pgbench_log.4242").exists()


# --- PASSWORD texts are masked before they are stored -----------------------------------------


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (f"ALTER ROLE app PASSWORD '{SECRET}'", "ALTER ROLE app PASSWORD"),
        (
            f"alter user app with encrypted password '{SECRET}' valid until 'infinity'",
            "alter user app with encrypted password",
        ),
        (f"CREATE ROLE app LOGIN PASSWORD $${SECRET}$$", "CREATE ROLE app LOGIN PASSWORD"),
        (
            f"/* SELECT */ CREATE USER app PASSWORD E'{SECRET}'",
            "/* SELECT */ CREATE USER app PASSWORD",
        ),
        (
            f"CREATE USER MAPPING FOR app SERVER s OPTIONS (user 'a', password '{SECRET}')",
            "CREATE USER MAPPING FOR app SERVER s OPTIONS (user 'a', password",
        ),
        (f"SELECT 1; ALTER ROLE app PASSWORD '{SECRET}'", "SELECT 1; ALTER ROLE app PASSWORD"),
    ],
)
def test_a_statement_that_names_a_password_is_kept_up_to_it(text: str, kept: str) -> None:
    from pgscope.collect.statistics.statements import MASK, masked

    assert masked(text) == f"{kept} {MASK}"


def test_statements_without_a_password_literal_are_kept_whole() -> None:
    from pgscope.collect.statistics.statements import masked

    for text in (
        "SELECT password FROM users WHERE id = $1",
        "UPDATE users SET password_hash = $1 WHERE id = $2",
        "ALTER ROLE app VALID UNTIL 'infinity'",
        "SELECT abalance FROM pgbench_accounts WHERE aid = $1",
    ):
        assert masked(text) == text


@pytest.mark.server
def test_a_password_set_on_the_server_never_reaches_the_store(pg: Any, tmp_path: Path) -> None:
    """`ALTER ROLE ... PASSWORD '...'` run on a server: pg_stat_statements keeps its text
    whole (a utility statement's constants are not replaced); the statements collector
    stores it masked."""
    from pgscope.collect.statistics.statements import MASK, StatementsCollector, StatementsOptions
    from pgscope.proc import server_account
    from pgscope.store import RunMeta, RunStore
    from pgscope.target.embedded import EmbeddedCluster, benchmark_defaults
    from tests.servers import SMALL_SERVER

    settings = {
        **benchmark_defaults(4),
        **SMALL_SERVER,
        "shared_preload_libraries": "pg_stat_statements",
    }
    run_dir = tmp_path / "20261128-000000-x-0000"
    store = RunStore.create(
        run_dir,
        RunMeta(
            run_dir.name, "x", "test", "", "{}", "pgscope test", "0", "server", "host=db1", HOST
        ),
    )
    store.create_tables("statements")
    with EmbeddedCluster(pg, server_account(None), tmp_path / "server.log", settings) as cluster:
        # A session of the server's own, counted as any client's (pgscope's are not).
        params = {**cluster.conn.params, **cluster.conn.secrets}
        with psycopg.connect(autocommit=True, **params) as conn:  # type: ignore[arg-type]
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("CREATE ROLE app LOGIN")
            conn.execute(f"ALTER ROLE app PASSWORD '{SECRET}'")
            conn.execute(f"CREATE ROLE app2 LOGIN PASSWORD '{SECRET}'")
            texts = [
                str(r[0]) for r in conn.execute("SELECT query FROM pg_stat_statements").fetchall()
            ]
        assert any(SECRET in t for t in texts), "the server keeps the text whole"
        collector = StatementsCollector(StatementsOptions(wait_for_load=False))
        collector.store, collector.conn = store, cluster.conn
        collector.databases, collector.statements, collector.explain = ["postgres"], True, False
        collector.known_texts, collector.own, collector.known_indexes = {}, set(), set()
        collector.started_ms = {}
        collector._reading([(1, "start")])
    stored = [r["query"] for r in store.query("SELECT query FROM statement_texts")]
    store.close()
    assert stored, "texts were read"
    assert not [t for t in stored if SECRET in t]
    assert any(t == f"ALTER ROLE app PASSWORD {MASK}" for t in stored), stored
    assert SECRET.encode() not in (run_dir / "run.duckdb").read_bytes()


# --- data in chart labels is escaped ----------------------------------------------------------

LINK = '<a href="https://example.invalid/x">click</a>'


def _hostile_run(run_dir: Path) -> Path:
    """A received folder's store: two variants, one named with a link, two client counts,
    a wait class named with markup."""
    from pgscope.store import RunMeta, RunStore

    store = RunStore.create(
        run_dir,
        RunMeta(
            run_dir.name,
            "scaling",
            "recipe scaling",
            "",
            "{}",
            "pgscope run",
            "0",
            "server",
            "host=db1",
            HOST,
        ),
    )
    start = 1_700_000_000_000_000
    cells = [(v, n, tps) for v in ("base", LINK) for n, tps in ((1, 100.0), (2, 180.0), (4, 300.0))]
    for step_id, (variant, clients, tps) in enumerate(cells, start=1):
        store.begin_step(step_id, variant, clients, 1, 1, 2.0, 0.0, False)
        window = (start + step_id * 10_000_000, start + step_id * 10_000_000 + 5_000_000)
        results = {"window_start_us": window[0], "window_end_us": window[1], "tps": tps}
        results |= {"xacts": int(tps * 5), "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0}
        store.finish_step(step_id, "ok", None, results)
    store.finish_run("complete", None)
    store.close()
    return run_dir


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


def test_a_variant_name_never_reaches_a_chart_as_markup(tmp_path: Path) -> None:
    from pgscope.analyze.load import load_analysis
    from pgscope.render import charts
    from pgscope.render.html import report_html

    analysis = load_analysis(_hostile_run(tmp_path / "20261128-000000-scaling-0000"), bootstrap=0)
    figures = {
        "scalability": charts.scalability(analysis),
        "latency": charts.latency(analysis),
        "variants": charts.variants(analysis),
    }
    assert all(figures.values()), [k for k, v in figures.items() if v is None]
    strings = _strings(list(figures.values()))
    assert any("&lt;a href" in s for s in strings), "the name is shown, as text"
    tags = [s for s in strings if re.search(r"<a\b", s, re.IGNORECASE)]
    assert not tags, tags
    page = report_html(analysis)
    assert '<a href=\\"https://example.invalid' not in page
    assert '<a href="https://example.invalid' not in page


def test_every_data_label_of_every_chart_is_escaped() -> None:
    """The charts fed directly: a tranche, a checkpoint's flags and phase, a wait class,
    each named with markup."""
    from pgscope.analyze.usdt import Bucket, LatencySummary
    from pgscope.render import charts

    summary = LatencySummary("lwlock", LINK, LINK, 3, 0, (Bucket(1000, 2000, 3),))
    figure = charts.lwlock_histograms([summary])
    assert figure is not None
    assert not [s for s in _strings(figure) if "<a " in s]
    assert charts._t(LINK) == '&lt;a href="https://example.invalid/x"&gt;click&lt;/a&gt;'
    assert charts._t("p99<5ms") == "p99<5ms", "plain text is left as it is"


# --- a capacity is never claimed above the rate achieved ---------------------------------------


def _rated(rate: float, achieved: float) -> capacity.CapacityAnalysis | None:
    """A closed-loop sweep, then 3 repeats of one rate that completed `achieved` tps, every
    transaction of them within the objective."""
    base = {
        "variant": "base",
        "status": "ok",
        "latency_limit_ms": 5.0,
        "skipped": 0,
        "late": 0,
        "latency_mean_ms": 1.0,
        "lag_mean_ms": 0.2,
        "lag_p99_ms": 1.0,
        "lag_max_ms": 2.0,
        "service_p50_ms": 0.5,
        "service_p99_ms": 1.5,
        "p50_ms": 0.7,
        "p95_ms": 1.0,
        "p90_ms": 0.9,
        "p99_ms": 2.0,
        "p999_ms": 3.0,
        "max_ms": 4.0,
    }
    rows: list[dict[str, Any]] = []
    for r in (1, 2, 3):
        for n, tps in ((1, 3000.0), (2, 6000.0), (4, 10000.0)):
            rows.append(
                base
                | {
                    "step_id": len(rows) + 1,
                    "clients": n,
                    "repeat": r,
                    "tps": tps,
                    "rate": None,
                    "rate_share": None,
                    "succeeded": int(tps * 5),
                }
            )
    objectives: dict[int, list[ObjectiveResult]] = {}
    for r in (1, 2, 3):
        step_id = len(rows) + 1
        rows.append(
            base
            | {
                "step_id": step_id,
                "clients": 4,
                "repeat": r,
                "tps": achieved,
                "rate": rate,
                "rate_share": None,
                "succeeded": int(achieved * 5),
            }
        )
        done = int(achieved * 5)
        objectives[step_id] = [ObjectiveResult("p99<5ms", 0.99, 5.0, 0, done, 2.0)]
    scaling = scaling_analyse(rows, bootstrap=20)
    return capacity.analyse(rows, objectives, {}, scaling, ["p99<5ms"])


def test_a_rate_the_server_fell_far_short_of_is_no_capacity_beyond_it() -> None:
    found = _rated(1e23, 9000.0)
    assert found is not None
    [estimate] = found.variants[0].capacities
    assert estimate.tps is None and estimate.above == 0
    said = estimate.said
    assert "beyond" not in said and "held up to" not in said, said
    assert "not measured" in said and "completed at most 9,000 tps" in said, said
    assert estimate.unsustained == [9000.0] * 3
    # A rate kept up with is still met, and beyond it said as before.
    kept = _rated(8000.0, 7990.0)
    assert kept is not None
    [estimate] = kept.variants[0].capacities
    assert estimate.said.startswith("p99<5ms held up to the highest rate offered, 8,000 tps")


def test_a_capacity_between_a_rate_met_and_one_fallen_short_of_is_at_most_what_was_done() -> None:
    """Met at 2,000 (kept up); at 10,000 the latency held but 6,000 was completed: the
    crossing lies no higher than 6,000."""
    from tests.test_capacity import _sweep

    rates = [2000.0, 10000.0]
    achieved = {2000.0: 2000.0, 10000.0: 6000.0}
    found = _sweep(rates, achieved, {(r, rate): 0.0 for r in (1, 2, 3) for rate in rates})
    assert found is not None
    [estimate] = found.variants[0].capacities
    assert estimate.tps is not None and 2000.0 <= estimate.tps <= 6000.0, estimate


def test_an_absurd_rate_is_refused_at_spec_time(tmp_path: Path) -> None:
    from pgscope.spec import MAX_RATE_TPS

    with pytest.raises(ValueError, match="beyond what pgbench can offer"):
        parse_rates("1" + "0" * 23)
    spec = tmp_path / "s.toml"
    spec.write_text('name = "x"\nrates = [1e23]\nslo = ["p99<5ms"]\n')
    with pytest.raises(SpecError, match="beyond what pgbench can offer"):
        load_spec(str(spec))
    assert parse_rates(f"{MAX_RATE_TPS:.0f}").texts() == [MAX_RATE_TPS]
    result = pgscope("run", "--rate", "1" + "0" * 23, "--slo", "p99<5ms", "--plan")
    assert result.returncode == ExitCode.SPEC, result.stderr
    assert "beyond what pgbench can offer" in one_line_error(result)
