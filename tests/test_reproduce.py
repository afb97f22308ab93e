"""Runs that can be reproduced and compared (issue 16): a run folder keeps the spec as it ran
(after flags), copies of its scripts and init SQL and the versions; `run --again` repeats it;
`runs` lists what each run was; `compare` says first whether two runs measured the same thing.

The server tests share one custom-script run and its repeat (a few seconds each: 1 s steps at
2 client counts, no collectors) and the session's reference run (select-only)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from pgscope.errors import ExitCode
from pgscope.labels import setting_label
from pgscope.runner.reproduce import keep_spec
from pgscope.spec import load_spec
from tests.cli import one_line_error, pgscope
from tests.stores import measured_run

SCRIPT = "\\set id random(1, 100)\nSELECT v FROM kv WHERE id = :id;\n"
SCHEMA = (
    "CREATE TABLE kv (id int PRIMARY KEY, v text);\n"
    "INSERT INTO kv SELECT g, md5(g::text) FROM generate_series(1, 100) g;\n"
)


def _inputs(folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    script, schema = folder / "lookup.sql", folder / "schema.sql"
    script.write_text(SCRIPT)
    schema.write_text(SCHEMA)
    for path in (folder, script, schema):
        path.chmod(0o755 if path.is_dir() else 0o644)  # the load's account reads them
    return script, schema


# -- without a server ---------------------------------------------------------------------------


def test_a_run_is_named_after_the_workload_the_flags_chose(tmp_path: Path) -> None:
    script, _ = _inputs(tmp_path)
    assert load_spec("scaling").spec.name == "scaling"
    by_script = load_spec(
        "scaling",
        overrides={"scripts": [str(script)], "workload": None},
        override_flags={"scripts": "--script", "workload": "--script"},
    ).spec
    assert by_script.name == "lookup" and by_script.workload_label() == "lookup.sql"
    mixed = load_spec(
        "scaling",
        overrides={"scripts": [f"{script}@3"]},
        override_flags={"scripts": "--script"},
    ).spec
    assert mixed.name == "select-only+lookup"
    assert mixed.workload_label() == "select-only + lookup.sql@3"
    builtin = load_spec(
        "scaling", overrides={"workload": "tpcb-like"}, override_flags={"workload": "--workload"}
    ).spec
    assert builtin.name == "scaling-tpcb-like"
    same = load_spec(
        "scaling", overrides={"workload": "select-only"}, override_flags={"workload": "--workload"}
    ).spec
    assert same.name == "scaling", "the recipe's own workload changes nothing"


def test_the_kept_spec_loads_back_as_the_run_ran_it(tmp_path: Path) -> None:
    """spec.toml is the effective spec: --quick, flags and --set applied, "auto" clients and
    the seed resolved, scripts and init SQL pointing at copies inside the folder."""
    script, schema = _inputs(tmp_path / "mine")
    loaded = load_spec(
        "scaling",
        quick=True,
        overrides={
            "scripts": [f"{script}@2"],
            "workload": None,
            "init_sql": str(schema),
            "scale": 0,
            "actions": [{"at": 1.0, "sql": "CHECKPOINT"}],
        },
        override_flags={"scripts": "--script", "workload": "--script"},
        extra_settings={"work_mem": "8MB", "pgscope.define.rows": "100"},
    )
    run_dir = tmp_path / "results" / "20261124-000000-lookup-0000"
    run_dir.mkdir(parents=True)
    keep_spec(run_dir, loaded, cores=2, seed=1234, command="pgscope run --script x")
    text = (run_dir / "spec.toml").read_text()
    assert text.startswith("# The spec of run 20261124-000000-lookup-0000")
    assert f"pgscope run --again {run_dir}" in text
    assert (run_dir / "inputs" / "lookup.sql").read_text() == SCRIPT
    assert (run_dir / "inputs" / "schema.sql").read_text() == SCHEMA
    raw = tomllib.loads(text)
    assert raw["scripts"] == ["inputs/lookup.sql@2"] and raw["init_sql"] == "inputs/schema.sql"
    assert "workload" not in raw and raw["seed"] == 1234
    assert raw["clients"] == loaded.spec.client_counts(2)

    script.unlink()  # the copy is what runs again, not the original
    again = load_spec(str(run_dir / "spec.toml"))
    original, kept = loaded.spec, again.spec
    assert kept.model_dump(exclude={"clients", "seed", "scripts", "init_sql"}) == (
        original.model_dump(exclude={"clients", "seed", "scripts", "init_sql"})
    )
    assert kept.clients == original.client_counts(2) and kept.seed == 1234
    assert [(s.path, s.weight) for s in again.scripts()] == [
        ((run_dir / "inputs" / "lookup.sql").resolve(), 2)
    ]
    assert again.init_sql_path() == (run_dir / "inputs" / "schema.sql").resolve()
    assert kept.settings == {"work_mem": "8MB", "pgscope.define.rows": "100"}


def test_run_again_refuses_what_is_not_a_run_folder_in_one_line(tmp_path: Path) -> None:
    plain_folder = tmp_path / "plain"
    plain_folder.mkdir()
    old_run = measured_run(tmp_path / "20261124-000000-scaling-0000", [(1, 100.0)])
    broken = measured_run(tmp_path / "20261124-000001-lookup-0000", [(1, 100.0)])
    (broken / "spec.toml").write_text('scripts = ["inputs/lookup.sql"]\nscale = 0\n')
    cases = {
        tmp_path / "nonesuch": "no such folder",
        plain_folder: "not a pgscope run folder (no run.duckdb)",
        old_run: "the folder has no spec.toml",
        broken: f"--again {broken}: script inputs/lookup.sql: no such file",
    }
    for folder, expected in cases.items():
        result = pgscope("run", "--again", str(folder), "--plan")
        assert result.returncode == ExitCode.SPEC, (folder, result.stderr)
        assert expected in one_line_error(result), folder
    both = pgscope("run", "scaling", "--again", str(old_run), "--plan")
    assert both.returncode == ExitCode.USAGE and "give one of them" in one_line_error(both)


def test_plan_shows_workload_and_target_and_refuses_what_the_run_refuses(tmp_path: Path) -> None:
    script, _ = _inputs(tmp_path)
    shown = pgscope("run", "--script", str(script), "--scale", "0", "--plan", "--json")
    assert shown.returncode == 0, shown.stderr
    plan = json.loads(shown.stdout)
    assert plan["recipe"] == "lookup" and plan["workload"] == "lookup.sql"
    assert plan["target"] == "embedded"
    text = pgscope("run", "--script", str(script), "--scale", "0", "--plan")
    assert "workload lookup.sql at scale 0" in text.stdout
    assert "target an embedded cluster" in text.stdout
    server = "host=127.0.0.1 port=1 dbname=bench"  # never contacted: the plan connects nowhere
    reading = pgscope("run", "--dsn", server, "--plan", "--json")
    assert reading.returncode == 0, reading.stderr
    assert set(json.loads(reading.stdout)["target"].split()) == set(server.split())
    # Kernel tracing attaches to a server's binary: on a user's server, only when named.
    assert "usdt" in plan["collectors"]
    assert "usdt" not in json.loads(reading.stdout)["collectors"]
    for refused in (["--workload", "tpcb-like"], ["--set", "work_mem=8MB"]):
        result = pgscope("run", "--dsn", server, *refused, "--plan")
        assert result.returncode == ExitCode.REFUSED, (refused, result.stderr)
        assert result.stdout == "", "nothing planned"


def test_settings_show_in_human_units() -> None:
    assert setting_label("964161", "8kB") == "7.36 GiB"
    assert setting_label("5121", "8kB") == "40 MiB"
    assert setting_label("300", "s") == "5 min"
    assert setting_label("200", "ms") == "200 ms"
    assert setting_label("1500", "ms") == "1500 ms"
    assert setting_label("-1", "kB") == "-1"
    assert setting_label("off", "") == "off"


def _store_run(folder: Path, spec: dict[str, Any], settings: list[tuple[str, str, str]]) -> Path:
    import duckdb

    measured_run(folder, [(1, 1000.0), (2, 1800.0)])
    db = duckdb.connect(str(folder / "run.duckdb"))
    db.execute("UPDATE run SET spec_json = ?, target_kind = 'embedded'", [json.dumps(spec)])
    for name, setting, unit in settings:
        db.execute(
            "INSERT INTO settings VALUES ('base', ?, ?, ?, 'configuration file', 0)",
            [name, setting, unit],
        )
    db.close()
    return folder


def test_compare_of_stored_runs_warns_and_normalises_settings(tmp_path: Path) -> None:
    base = [("shared_buffers", "964161", "8kB"), ("max_wal_size", "1024", "MB")]
    a = _store_run(
        tmp_path / "20261124-000000-scaling-0000",
        {"workload": "select-only", "scale": 10, "protocol": "prepared"},
        [*base, ("synchronous_commit", "off", "")],
    )
    b = _store_run(
        tmp_path / "20261124-000001-lookup-0000",
        {"workload": None, "scripts": ["/x/lookup.sql@1"], "scale": 0, "protocol": "prepared"},
        [("shared_buffers", "5121", "8kB"), ("max_wal_size", "1024", "MB")],
    )
    result = pgscope("compare", str(a), str(b))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith("warning: the runs differ in workload, scale:"), lines
    assert lines[2:4] == ["  workload: select-only → lookup.sql", "  scale: 10 → 0"]
    first_number = next(i for i, line in enumerate(lines) if "%" in line)
    assert first_number > 3
    assert "setting shared_buffers: 7.36 GiB → 40 MiB" in lines
    assert "setting synchronous_commit: off → (default)" in lines
    assert not any("max_wal_size" in line for line in lines), "equal settings are not listed"
    document = json.loads(pgscope("compare", str(a), str(b), "--json").stdout)
    assert document["warning"].startswith("the runs differ in workload, scale")
    assert document["differences"][:2] == [
        {"what": "workload", "a": "select-only", "b": "lookup.sql"},
        {"what": "scale", "a": 10, "b": 0},
    ]
    same = pgscope("compare", str(a), str(a))
    assert same.stdout.splitlines()[1].startswith("warning: A and B are the same run")
    assert same.stdout.splitlines()[2].startswith("same: workload select-only, scale 10")


# -- one custom-script run, and its repeat --------------------------------------------------------

QUICK = ["--clients", "1,2", "--repeats", "1", "--duration", "1", "--warmup", "0"]


@pytest.fixture(scope="module")
def script_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """`pgscope run --script lookup.sql --init-sql schema.sql --scale 0 --set work_mem=8MB`:
    2 steps of 1 s, no collectors. Its folder and JSON document."""
    script, schema = _inputs(tmp_path_factory.mktemp("inputs"))
    results = tmp_path_factory.mktemp("results")
    result = pgscope(
        *("run", "--script", str(script), "--init-sql", str(schema), "--scale", "0"),
        *(*QUICK, "--set", "work_mem=8MB", "--no-collectors", "--json"),
        *("--results-dir", str(results)),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    script.unlink()  # `--again` must run the folder's copies
    schema.unlink()
    doc = json.loads(result.stdout)
    return Path(doc["run_dir"]), doc


@pytest.fixture(scope="module")
def repeated_run(script_run: tuple[Path, dict[str, Any]]) -> tuple[Path, dict[str, Any], str]:
    """`pgscope run --again` of the script run, into the same results folder."""
    run_dir, _ = script_run
    result = pgscope("run", "--again", str(run_dir), "--json", "--results-dir", str(run_dir.parent))
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    return Path(doc["run_dir"]), doc, result.stderr


@pytest.mark.server
def test_a_script_runs_folder_holds_its_scripts_spec_and_versions(
    script_run: tuple[Path, dict[str, Any]],
) -> None:
    run_dir, doc = script_run
    assert doc["recipe"] == "lookup" and "-lookup-" in run_dir.name
    assert (run_dir / "inputs" / "lookup.sql").read_text() == SCRIPT
    assert (run_dir / "inputs" / "schema.sql").read_text() == SCHEMA
    spec = tomllib.loads((run_dir / "spec.toml").read_text())
    assert spec["scripts"] == ["inputs/lookup.sql@1"] and spec["init_sql"] == "inputs/schema.sql"
    assert spec["settings"] == {"work_mem": "8MB"} and spec["collectors"] == {}
    assert spec["clients"] == [1, 2] and spec["duration"] == 1 and spec["scale"] == 0
    assert doc["environment"]["spec"]["settings"] == {"work_mem": "8MB"}
    versions = json.loads((run_dir / "versions.json").read_text())
    assert versions["pgscope"] == doc["pgscope_version"]
    assert versions["server"] == doc["target"]["server_version"]
    assert versions["server"].startswith("PostgreSQL ") and versions["server_version_num"] > 0
    assert "pgbench (PostgreSQL)" in versions["pgbench"]


@pytest.mark.server
def test_run_again_repeats_the_same_steps_from_the_folder(
    script_run: tuple[Path, dict[str, Any]], repeated_run: tuple[Path, dict[str, Any], str]
) -> None:
    (first_dir, first), (again_dir, again, _) = script_run, repeated_run
    assert again_dir != first_dir and "-lookup-" in again_dir.name
    assert again["status"] == "complete" and again["recipe"] == "lookup"

    def steps(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [(s["step_id"], s["variant"], s["clients"], s["repeat"]) for s in doc["steps"]]

    assert steps(again) == steps(first) and len(steps(first)) == 2
    for doc in (first, again):  # 1 s steps, no warm-up, as the first run's flags said
        assert all(0.5e6 < s["window_end_us"] - s["window_start_us"] < 1.5e6 for s in doc["steps"])
    assert all(s["status"] == "ok" and s["tps"] > 0 for s in again["steps"])
    kept = tomllib.loads((again_dir / "spec.toml").read_text())
    assert kept == tomllib.loads((first_dir / "spec.toml").read_text())
    assert (again_dir / "inputs" / "lookup.sql").read_text() == SCRIPT
    assert again["environment"]["spec"]["settings"] == {"work_mem": "8MB"}


@pytest.mark.server
def test_runs_lists_name_target_workload_and_best_tps(
    script_run: tuple[Path, dict[str, Any]], repeated_run: tuple[Path, dict[str, Any], str]
) -> None:
    results = script_run[0].parent
    listed = pgscope("runs", "--results-dir", str(results), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["run_id"] for r in rows] == [repeated_run[1]["run_id"], script_run[1]["run_id"]]
    for row, (_, doc, *_) in zip(rows, (repeated_run, script_run), strict=True):
        assert row["name"] == "lookup" and row["target"] == "embedded"
        assert row["workload"] == "lookup.sql" and row["clients"] == [1, 2]
        best = max(c["tps_mean"] for c in doc["scalability"]["cells"])
        assert row["best_tps"] == pytest.approx(best, abs=0.1)
        assert row["verdict"] == doc["verdict"] and row["date"].endswith("Z")
    table = pgscope("runs", "--results-dir", str(results)).stdout.splitlines()
    assert table[0].split() == [
        *("date", "(UTC)", "name", "target", "workload", "clients", "best", "tps", "verdict")
    ]
    assert len(table) == 3
    assert all(" lookup " in line and "lookup.sql" in line for line in table[1:])


@pytest.mark.server
def test_compare_of_different_workloads_warns_before_any_number(
    reference_run: tuple[Path, dict[str, Any]], script_run: tuple[Path, dict[str, Any]]
) -> None:
    """The reference run (select-only at scale 2, shared_buffers=128MB) against the script
    run: the workloads differ, said with the difference before any percentage."""
    result = pgscope("compare", str(reference_run[0]), str(script_run[0]))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith("warning: the runs differ in workload, scale"), lines
    assert "  workload: select-only → lookup.sql" in lines[2:4]
    assert "  scale: 2 → 0" in lines[2:4]
    assert all("%" not in line for line in lines[:4])
    # The script run has the embedded cluster's own default (a share of the host's memory).
    assert any(line.startswith("setting shared_buffers: 128 MiB → ") for line in lines), lines
    assert "setting work_mem: (default) → 8 MiB" in lines
    document = json.loads(
        pgscope("compare", str(reference_run[0]), str(script_run[0]), "--json").stdout
    )
    assert [d["what"] for d in document["differences"]][:2] == ["workload", "scale"]
    assert document["runs"]["b"]["workload"] == "lookup.sql"
    assert document["warning"] is not None
