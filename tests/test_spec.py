"""Specs: recipes load, overrides layer, invalid input names the field and the reason."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from pgscope.errors import InputFileError, SpecError
from pgscope.runner.plan import plan_steps
from pgscope.runner.variants import effective_settings
from pgscope.spec import (
    auto_clients,
    load_spec,
    parse_client_list,
    parse_setting,
    recipe_names,
    setting_text,
)


@pytest.mark.parametrize("name", recipe_names())
@pytest.mark.parametrize("quick", [False, True])
def test_every_bundled_recipe_is_valid(name: str, quick: bool) -> None:
    loaded = load_spec(name, quick=quick)
    assert loaded.spec.description, f"recipe {name} needs a description for `pgscope recipes`"
    assert loaded.spec.client_counts(2)


def test_scaling_quick_has_enough_points_and_repeats_for_a_ci() -> None:
    spec = load_spec("scaling", quick=True).spec
    assert len(spec.client_counts(2)) >= 6 and 1 in spec.client_counts(2)
    assert spec.repeats >= 2
    planned = len(spec.client_counts(2)) * spec.repeats * (spec.duration + spec.warmup)
    assert planned < 150, "quick must leave room for set-up within 4 minutes"


def test_auto_clients_dense_near_the_knee_and_bounded() -> None:
    assert auto_clients(2) == [1, 2, 3, 4, 6, 8]
    many = auto_clients(64)
    assert many[0] == 1 and many[-1] == 256 and 64 in many
    assert len(many) < 45
    assert all(c in many for c in range(32, 129, 16))


def test_cli_overrides_win_over_quick_over_file(tmp_path: Path) -> None:
    spec_file = tmp_path / "s.toml"
    spec_file.write_text(
        'duration = 60\nclients = [1, 2]\n[quick]\nduration = 3\n[settings]\nwork_mem = "8MB"\n'
    )
    spec = load_spec(
        str(spec_file), quick=True, overrides={"clients": [4, 8]}, extra_settings={"jit": "off"}
    ).spec
    assert spec.duration == 3 and spec.clients == [4, 8]
    assert spec.settings == {"work_mem": "8MB", "jit": "off"}
    assert spec.name == "s"


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ("clients = [0, 2]", "field clients.0: Input should be greater than or equal to 1"),
        ("clients = [2, 2]", "client counts must be distinct"),
        ("duration = -1", "field duration: must be at least 1 s"),
        ("workload = 'tpcc'", "field workload: Input should be"),
        ("colour = 'red'", "unknown field 'colour'"),
        ("[collectors]\nmagic = {}", "unknown collector 'magic'"),
        ("collectors = ['magic']", "field collectors: Input should be a valid dictionary"),
        ("repeats = 'many'", "field repeats"),
        ("[variants]", "needs at least one variant"),
        ("clients = [1, 2", "malformed TOML"),
        ("scripts = ['missing.sql']", "script missing.sql: no such file"),
        ("workload = 'select-only'\ninit_sql = 'nope.sql'", "init_sql nope.sql: no such file"),
    ],
)
def test_invalid_specs_name_field_and_reason(tmp_path: Path, toml: str, expected: str) -> None:
    spec_file = tmp_path / "bad.toml"
    spec_file.write_text(toml + "\n")
    with pytest.raises(SpecError) as caught:
        load_spec(str(spec_file))
    message = str(caught.value)
    assert expected in message
    assert "\n" not in message


def test_flag_errors_name_the_flag() -> None:
    with pytest.raises(SpecError, match=r"^--clients: Input should be greater than or equal to 1"):
        load_spec("scaling", overrides={"clients": [0]}, override_flags={"clients": "--clients"})


def test_unknown_recipe_lists_the_known_ones() -> None:
    with pytest.raises(SpecError, match=r"unknown recipe 'nope'; available: .*scaling"):
        load_spec("nope")


def test_missing_spec_file() -> None:
    with pytest.raises(InputFileError, match="no such file"):
        load_spec("/nonexistent/x.toml")


def test_no_workload_at_all_is_an_error(tmp_path: Path) -> None:
    spec_file = tmp_path / "empty.toml"
    spec_file.write_text("workload = false\n")  # not a workload name either
    with pytest.raises(SpecError):
        load_spec(str(spec_file))
    with pytest.raises(SpecError, match="no workload"):
        load_spec("scaling", overrides={"workload": None})


def test_scripts_without_a_workload_mean_the_scripts_alone(tmp_path: Path) -> None:
    (tmp_path / "a.sql").write_text("select 1;\n")
    spec_file = tmp_path / "s.toml"
    spec_file.write_text("scripts = ['a.sql']\n")
    assert load_spec(str(spec_file)).spec.workload is None
    spec_file.write_text("scripts = ['a.sql']\nworkload = 'select-only'\n")
    assert load_spec(str(spec_file)).spec.workload == "select-only"


def test_scripts_resolve_relative_to_the_spec_with_weights(tmp_path: Path) -> None:
    (tmp_path / "a.sql").write_text("select 1;\n")
    spec_file = tmp_path / "s.toml"
    spec_file.write_text("workload = 'select-only'\nscripts = ['a.sql@3']\n")
    scripts = load_spec(str(spec_file)).scripts()
    assert scripts[0].path == (tmp_path / "a.sql").resolve() and scripts[0].weight == 3
    assert scripts[0].pgbench_arg().endswith("a.sql@3")


def test_client_list_parsing() -> None:
    assert parse_client_list("1,2,4-6") == [1, 2, 4, 5, 6]
    with pytest.raises(SpecError, match="--clients 'a-b'"):
        parse_client_list("a-b")
    with pytest.raises(SpecError, match="no client counts"):
        parse_client_list(",")
    assert parse_setting("work_mem = 8MB") == ("work_mem", "8MB")
    with pytest.raises(SpecError, match="expected NAME=VALUE"):
        parse_setting("work_mem")
    assert [setting_text(v) for v in (True, False, 4.0, 0.5, "x")] == ["on", "off", "4", "0.5", "x"]


def test_plan_interleaves_every_cell_once_per_repeat_block(tmp_path: Path) -> None:
    spec_file = tmp_path / "v.toml"
    spec_file.write_text(
        "clients = [1, 2, 3, 4]\nrepeats = 3\n[settings]\nwork_mem = '4MB'\n"
        "[variants]\na = {}\nb = {work_mem = '64MB', jit = false}\n"
    )
    spec = load_spec(str(spec_file)).spec
    steps = plan_steps(spec, cores=2, seed=1)
    assert len(steps) == 4 * 2 * 3
    assert [s.step_id for s in steps] == list(range(1, 25))
    cells = Counter((s.variant, s.clients) for s in steps)
    assert set(cells.values()) == {3}
    for repeat in (1, 2, 3):
        block = [s for s in steps if s.repeat == repeat]
        assert len(block) == 8 and len({(s.variant, s.clients) for s in block}) == 8
        # Cells of one variant stay together within a block (one restart per block at most).
        variants_in_order = [s.variant for s in block]
        assert variants_in_order == sorted(variants_in_order, key=variants_in_order.index)
    orders = {tuple((s.variant, s.clients) for s in plan_steps(spec, 2, seed)) for seed in range(5)}
    assert len(orders) > 1, "random order must depend on the seed"
    assert plan_steps(spec, 2, 1) == steps, "and be reproducible from it"
    sequential = plan_steps(spec.model_copy(update={"order": "sequential"}), 2, 1)
    assert [s.clients for s in sequential[:4]] == [1, 2, 3, 4]
    assert effective_settings(spec, "b") == {"work_mem": "64MB", "jit": "off"}
    assert effective_settings(spec, "a") == {"work_mem": "4MB"}


@pytest.mark.parametrize(
    ("name", "safe"),
    [("../../../tmp/x", "tmp-x"), (".hidden", "hidden"), ("a/b", "a-b"), ("", "custom"),
     ("x" * 65, "x" * 64), ("a b", "a-b"), ("..", "custom"), ("scaling", "scaling")],
)  # fmt: skip
def test_a_spec_name_is_one_path_component(tmp_path: Path, name: str, safe: str) -> None:
    """The name becomes the run folder's: it never reaches outside --results-dir."""
    spec = tmp_path / "escape.toml"
    spec.write_text(f'name = "{name}"\n')
    assert load_spec(str(spec)).spec.name == safe


def test_a_file_name_that_is_no_word_still_names_its_run(tmp_path: Path) -> None:
    spec = tmp_path / "my first test.toml"
    spec.write_text("clients = [1]\n")
    assert load_spec(str(spec)).spec.name == "my-first-test"


def test_a_reversed_client_range_says_so() -> None:
    with pytest.raises(SpecError, match=r"the range '8-1' is reversed: .*\(write 1-8\)"):
        parse_client_list("8-1")
    with pytest.raises(SpecError, match="'8--1' is not a count or range"):
        parse_client_list("8--1")
    with pytest.raises(SpecError, match="more than 10000 clients"):
        parse_client_list("1-99999999999999999999")
    assert parse_client_list("2 - 4") == [2, 3, 4]


def test_a_script_that_is_a_directory_or_has_a_bad_weight_says_which(tmp_path: Path) -> None:
    """Both used to say "no such file"."""
    (tmp_path / "x.sql").write_text("SELECT 1;\n")
    (tmp_path / "d.sql").mkdir()
    spec = tmp_path / "s.toml"
    cases = {
        "d.sql": (InputFileError, "script d.sql: is a directory, not a file"),
        "x.sql@-3": (SpecError, "weight '-3' must be a whole number >= 1"),
        "x.sql@0": (SpecError, "weight '0' must be a whole number >= 1"),
        "x.sql@1.5": (SpecError, "weight '1.5' must be a whole number >= 1"),
        "x.sql@abc": (InputFileError, "script x.sql@abc: no such file"),
        "nope.sql": (InputFileError, "script nope.sql: no such file"),
    }
    for script, (error, message) in cases.items():
        spec.write_text(f"scripts = ['{script}']\n")
        with pytest.raises(error, match=re.escape(message)):
            load_spec(str(spec))
    # A file whose name only looks like a weight is that file.
    (tmp_path / "y.sql@-3").write_text("SELECT 1;\n")
    spec.write_text("scripts = ['y.sql@-3']\n")
    assert load_spec(str(spec)).scripts()[0].path.name == "y.sql@-3"
    spec.write_text("init_sql = 'd.sql'\nscale = 0\n")
    with pytest.raises(InputFileError, match=r"init_sql d\.sql: is a directory, not a file"):
        load_spec(str(spec))
    with pytest.raises(InputFileError, match="is a directory, not a file"):
        load_spec(str(tmp_path / "d.sql") + "/")


@pytest.mark.parametrize("duration", [1e-9, 0.5, 0.999, float("nan"), 0, -1])
def test_a_step_shorter_than_a_second_is_refused(duration: float) -> None:
    """pgbench's -T counts whole seconds: --duration 1e-9 silently measured 1 s."""
    with pytest.raises(SpecError, match=r"^--duration: .*must be at least 1 s|^--duration: Input"):
        load_spec(
            "scaling", overrides={"duration": duration}, override_flags={"duration": "--duration"}
        )
    assert load_spec("scaling", overrides={"duration": 1}).spec.duration == 1


def test_an_action_after_the_steps_end_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "late.toml"
    spec.write_text('duration = 5\nwarmup = 1\nactions = [{at = 6, sql = "CHECKPOINT"}]\n')
    with pytest.raises(SpecError, match="after the step's end"):
        load_spec(str(spec))
    spec.write_text('duration = 5\nwarmup = 1\nactions = [{at = 5.5, sql = "CHECKPOINT"}]\n')
    assert load_spec(str(spec)).spec.actions[0].at == 5.5


def test_connect_flag_asks_pgbench_for_a_connection_per_transaction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--connect (spec: connect_per_transaction) gives pgbench -C, and one pgbench thread per
    client: pgbench connects synchronously, so a thread opening one client's connection would
    stall its other clients and add that time to their latency."""
    import json

    from pgscope.cli import main
    from pgscope.drive.pgbench import Workload

    spec_file = tmp_path / "c.toml"
    spec_file.write_text("clients = [8]\n")
    plain = load_spec(str(spec_file)).spec
    assert not plain.connect_per_transaction and plain.pgbench_threads(8, cores=2) == 2
    spec = load_spec(str(spec_file), overrides={"connect_per_transaction": True}).spec
    assert spec.pgbench_threads(8, cores=2) == 8
    pinned = spec.model_copy(update={"threads": 3})
    assert pinned.pgbench_threads(8, cores=2) == 3, "an explicit -j stands"
    assert "--connect" in Workload("select-only", (), "prepared", (), 1, True).args()
    assert "--connect" not in Workload("select-only", (), "prepared").args()
    assert main(["run", str(spec_file), "--connect", "--plan", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["connect_per_transaction"] is True
    assert main(["run", str(spec_file), "--plan", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["connect_per_transaction"] is False
