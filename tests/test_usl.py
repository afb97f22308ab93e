"""USL/Amdahl/linear fitting: golden published fits, synthetic truths, warnings, CSV input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pgscope.analyze.usl import fit_usl, usl
from pgscope.analyze.uslinput import read_csv
from pgscope.errors import InputFileError
from tests.cli import one_line_error, pgscope
from tests.runs import DATA


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def test_cisco_reproduces_the_published_fit_via_cli() -> None:
    result = pgscope("fit", "usl", str(DATA / "cisco.csv"), "--json")
    assert result.returncode == 0, result.stderr
    fit = json.loads(result.stdout)
    # Published (least squares, unbounded): λ 995.6486, σ 0.02671591, κ 7.690945e-4.
    assert rel(fit["lambda"], 995.6486) < 0.01
    assert rel(fit["sigma"], 0.02671591) < 0.01
    assert rel(fit["kappa"], 7.690945e-4) < 0.01
    assert rel(fit["n_star"], 35.6) < 0.01
    assert rel(fit["x_max"], 12341) < 0.01
    assert fit["bounds_active"] == []  # the bounded fit equals the unbounded one
    assert rel(fit["unbounded"]["sigma"], fit["sigma"]) < 1e-6
    assert fit["best_model"] == "usl"
    lo, hi = fit["ci95"]["sigma"]
    assert lo < fit["sigma"] < hi


def test_specsdm91_peak() -> None:
    clients, throughput = read_csv(str(DATA / "specsdm91.csv"))
    fit = fit_usl(clients, throughput, bootstrap=0)
    assert rel(fit.n_star or 0, 96.5) < 0.01
    assert rel(fit.x_max or 0, 1884) < 0.01
    assert rel(fit.lam, 89.99) < 0.01
    assert fit.ci["sigma"] is None and "none" in fit.ci_method


def test_recovers_a_known_usl_curve_and_its_interval_covers_truth() -> None:
    rng = np.random.default_rng(7)
    n = np.repeat(np.array([1, 2, 4, 6, 8, 12, 16, 24, 32], dtype=float), 3)
    x = usl(n, 1000, 0.05, 0.002) * rng.normal(1, 0.02, len(n))
    fit = fit_usl(list(n), list(x), bootstrap=300)
    assert rel(fit.lam, 1000) < 0.05
    for name, truth in (("sigma", 0.05), ("kappa", 0.002)):
        lo, hi = fit.ci[name] or (0, 0)
        assert lo <= truth <= hi, f"{name}: {truth} not in {lo}..{hi}"
    assert fit.best_model == "usl"
    assert "peaks at N*≈" in fit.describe()


def test_amdahl_data_prefers_amdahl_and_says_contention() -> None:
    n = np.array([1, 2, 3, 4, 6, 8, 12, 16], dtype=float)
    x = usl(n, 500, 0.1, 0.0) * (1 + 0.002 * np.sin(n))
    fit = fit_usl(list(n), list(x), bootstrap=0)
    assert fit.best_model == "amdahl"
    assert fit.describe().startswith("contention-limited (Amdahl): 10.0% serialised")
    assert abs(fit.sigma - 0.1) < 0.01


def test_throughput_that_falls_from_the_first_client_is_not_called_a_share_above_100() -> None:
    n = np.array([1, 2, 4, 8, 16], dtype=float)
    x = usl(n, 1000, 1.3, 0.0) * (1 + np.array([0.01, -0.01, 0.02, -0.02, 0.01]))
    fit = fit_usl(list(n), list(x), bootstrap=0)
    assert fit.best_model == "amdahl" and fit.models["amdahl"].params["sigma"] > 1
    text = fit.describe()
    assert text.startswith("throughput does not grow with clients"), text
    assert "serialised," not in text and "%" not in text.split("(amdahl")[0], text


def test_linear_data_prefers_linear() -> None:
    n = np.array([1, 2, 3, 4, 5, 6, 7, 8], dtype=float)
    x = 100 * n * (1 + 0.001 * np.cos(n))
    fit = fit_usl(list(n), list(x), bootstrap=0)
    assert fit.best_model == "linear"
    assert fit.describe().startswith("scales linearly")


def test_warnings_few_points_superlinear_and_extrapolation() -> None:
    # Superlinear: per-client throughput grows with N; σ wants to be negative.
    fit = fit_usl([1, 2, 3, 4], [100, 260, 420, 560], bootstrap=0)
    text = " ".join(fit.warnings)
    assert "only 4 distinct client counts" in text
    assert "superlinear" in text and fit.unbounded["sigma"] < 0
    assert fit.sigma == 0 and "sigma" in fit.bounds_active
    # A tiny κ puts the peak far beyond the measured range.
    n = np.array([1, 2, 3, 4, 5, 6], dtype=float)
    far = fit_usl(list(n), list(usl(n, 100, 0.01, 0.0005)), bootstrap=0)
    assert far.n_star is not None and far.n_star > 12
    assert any("beyond 2× the largest measured N" in w for w in far.warnings)


def test_needs_three_client_counts() -> None:
    with pytest.raises(InputFileError, match="at least 3 distinct"):
        fit_usl([1, 1, 2, 2], [10, 11, 20, 21])


@pytest.mark.parametrize(
    "content",
    [
        "clients,throughput\n1,100\n2,190\n4,340\n8,500\n",
        "clients,tps\n1,100\n2,190\n4,340\n8,500\n",
        "N,X(N)\n1,100\n2,190\n4,340\n8,500\n",  # any header on two columns
        "1,100\n2,190\n4,340\n8,500\n",  # no header
        "1, 100\r\n\r\n2,190\r\n4,340\r\n8,500\r\n",  # spaces, CRLF, a blank line
        "date,tps,threads\n1,100,1\n1,190,2\n1,340,4\n1,500,8\n",  # named among others
    ],
)
def test_csv_shapes_that_mean_clients_then_throughput(tmp_path, content: str) -> None:
    path = tmp_path / "m.csv"
    path.write_text(content, newline="")
    assert read_csv(str(path)) == ([1, 2, 4, 8], [100, 190, 340, 500])


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("clients,when,value\n1,2,3\n", "cannot tell which columns are clients and throughput"),
        ("clients,throughput\n", "at least 3 distinct client counts"),
        ("clients,throughput\n1,10\n2,abc\n", ":3: expected two numbers"),
        ("clients,throughput\n0,10\n", ":2: clients must be >= 1"),
        ("", "empty file"),
    ],
)
def test_csv_errors_name_the_line(tmp_path, content: str, expected: str) -> None:
    path = tmp_path / "m.csv"
    path.write_text(content)
    result = pgscope("fit", "usl", str(path))
    assert result.returncode == 3
    assert expected in one_line_error(result)


def test_missing_csv_is_a_one_line_error(tmp_path) -> None:
    result = pgscope("fit", "usl", str(tmp_path / "nope.csv"))
    assert result.returncode == 3
    assert "cannot read" in one_line_error(result)
