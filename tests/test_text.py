"""The words pgscope writes: plurals, plain numbers, text files without hard wraps. No server."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from pgscope.words import counted, n_clients, plain
from tests.cli import pgscope
from tests.stores import measured_run

SRC = Path(__file__).parent.parent / "src" / "pgscope"
SWEEP = [(1, 100.0), (2, 190.0), (4, 340.0), (8, 500.0), (1, 101.0), (2, 188.0), (4, 345.0)]


@pytest.mark.parametrize(
    ("n", "expected"),
    [(1, "1 client"), (1.0, "1 client"), (0, "0 clients"), (2, "2 clients"), (64.0, "64 clients")],
)
def test_a_count_agrees_with_its_noun(n: float, expected: str) -> None:
    assert n_clients(n) == expected
    assert n_clients(None) == "every client count"
    assert counted(1, "query", "queries") == "1 query"
    assert counted(3, "query", "queries") == "3 queries"


# Counts that are never 1: the ceiling of --clients, and the USL's fitted (fractional) peak.
ALWAYS_PLURAL = ("{MAX_CLIENTS} clients", "N*≈{self.n_star:.1f} clients")


def test_no_text_builds_a_client_count_by_hand() -> None:
    """Every "{n} clients" goes through n_clients, so 1 reads "1 client"."""
    by_hand = [
        f"{path.relative_to(SRC)}:{number}: {line.strip()}"
        for path in sorted(SRC.rglob("*"))
        if path.suffix in (".py", ".j2", ".toml")
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if re.search(r"(\{[^{}]*\}|\}\}) clients\b", line)
        and not any(allowed in line for allowed in ALWAYS_PLURAL)
    ]
    assert not by_hand, "\n".join(by_hand)


def test_a_run_at_one_client_says_1_client(tmp_path: Path) -> None:
    run = measured_run(tmp_path / "20261124-000000-scaling-0000", SWEEP)
    document = pgscope("report", str(run), "--json")
    assert document.returncode == 0, document.stderr
    labels = [
        fact["label"]
        for sheet in json.loads(document.stdout)["facts"]
        for fact in sheet["facts"].values()
    ]
    assert "mean tps at 1 client" in labels
    assert "mean tps at 2 clients" in labels
    html = pgscope("report", str(run), "--format", "html")
    assert html.returncode == 0, html.stderr
    for text in (document.stdout, (run / "report.html").read_text()):
        assert not re.search(r"\b1 clients\b", text)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (30260.3, "30,260"),
        (995.649, "995.6"),
        (0.0267159, "0.02672"),
        (0.000769094, "0.0007691"),
        (7.69e-05, "0.0000769"),
        (9.99996, "10"),
        (-0.5, "-0.5"),
        (0.0, "0"),
    ],
)
def test_plain_numbers_have_no_exponent(value: float, expected: str) -> None:
    assert plain(value) == expected


EXPONENT = re.compile(r"\d[eE][+-]?\d")


def _big_sweep(tmp_path: Path) -> Path:
    """A USL curve with λ = 30,260 tps per client, the size that printed as 3.026e+04."""
    lam, sigma, kappa = 30260.0, 0.05, 0.002
    rows = [
        f"{n},{lam * n / (1 + sigma * (n - 1) + kappa * n * (n - 1)):.1f}" for n in range(1, 33)
    ]
    path = tmp_path / "big.csv"
    path.write_text("clients,tps\n" + "\n".join(rows) + "\n")
    return path


def test_the_usl_fit_prints_plain_numbers(tmp_path: Path) -> None:
    sweep = _big_sweep(tmp_path)
    result = pgscope("fit", "usl", str(sweep), "--bootstrap", "40")
    assert result.returncode == 0, result.stderr
    assert "λ=30,260 tps per client" in result.stdout
    # The output names the file, whose random temporary folder can read like one
    # ("pgscope-tests-y42hn5e9" failed CI once): the numbers are what must be plain.
    printed = result.stdout.replace(str(sweep), "<sweep>")
    assert not EXPONENT.search(printed), result.stdout


def test_kappa_is_a_coefficient_not_a_percent(tmp_path: Path) -> None:
    from pgscope.analyze.load import load_analysis

    peaked = [(1, 1000.0), (2, 1800.0), (4, 2900.0), (8, 3300.0), (16, 2600.0), (32, 1700.0)]
    run = measured_run(tmp_path / "20261124-000000-scaling-0000", peaked * 2)
    analysis = load_analysis(run, bootstrap=0)
    peak = next(s for s in analysis.facts if s.variant == "base" and s.peak)
    kappa = peak.facts["usl.kappa"]
    assert kappa.unit == "coefficient" and 0 < kappa.value < 0.1
    assert "%" not in kappa.shown() and float(kappa.shown()) == pytest.approx(kappa.value, 0.01)
    chart_names = [
        trace.get("name", "")
        for figure in _charts(analysis)
        for trace in figure["data"]
        if "USL" in trace.get("name", "")
    ]
    assert chart_names and not any(EXPONENT.search(n) for n in chart_names), chart_names


def _charts(analysis: Any) -> list[dict[str, Any]]:
    from pgscope.render import charts

    return [f for f in (charts.scalability(analysis),) if f is not None]


def test_summary_txt_has_whole_paragraphs_and_no_trailing_spaces(tmp_path: Path) -> None:
    run = measured_run(tmp_path / "20261124-000000-scaling-0000", SWEEP)
    result = pgscope("report", str(run), "--format", "html")  # writes the run folder's files
    assert result.returncode == 0, result.stderr
    text = (run / "summary.txt").read_text()
    lines = text.splitlines()
    assert [ln for ln in lines if ln != ln.rstrip()] == []
    verdict = next(ln for ln in lines if ln.startswith("verdict: "))
    assert len(verdict) > 110  # one line, as long as the paragraph: the reader's pager wraps
    assert verdict.endswith("the collectors that would see the cause were off.")


def test_sizes_are_in_human_units(tmp_path: Path) -> None:
    from pgscope.words import human_bytes

    assert [human_bytes(n) for n in (100, 1536, 25276510208, 5 * 2**40)] == [
        "100 B",
        "1.5 KiB",
        "23.5 GiB",
        "5 TiB",
    ]
    run = measured_run(tmp_path / "20261124-000000-scaling-0000", SWEEP)  # 25276510208 bytes
    html = pgscope("report", str(run), "--format", "html")
    assert html.returncode == 0, html.stderr
    page = (run / "report.html").read_text()
    assert "<tr><th>memory</th><td>23.5 GiB</td></tr>" in page
    text = pgscope("report", str(run))
    for shown in (page, text.stdout, (run / "summary.txt").read_text()):
        assert "25276510208" not in shown and "23.5 GiB" in shown


@pytest.mark.parametrize(
    ("value", "unit", "expected"),
    [
        (1500.0, "µs", "1,500 µs"),  # was 1.5e+03 µs
        (2_500_000.0, "ms", "2,500 s"),  # was 2.5e+03 s
        (0.25, "ms", "0.25 ms"),
        (0.0123, "coefficient", "0.0123"),
    ],
)
def test_a_facts_value_is_a_plain_number(value: float, unit: str, expected: str) -> None:
    from pgscope.analyze.model import Fact

    assert Fact("x", value, unit, "planted", "planted").shown() == expected


def test_top_queries_are_the_workloads_not_the_set_up_statements(tmp_path: Path) -> None:
    """Sampled inside a step's measured window: the workload. Outside it: pgbench's own
    start-up count(*) and what runs between steps, which are not among the top queries."""
    from pgscope.analyze.load import load_analysis
    from pgscope.duck import connect
    from pgscope.tables import written_by
    from tests.stores import measured_run

    run = measured_run(tmp_path / "20261124-000000-scaling-0000", [(1, 100.0), (2, 190.0)])
    start = 1_700_000_000_000_000
    rows = []
    for n in range(1, 1001):  # 50 Hz over 20 s: the two steps' windows are 10-15 s, 20-25 s
        ts = start + n * 20_000
        inside = any(w <= ts <= w + 5_000_000 for w in (start + 10_000_000, start + 20_000_000))
        query = 1 if inside else 2  # the UPDATE in the windows, count(*) outside them
        rows.append((ts, n, 100, "client backend", "active", None, None, query, "pgbench"))
    with contextlib.closing(connect(str(run / "run.duckdb"))) as db:
        db.execute("\n".join(t.ddl() for t in written_by("activity")))
        db.executemany(
            "INSERT INTO activity_samples (ts_us, sample_no, pid, backend_type, state, "
            "wait_event_type, wait_event, query_id, application_name) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        db.execute(
            "INSERT INTO activity_queries VALUES (1, 'UPDATE pgbench_accounts SET abalance = 1', "
            "0), (2, 'select count(*) from pgbench_branches', 0)"
        )
    analysis = load_analysis(run, bootstrap=0)
    assert analysis.waits is not None
    assert [q.query for q in analysis.waits.queries] == ["UPDATE pgbench_accounts SET abalance = 1"]
    # The overall profile still counts every sample: 500 of the 1000 were outside.
    assert analysis.waits.overall.samples == 1000
