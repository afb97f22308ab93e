"""`pgscope compare` and the variants' comparison: intervals that respect what a ratio is
(never below -100%), "too few repeats to judge" where an interval says nothing, the model each
run's report chose, a run compared with itself, and the connection as the user gave it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pgscope.analyze.compare import (
    BEYOND_NOISE,
    TOO_FEW,
    WITHIN_NOISE,
    change_interval,
    compare_variants,
    judgement,
)
from pgscope.drive.readonly import guarded
from pgscope.labels import shown_conninfo
from pgscope.target.conn import ConnParams
from tests.cli import pgscope
from tests.stores import repeated_run

# Issue 30: 25,926 -> 137 tps, 2 repeats each, was "-603.8% … +404.8% │ within noise".
COLLAPSE_A = [36_000.0, 15_852.0]
COLLAPSE_B = [130.0, 144.0]
DSN = "host=db1 dbname=app"


def test_a_collapse_is_stated_with_an_interval_above_minus_100_percent() -> None:
    low, high = change_interval(COLLAPSE_B, COLLAPSE_A) or (0.0, 0.0)
    assert -100 < low < high < 0, (low, high)
    assert judgement((low, high)) == BEYOND_NOISE
    # The difference of the means over the baseline's mean, as it was computed before, falls
    # below -100%: what the log scale is for.
    mean_a = sum(COLLAPSE_A) / 2
    welch_low = (sum(COLLAPSE_B) / 2 - mean_a) - 12.7 * (
        ((COLLAPSE_A[0] - COLLAPSE_A[1]) ** 2 / 2 / 2 + (COLLAPSE_B[0] - COLLAPSE_B[1]) ** 2 / 4)
        ** 0.5
    )
    assert welch_low / mean_a * 100 < -100


@pytest.mark.parametrize(
    ("values", "reference", "expected"),
    [
        # Two repeats of each, means equal, each side's repeats 30% apart: the interval holds
        # no change, and a halving and a doubling alike.
        ([1000.0, 1300.0], [1300.0, 1000.0], TOO_FEW),
        # Five repeats each, 2% apart: it holds no change and rules out much else.
        ([1000, 1010, 990, 1005, 995], [1002, 998, 1008, 992, 1000], WITHIN_NOISE),
        # 10% faster, tightly measured.
        ([1100, 1102, 1098, 1101], [1000, 1001, 999, 1000], BEYOND_NOISE),
        # One repeat: no interval.
        ([1000.0], [900.0, 910.0], TOO_FEW),
    ],
)
def test_the_judgement_says_what_the_interval_allows(
    values: list[float], reference: list[float], expected: str
) -> None:
    interval = change_interval(values, reference)
    assert judgement(interval) == expected, interval
    if interval is not None:
        assert interval[0] > -100


def test_a_variant_that_measured_nothing_is_minus_100_percent_never_below() -> None:
    steps = [
        {"variant": v, "clients": 4, "status": "ok", "tps": t}
        for v, t in (("base", 1000.0), ("base", 1100.0), ("off", 0.0), ("off", 0.0))
    ]
    [c] = compare_variants(steps)
    assert c.change_pct == -100.0 and c.ci95_pct == (-100.0, -100.0)
    assert c.judgement == BEYOND_NOISE


def _runs(tmp_path: Path) -> tuple[Path, Path]:
    """A: 1-8 clients growing as Amdahl's law with σ 0.2 (the report chooses Amdahl), 2
    repeats each; B: the same server 100x slower."""
    cells_a, cells_b = [], []
    for clients in (1, 2, 3, 4, 6, 8):
        amdahl = 10_000 * clients / (1 + 0.2 * (clients - 1))
        for repeat, noise in ((1, 0.97), (2, 1.03)):
            cells_a.append((clients, repeat, amdahl * noise))
            cells_b.append((clients, repeat, amdahl * noise / 100 * (1.1 if repeat == 1 else 0.9)))
    # As the runner stores a --dsn's connection: with the read-only guard pgscope adds.
    stored = guarded(ConnParams.from_dsn(DSN)).conninfo()
    assert "default_transaction_read_only" in stored
    a = repeated_run(tmp_path / "20261126-000000-scaling-aaaa", cells_a, stored)
    b = repeated_run(tmp_path / "20261126-000001-scaling-bbbb", cells_b, stored)
    return a, b


def test_compare_of_a_100x_collapse_never_says_within_noise(tmp_path: Path) -> None:
    a, b = _runs(tmp_path)
    result = pgscope("compare", str(a), str(b))
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if re.match(r"\s*base\s", line)]
    assert len(rows) == 6, result.stdout
    for row in rows:
        assert "within noise" not in row, row
        low = float(re.findall(r"([+-]\d+\.\d)% …", row)[0])
        assert low > -100, row
        assert row.rstrip().endswith((BEYOND_NOISE, TOO_FEW)), row
    document = json.loads(pgscope("compare", str(a), str(b), "--json").stdout)
    for c in document["throughput"]:
        assert c["ci95_pct"][0] > -100 and c["judgement"] != WITHIN_NOISE, c
        assert c["change_pct"] == pytest.approx(-99, abs=0.5)


def test_compare_shows_the_model_each_report_chose(tmp_path: Path) -> None:
    a, b = _runs(tmp_path)
    report = pgscope("report", str(a))
    assert report.returncode == 0, report.stderr
    assert "amdahl" in report.stdout.lower(), report.stdout
    result = pgscope("compare", str(a), str(b))
    [line] = [ln for ln in result.stdout.splitlines() if ln.startswith("model base:")]
    # Amdahl has no κ: the USL's κ of a model the report did not choose is not shown.
    assert line.startswith("model base: amdahl (σ 0.2"), line
    assert "κ" not in line, line
    document = json.loads(pgscope("compare", str(a), str(b), "--json").stdout)
    [model] = document["models"]
    assert model["model_a"] == "amdahl" and model["sigma_a"] == pytest.approx(0.2, abs=0.02)
    assert model["kappa_a"] == 0.0 and model["n_star_a"] is None


def test_compare_of_a_run_with_itself_warns_and_shows_the_users_connection(
    tmp_path: Path,
) -> None:
    a, _ = _runs(tmp_path)
    result = pgscope("compare", str(a), str(a))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith(f"warning: A and B are the same run ({a.name})"), lines[:3]
    assert "default_transaction_read_only" not in result.stdout, result.stdout
    users = ConnParams.from_dsn(DSN).conninfo()
    assert f"target {users}," in result.stdout, result.stdout
    document = json.loads(pgscope("compare", str(a), str(a), "--json").stdout)
    assert document["warning"].startswith("A and B are the same run")
    assert document["runs"]["a"]["target"] == users


@pytest.mark.parametrize(
    ("stored", "shown"),
    [
        ("host=db1 options='-c default_transaction_read_only=on'", "host=db1"),
        (
            "host=db1 options='-c work_mem=8MB -c default_transaction_read_only=on'",
            "host=db1 options='-c work_mem=8MB'",
        ),
        ("dbname=app host=db1", "dbname=app host=db1"),
        (None, None),
    ],
)
def test_the_read_only_guard_is_pgscope_s_not_the_users(stored: str | None, shown: str) -> None:
    assert shown_conninfo(stored) == shown
