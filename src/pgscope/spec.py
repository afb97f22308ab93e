"""Experiment specs: declarative TOML, bundled recipes, CLI overrides and validation.

An experiment is data. A recipe is a bundled TOML file; a user's file has the same shape.
Layering, last wins: spec file -> its `[quick]` table (with --quick) -> command-line flags.
Validation names the field (or the flag that set it) and the reason, on one line.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import stat
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from pgscope.errors import EnvironmentProblem, InputFileError, SpecError
from pgscope.labels import split_weight, workload_label
from pgscope.words import n_clients


def safe_name(name: str) -> str:
    """A spec's name as one path component: it names the run folder, inside the results
    folder (`../../x` is `x`, `my test` is `my-test`)."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", name).strip(".-")[:64] or "custom"


BUILTIN_WORKLOADS = ("select-only", "tpcb-like", "simple-update")
# Builtins that modify data: refused on a user's server without --allow-writes.
WRITE_WORKLOADS = frozenset({"tpcb-like", "simple-update"})

SettingValue = str | int | float | bool

# A run folder's copies of the files its spec names (runner/reproduce.py keeps them).
INPUTS_DIR = "inputs"

# Reserved keys in `settings` and variants: how pgscope runs the cluster, not server settings.
PGSCOPE_KEYS = {
    "pgscope.cpus": "pin the server (postmaster and every process it starts) to this many "
    "CPUs; pgbench runs on the others where any are left",
    "pgscope.instances": "run this many clusters side by side, each with the same data and "
    "settings, and split each step's clients between them",
}
MAX_CLIENTS = 10000
# Server settings that are pgscope's alone on the clusters it starts: where the cluster listens
# and who may connect (it admits only its owner, target/embedded.py), which files it is made
# of or writes outside its data directory, which programs it runs and what code it loads. A
# spec or --set naming one is refused, not ignored: the run would not be what it says.
RESERVED_SETTINGS = {
    **dict.fromkeys(
        (
            "listen_addresses",
            "port",
            "unix_socket_directories",
            "unix_socket_group",
            "unix_socket_permissions",
            "hba_file",
            "ident_file",
            "krb_server_keyfile",
            "krb_caseins_users",
            "gss_accept_delegation",
            "db_user_namespace",
            "oauth_validator_libraries",
        ),
        "where the cluster listens and who may connect",
    ),
    **dict.fromkeys(
        (
            "config_file",
            "data_directory",
            "external_pid_file",
            "log_directory",
            "log_filename",
            "stats_temp_directory",
        ),
        "which files the cluster is made of and writes",
    ),
    **dict.fromkeys(
        (
            "archive_command",
            "archive_cleanup_command",
            "restore_command",
            "recovery_end_command",
            "ssl_passphrase_command",
        ),
        "which programs the cluster runs",
    ),
    **dict.fromkeys(
        (
            "archive_library",
            "dynamic_library_path",
            "jit_provider",
            "extension_control_path",
            "extension_destdir",
        ),
        "what code the cluster loads",
    ),
    **dict.fromkeys(
        ("primary_conninfo", "primary_slot_name"),
        "where a standby connects",
    ),
}
RESERVED_PREFIXES = {"ssl": "the cluster's TLS: who may connect, and which programs it runs"}
# Preloaded libraries: only these, which pgscope's collectors load themselves (a name, never
# a path: the server looks for it in its own library folder).
PRELOAD_SETTINGS = (
    "shared_preload_libraries",
    "session_preload_libraries",
    "local_preload_libraries",
)
PRELOADABLE = frozenset({"pg_stat_statements", "auto_explain", "pg_wait_sampling"})
# Steps in one run: 10,000 of a second each take seven hours; beyond, the plan itself (and its
# JSON) would fill the memory before anything ran (--clients 1-10000 --repeats 1000 did).
MAX_STEPS = 10000
# The shortest measured step: pgbench's -T counts whole seconds from 1.
MIN_DURATION_S = 1.0
# `pgscope.define.NAME = value` in settings or a variant: pgbench -D NAME=value (a variable
# the scripts read as :NAME).
DEFINE_PREFIX = "pgscope.define."


@dataclass(frozen=True)
class ScriptRef:
    """A pgbench script file with its weight (`FILE[@weight]`)."""

    path: Path
    weight: int = 1

    def pgbench_arg(self) -> str:
        return f"{self.path}@{self.weight}"

    @classmethod
    def parse(cls, text: str, base_dir: Path) -> ScriptRef:
        name, sep, weight_text = text.rpartition("@")
        if not sep or not weight_text.isdigit():
            # `x.sql@-3` or `x.sql@1.5` is a bad weight, not a file of that name (unless
            # there is one): said as such, where "no such file" would send the user looking.
            whole = bundled_or(Path(os.path.expanduser(text)), base_dir)
            if sep and _WEIGHTISH.fullmatch(weight_text) and not whole.exists():
                raise SpecError(
                    f"script {text!r}: weight {weight_text!r} must be a whole number >= 1"
                )
            name, weight = text, 1
        else:
            weight = int(weight_text)
            if weight < 1:
                raise SpecError(
                    f"script {text!r}: weight {weight_text!r} must be a whole number >= 1"
                )
        path = bundled_or(Path(os.path.expanduser(name)), base_dir)
        problem = not_a_file(path)
        if problem:
            raise InputFileError(f"script {name}: {problem}")
        return cls(path.resolve(), weight)


# What a weight after `@` looks like when it is not a whole number >= 1.
_WEIGHTISH = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?", re.IGNORECASE)


def not_a_file(path: Path) -> str | None:
    """Why `path` cannot be read as an input file (a directory, nothing there), or None."""
    if path.is_dir():
        return "is a directory, not a file"
    if not path.is_file():
        return f"no such file (looked in {path.parent})"
    return None


def bundled_or(path: Path, base_dir: Path) -> Path:
    """`path` against `base_dir`; a bare file name missing there may be one of the scripts
    bundled with the recipes (`pgscope recipes --scripts` lists them)."""
    resolved = path if path.is_absolute() else base_dir / path
    bundled = _recipes_dir() / "scripts" / path.name
    if not resolved.exists() and path.name == str(path) and bundled.is_file():
        return bundled
    return resolved


def _one_base_variant() -> dict[str, dict[str, SettingValue]]:
    return {"base": {}}


@dataclass(frozen=True)
class Objective:
    """A latency objective, `p99<5ms`: the quantile of latency (counted from each
    transaction's scheduled start) that must stay below the threshold."""

    name: str  # as pgscope writes it: p99<5ms, p99.9<20ms
    quantile: float  # 0.99
    threshold_ms: float

    @classmethod
    def parse(cls, text: str) -> Objective:
        """`p99<5ms`, `p99.9 < 0.02s`, `p50<800us`; a ValueError saying what is wrong."""
        found = _OBJECTIVE.fullmatch(text.strip())
        if found is None:
            raise ValueError(
                f"{text!r} is not an objective: expected pNN<LATENCY, a percentile of latency "
                f"below a threshold, e.g. p99<5ms, p99.9<20ms, p50<800us"
            )
        percent, value = float(found["p"]), float(found["t"])
        unit = found["unit"].lower()
        threshold = value * {"ms": 1.0, "s": 1000.0, "us": 0.001, "µs": 0.001}[unit]
        if not 0 < percent < 100:
            raise ValueError(f"{text!r}: the percentile must be above 0 and below 100")
        if not threshold > 0:
            raise ValueError(f"{text!r}: the latency must be above 0")
        return cls(f"p{percent:g}<{threshold:g}ms", round(percent / 100, 6), threshold)


_OBJECTIVE = re.compile(
    r"p(?P<p>\d+(?:\.\d+)?)\s*<\s*(?P<t>\d+(?:\.\d+)?)\s*(?P<unit>ms|s|us|µs)", re.IGNORECASE
)


@dataclass(frozen=True)
class OfferedRate:
    """One offered rate of the open-loop steps: transactions per second, or a share of the
    highest mean tps the run's closed-loop sweep measured (its peak)."""

    tps: float | None = None
    share_of_peak: float | None = None

    @property
    def label(self) -> str:
        if self.share_of_peak is not None:
            return f"{self.share_of_peak:.0%} of the peak"
        return f"{self.tps:,.0f} tps"

    def resolve(self, peak_tps: float | None) -> float | None:
        """The rate in tps (None: a share of a peak that was not measured)."""
        if self.share_of_peak is None:
            return self.tps
        return None if not peak_tps else self.share_of_peak * peak_tps


class StepAction(BaseModel):
    """SQL run at a fixed time into every step, e.g. a CHECKPOINT 10 s in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: Annotated[float, Field(ge=0, description="seconds after the step's load starts")]
    sql: Annotated[str, Field(min_length=1)]


class Spec(BaseModel):
    """One experiment. Field docs double as the reference in docs/spec.md."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    description: str = ""
    # Load: a pgbench builtin, custom script files, or both (pgbench mixes them by weight).
    workload: Literal["select-only", "tpcb-like", "simple-update"] | None = "select-only"
    scripts: list[str] = Field(default_factory=list, description="FILE[@weight], pgbench syntax")
    init_sql: str | None = None  # run once before the first step
    scale: Annotated[int, Field(ge=0)] = 10  # pgbench -i scale; 0 = no pgbench tables needed
    protocol: Literal["simple", "extended", "prepared"] = "prepared"
    # pgbench --max-tries: how often a transaction that failed with a serialization or
    # deadlock error is tried in all; 1 = never retried, 0 = until it succeeds or the step ends.
    max_tries: Annotated[int, Field(ge=0, le=1000)] = 1
    # pgbench -C: each transaction opens its own connection and closes it, as an application
    # without a connection pool does.
    connect_per_transaction: bool = False
    # Steps: every (variant, clients) cell is measured `repeats` times.
    clients: list[Annotated[int, Field(ge=1, le=MAX_CLIENTS)]] | Literal["auto"] = "auto"
    duration: Annotated[float, Field(le=86400)] = 30.0  # measured seconds per step, >= 1
    warmup: Annotated[float, Field(ge=0, le=3600)] = 5.0  # seconds run first and not counted
    repeats: Annotated[int, Field(ge=1, le=1000)] = 3
    order: Literal["random", "sequential"] = "random"
    seed: int | None = None
    threads: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"  # pgbench -j
    # Server settings for every variant, then per-variant overrides (embedded clusters only).
    settings: dict[str, SettingValue] = Field(default_factory=dict)
    variants: dict[str, dict[str, SettingValue]] = Field(default_factory=_one_base_variant)
    # Evidence collectors and their options, e.g. {activity = {hz = 50}}. Absent: every
    # collector marked default_in_runs; {} : none.
    collectors: dict[str, dict[str, Any]] | None = None
    # Local streaming standbys of the embedded primary, named s1, s2, ... (for synchronous
    # replication: synchronous_standby_names = "FIRST 1 (s1, s2)" in settings or variants).
    standbys: Annotated[int, Field(ge=0, le=8)] = 0
    # The variant the others are compared with (default: the first).
    baseline: str | None = None
    # Variants cpus-K pinning the server to K CPUs, added to the declared ones: a list of K,
    # or "auto" (1 .. the usable CPUs). Needs at least 2 usable CPUs.
    cpu_sweep: list[Annotated[int, Field(ge=1)]] | Literal["auto"] | None = None
    # SQL at known times into every step (warm-up included in `at`): [{at = 10, sql = "..."}].
    actions: list[StepAction] = Field(default_factory=list)
    # Open loop, after the closed-loop sweep: offered rates (pgbench -R), each in tps or as a
    # share of the sweep's peak ("20%"), or one text as --rate takes it ("20%-120%").
    rates: list[float | str] = Field(default_factory=list)
    # The clients driving the rates, a pool: "auto" = the sweep's highest client count.
    rate_clients: Annotated[int, Field(ge=1, le=MAX_CLIENTS)] | Literal["auto"] = "auto"
    # Latency objectives of the open-loop steps, "p99<5ms": the capacity is the highest rate
    # meeting each; the largest threshold is pgbench's --latency-limit.
    slo: list[str] = Field(default_factory=list)

    @field_validator("clients")
    @classmethod
    def _clients_distinct(cls, value: list[int] | str) -> list[int] | str:
        if isinstance(value, list):
            if not value:
                raise ValueError("needs at least one client count")
            if len(set(value)) != len(value):
                raise ValueError("client counts must be distinct")
        return value

    @field_validator("duration")
    @classmethod
    def _duration_a_second_or_more(cls, value: float) -> float:
        # pgbench's -T takes whole seconds, at least 1: a shorter step would still run, and be
        # measured over, a second.
        if not value >= MIN_DURATION_S:  # NaN too
            raise ValueError(
                f"must be at least {MIN_DURATION_S:g} s: pgbench runs whole seconds, so a "
                f"shorter step would still measure {MIN_DURATION_S:g} s"
            )
        return value

    @field_validator("scripts", "init_sql")
    @classmethod
    def _paths_without_nul(cls, value: list[str] | str | None) -> list[str] | str | None:
        # No file name holds a NUL: a received spec's `a\u0000b.sql` reached os.lstat, an
        # internal ValueError.
        for text in [value] if isinstance(value, str) else value or []:
            if "\x00" in text:
                raise ValueError("a file name cannot hold a NUL character")
        return value

    @field_validator("name")
    @classmethod
    def _name_is_one_path_component(cls, value: str) -> str:
        # The name becomes part of the run folder's name: it must never reach outside it.
        return safe_name(value)

    @field_validator("variants")
    @classmethod
    def _variants_named(
        cls, value: dict[str, dict[str, SettingValue]]
    ) -> dict[str, dict[str, SettingValue]]:
        if not value:
            raise ValueError("needs at least one variant (use {base = {}} for none)")
        for name, settings in value.items():
            if not name or not name.replace("-", "_").replace(".", "_").isidentifier():
                raise ValueError(f"variant name {name!r} must be a simple word")
            _check_pgscope_keys(settings, f"variant {name!r}")
        return value

    @model_validator(mode="after")
    def _actions_inside_the_step(self) -> Spec:
        # An action after the load has stopped would run on an idle server: never measured.
        for action in self.actions:
            if action.at >= self.warmup + self.duration:
                raise ValueError(
                    f"action at {action.at:g} s ({action.sql[:40]!r}) is after the step's end "
                    f"(warmup {self.warmup:g} s + duration {self.duration:g} s)"
                )
        return self

    @field_validator("rates", mode="before")
    @classmethod
    def _rates_parsed(cls, value: Any) -> Any:
        items = [value] if isinstance(value, str | int | float) else value
        if not isinstance(items, list):
            return value  # validation names the type
        rates: list[float | str] = []
        for item in items:
            if isinstance(item, bool) or not isinstance(item, str | int | float):
                raise ValueError(f"{item!r} is not a rate: a number of tps or a share such as 20%")
            if isinstance(item, str):
                rates += parse_rates(item).texts()
            elif not (math.isfinite(item) and item > 0):
                raise ValueError(f"rate {item!r} must be a number of tps above 0")
            elif item > MAX_RATE_TPS:
                raise ValueError(_TOO_FAST.format(rate=f"{item:g}"))
            else:
                rates.append(float(item))
        if len(set(rates)) != len(rates):
            raise ValueError("offered rates must be distinct")
        return rates

    @field_validator("slo")
    @classmethod
    def _objectives_parsed(cls, value: list[str]) -> list[str]:
        names = [Objective.parse(text).name for text in value]
        if len(set(names)) != len(names):
            raise ValueError("objectives must be distinct")
        return names

    @model_validator(mode="after")
    def _baseline_is_a_variant(self) -> Spec:
        if self.baseline is not None and self.baseline not in self.variants:
            raise ValueError(
                f"baseline {self.baseline!r} is not one of the variants "
                f"({', '.join(self.variants)})"
            )
        return self

    @field_validator("settings")
    @classmethod
    def _settings_keys(cls, value: dict[str, SettingValue]) -> dict[str, SettingValue]:
        _check_pgscope_keys(value, "settings")
        return value

    @field_validator("collectors")
    @classmethod
    def _collectors_known(
        cls, value: dict[str, dict[str, Any]] | None
    ) -> dict[str, dict[str, Any]] | None:
        from pgscope.collect import validate_options

        for name, options in (value or {}).items():
            problem = validate_options(name, options)
            if problem:
                raise ValueError(problem)
        return value

    def collector_selection(self) -> dict[str, dict[str, Any]]:
        from pgscope.collect import default_selection

        return default_selection() if self.collectors is None else dict(self.collectors)

    def workload_label(self) -> str:
        """What the load is, in a few words: "select-only", "insert.sql", "select-only +
        mine.sql@3"."""
        return workload_label(self.workload, self.scripts)

    def client_counts(self, cores: int) -> list[int]:
        """The client list, resolving "auto" against the host's core count."""
        if self.clients == "auto":
            return auto_clients(cores)
        return sorted(self.clients)

    def variant(self, name: str) -> dict[str, SettingValue]:
        """The settings variant `name` runs with: the spec's `settings` with the variant's own
        over them, as TOML values (`setting_text` gives PostgreSQL's syntax).

        pgscope's keys (`pgscope.cpus`, `pgscope.instances`, `pgscope.define.NAME`) are kept:
        they are read from this same merge, so a variant can override the spec's. A new dict
        each call. Raises KeyError when `name` is not one of the variants.
        """
        return {**self.settings, **self.variants[name]}

    def offered_rates(self) -> list[OfferedRate]:
        """The open-loop steps' rates, as given (shares resolve against the peak)."""
        return [
            OfferedRate(share_of_peak=float(r[:-1]) / 100)
            if isinstance(r, str)
            else OfferedRate(tps=float(r))
            for r in self.rates
        ]

    def rate_client_count(self, cores: int) -> int:
        """The clients that drive the rates: the spec's, or the widest pool the sweep
        measured (its closed-loop latency is then beside the rates')."""
        if self.rate_clients == "auto":
            return max(self.client_counts(cores))
        return self.rate_clients

    def objectives(self) -> list[Objective]:
        return [Objective.parse(text) for text in self.slo]

    def latency_limit_ms(self) -> float | None:
        """pgbench's --latency-limit for the rates: the largest objective's threshold, so a
        transaction skipped for being later than it misses every objective."""
        return max((o.threshold_ms for o in self.objectives()), default=None)

    def pgbench_threads(self, clients: int, cores: int) -> int:
        if self.threads == "auto" and self.connect_per_transaction:
            # pgbench connects synchronously: a thread opening one client's connection stalls
            # its other clients, whose latency would then count that connection time too.
            return clients
        if self.threads == "auto":
            return max(1, min(clients, cores))
        return min(self.threads, clients)


def _workload_name(raw: dict[str, Any], file_workload: Any, flags: dict[str, str]) -> str | None:
    """The run's name when the command line replaced the spec's workload: the scripts' names
    (`insert+select`), or the spec's name with the builtin (`scaling-tpcb-like`). None: the
    spec's workload stands, and so does its name."""
    if flags.get("scripts") == "--script":
        stems = [Path(split_weight(s)[0]).stem for s in raw.get("scripts") or []]
        builtin = [raw["workload"]] if isinstance(raw.get("workload"), str) else []
        return "+".join(dict.fromkeys([*builtin, *stems]))
    workload = raw.get("workload")
    if flags.get("workload") == "--workload" and workload != file_workload:
        return f"{raw.get('name')}-{workload}"
    return None


def reserved_setting(name: str, value: SettingValue) -> str | None:
    """Why a spec may not set `name` to `value` (RESERVED_SETTINGS), or None. Names are
    compared as the server does: without case."""
    key = name.strip().lower()
    why = RESERVED_SETTINGS.get(key)
    if why is None:
        why = next((w for p, w in RESERVED_PREFIXES.items() if key.startswith(p)), None)
    if why is not None:
        return f"{name} is set by pgscope alone ({why}); a spec cannot change it"
    if key in PRELOAD_SETTINGS:
        libraries = [lib.strip().strip('"') for lib in setting_text(value).split(",")]
        others = [lib for lib in libraries if lib and lib not in PRELOADABLE]
        if others:
            return (
                f"{name}: {', '.join(map(repr, others))} is not a library pgscope loads "
                f"(a spec may preload only {', '.join(sorted(PRELOADABLE))})"
            )
    return None


def _check_reserved(settings: dict[str, SettingValue], where: str) -> None:
    for name, value in settings.items():
        problem = reserved_setting(name, value)
        if problem:
            raise ValueError(f"{where}: {problem}")


def _check_pgscope_keys(settings: dict[str, SettingValue], where: str) -> None:
    _check_reserved(settings, where)
    for key, value in settings.items():
        if not key.startswith("pgscope."):
            continue
        if key.startswith(DEFINE_PREFIX):
            name = key[len(DEFINE_PREFIX) :]
            if not name.isidentifier():
                raise ValueError(f"{where}: {key}: {name!r} is not a pgbench variable name")
            continue
        if key not in PGSCOPE_KEYS:
            known = ", ".join([*PGSCOPE_KEYS, f"{DEFINE_PREFIX}NAME"])
            raise ValueError(f"{where}: unknown key {key!r} (known: {known})")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: {key} must be a whole number >= 1, got {value!r}")


def auto_clients(cores: int) -> list[int]:
    """1 .. ~4x cores, dense around the expected knee (the core count).

    Every integer up to 2x cores for small hosts; beyond that a geometric spread, so a
    64-core host gets ~20 points rather than 256.
    """
    cores = max(1, cores)
    upper = 4 * cores
    points = {1, cores, 2 * cores, 3 * cores, upper}
    dense_step = max(1, cores // 4)
    points.update(range(max(1, cores // 2), 2 * cores + 1, dense_step))
    n = 1.0
    while n < upper:
        points.add(round(n))
        n *= 1.5 if cores > 4 else 2
    return sorted(p for p in points if 1 <= p <= upper)


@dataclass(frozen=True)
class LoadedSpec:
    """A validated spec plus where it came from (for messages and the run store)."""

    spec: Spec
    source: str  # "recipe scaling" or a file path
    base_dir: Path  # where relative script paths resolve
    toml_text: str
    # `run --again`: the run folder whose spec.toml this is. A folder may come from someone
    # else; the files it names are then only its own copies (kept_input).
    kept_in: Path | None = None
    flagged: frozenset[str] = frozenset()  # fields the command line set

    def scripts(self) -> list[ScriptRef]:
        for text in self.spec.scripts:
            self._kept_input("scripts", "script", split_weight(text)[0])
        return [ScriptRef.parse(s, self.base_dir) for s in self.spec.scripts]

    def init_sql_path(self) -> Path | None:
        if self.spec.init_sql is None:
            return None
        self._kept_input("init_sql", "init_sql", self.spec.init_sql)
        path = bundled_or(Path(os.path.expanduser(self.spec.init_sql)), self.base_dir)
        problem = not_a_file(path)
        if problem:
            raise InputFileError(f"init_sql {self.spec.init_sql}: {problem}")
        return path.resolve()

    @property
    def own_collectors(self) -> bool:
        """Whether the collector selection is the user's own: their spec file's, or their
        --collectors; not that of a run folder's spec.toml run again (someone else's file),
        unless the command line replaced it."""
        return self.kept_in is None or "collectors" in self.flagged

    def _kept_input(self, field: str, what: str, text: str) -> None:
        """Under `run --again`, a file the folder's spec.toml names (not one the command line
        does) must be one of the folder's own copies, `inputs/NAME`: a regular file, in an
        inputs/ that is a folder, neither a link. Else InputFileError naming it: a received
        folder's spec.toml naming `/root/secret` made root copy that file into the new run's
        inputs/ and pgbench's errors."""
        if self.kept_in is None or field in self.flagged:
            return
        inputs = self.kept_in / INPUTS_DIR
        parts = Path(text).parts
        ok = len(parts) == 2 and parts[0] == INPUTS_DIR and parts[1] not in (".", "..")
        if ok:
            with contextlib.suppress(OSError):
                folder, file = os.lstat(inputs), os.lstat(inputs / parts[1])
                ok = stat.S_ISDIR(folder.st_mode) and stat.S_ISREG(file.st_mode)
        if not ok:
            raise InputFileError(
                f"{what} {text} is not a file of {inputs}/ (a run folder runs again only "
                f"with its own copies of its files)"
            )


# ---------------------------------------------------------------------------------------------
# Recipes


def _recipes_dir() -> Path:
    return Path(str(resources.files("pgscope") / "recipes"))


def recipe_names() -> list[str]:
    return sorted(p.stem for p in _recipes_dir().glob("*.toml"))


def recipe_path(name: str) -> Path:
    path = _recipes_dir() / f"{name}.toml"
    if not path.is_file():
        available = ", ".join(recipe_names())
        raise SpecError(f"unknown recipe {name!r}; available: {available} (see: pgscope recipes)")
    return path


def recipe_summary(name: str) -> str:
    raw = _parse_toml(recipe_path(name).read_text(), f"recipe {name}")
    return str(raw.get("description", "")).strip().splitlines()[0] if raw.get("description") else ""


# ---------------------------------------------------------------------------------------------
# Loading and overriding


def _parse_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{source}: malformed TOML: {exc}") from None


def _format_validation_error(exc: ValidationError, source: str, flags: dict[str, str]) -> str:
    """One line: where (field path, or the flag that set it) and why, for the first error."""
    error = exc.errors()[0]
    loc = [str(part) for part in error["loc"]]
    # pydantic reports union members in the path ("list[...]", "literal[...]"): drop them.
    loc = [p for p in loc if not p.startswith(("list[", "literal[", "int", "str", "float", "bool"))]
    field = loc[0] if loc else ""
    where = flags.get(field, f"{source}: field {'.'.join(loc) or '(top level)'}")
    if error["type"] == "extra_forbidden":
        return f"{source}: unknown field {'.'.join(loc)!r}"
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    value = error.get("input")
    shown = f" (got {value!r})" if value is not None and not isinstance(value, dict) else ""
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{where}: {message}{shown}{more}"


def load_spec(
    name_or_path: str,
    *,
    quick: bool = False,
    overrides: dict[str, Any] | None = None,
    override_flags: dict[str, str] | None = None,
    extra_settings: dict[str, str] | None = None,
    kept_in: Path | None = None,
) -> LoadedSpec:
    """Load a recipe name or a TOML file, apply `[quick]` and flag overrides, validate.

    `override_flags` maps a field to the flag that set it, so an error says `--clients`
    rather than `field clients` when the bad value came from the command line.
    `extra_settings` (from --set) are merged over the spec's own settings. `kept_in`: the
    run folder whose spec.toml this is (`run --again`): the files the spec names must be that
    folder's own copies (LoadedSpec.kept_in).
    """
    if name_or_path.endswith(".toml") or os.sep in name_or_path:
        path = Path(name_or_path).expanduser()
        problem = not_a_file(path)
        if problem:
            raise InputFileError(f"spec file {name_or_path}: {problem}")
        source, base_dir = str(path), path.resolve().parent
    else:
        path = recipe_path(name_or_path)
        source, base_dir = f"recipe {name_or_path}", path.parent
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"spec file {name_or_path}: cannot read: {exc}") from None
    raw = _parse_toml(text, source)
    quick_table = raw.pop("quick", {})
    if not isinstance(quick_table, dict):
        raise SpecError(f"{source}: field 'quick' must be a table")
    if raw.get("cpu_sweep") is not None:
        _add_cpu_variants(raw, source, override_flags or {})
    if "scripts" in raw and "workload" not in raw:
        # TOML has no null: a spec that names scripts and no workload means the scripts only.
        raw["workload"] = None
    if quick:
        raw.update(quick_table)
    file_workload = raw.get("workload", Spec.model_fields["workload"].default)
    raw.update(overrides or {})
    for name, value in (extra_settings or {}).items():
        problem = reserved_setting(name, value)
        if problem:
            raise SpecError(f"--set {name}={value}: {problem}")
    if extra_settings:
        base = raw.get("settings", {})
        raw["settings"] = {**(base if isinstance(base, dict) else {}), **extra_settings}
    raw.setdefault("name", path.stem)
    named = _workload_name(raw, file_workload, override_flags or {})
    if named:
        raw["name"] = named
    try:
        spec = Spec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(_format_validation_error(exc, source, override_flags or {})) from None
    loaded = LoadedSpec(spec, source, base_dir, text, kept_in, frozenset(override_flags or {}))
    # Check referenced files now, not at step 5 of a long run.
    loaded.scripts()
    loaded.init_sql_path()
    if spec.workload is None and not spec.scripts:
        raise SpecError(f"{source}: no workload: set workload or scripts (or pass --script FILE)")
    if spec.slo and not spec.rates:
        # An objective is judged on latency from the scheduled start: only rates have one.
        where = (override_flags or {}).get("slo", f"{source}: field slo")
        raise SpecError(
            f"{where}: a latency objective is judged on open-loop steps, and this run has none: "
            f"give offered rates too (--rate 20%-120%, or rates in the spec)"
        )
    return loaded


def sweep_counts(cores: int) -> list[int]:
    """1 .. cores: every count up to 8, doubling beyond, and the core count itself."""
    counts = {k for k in range(1, min(cores, 8) + 1)}
    k = 16
    while k < cores:
        counts.add(k)
        k *= 2
    counts.add(cores)
    return sorted(counts)


def _add_cpu_variants(raw: dict[str, Any], source: str, flags: dict[str, str]) -> None:
    """Expand `cpu_sweep` into variants cpus-K (checked against this host's CPUs now: a sweep
    the host cannot run is a missing prerequisite, said before anything starts)."""
    from pgscope.host import usable_cores

    cores = usable_cores()
    sweep = raw["cpu_sweep"]
    where = flags.get("cpu_sweep", f"{source}: cpu_sweep")
    if sweep == "auto":
        if cores < 2:
            raise EnvironmentProblem(
                f"{where}: a CPU sweep needs at least 2 usable CPUs; "
                f"this host lets pgscope use {cores}"
            )
        counts = sweep_counts(cores)
    elif isinstance(sweep, list) and all(isinstance(k, int) for k in sweep):
        counts = sorted(set(sweep))
        if counts and counts[-1] > cores:
            raise EnvironmentProblem(
                f"{where}: pins to {counts[-1]} CPUs but this host lets pgscope use {cores}"
            )
    else:
        return  # let validation name the problem
    declared = raw.get("variants")
    variants = dict(declared) if isinstance(declared, dict) else {}
    for k in counts:
        variants[f"cpus-{k}"] = {"pgscope.cpus": k}
    raw["variants"] = variants


def parse_client_list(text: str) -> list[int]:
    """`--clients 1,2,4-8` -> [1, 2, 4, 5, 6, 7, 8]. Ranges are inclusive."""
    counts: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        found = _CLIENT_PART.fullmatch(part)
        if found is None:
            raise SpecError(f"--clients {text!r}: {part!r} is not a count or range (e.g. 1,2,4-8)")
        lo, hi = int(found["lo"]), int(found["hi"] or found["lo"])
        if hi < lo:
            raise SpecError(
                f"--clients {text!r}: the range {part!r} is reversed: it ends below its start "
                f"(write {hi}-{lo})"
            )
        if hi > MAX_CLIENTS:  # before expanding it: 1-99999999999 would fill the memory
            raise SpecError(f"--clients {text!r}: {hi} is more than {MAX_CLIENTS} clients")
        counts.extend(range(lo, hi + 1))
    if not counts:
        raise SpecError(f"--clients {text!r}: no client counts given")
    return counts


_CLIENT_PART = re.compile(r"(?P<lo>\d+)(?:\s*-\s*(?P<hi>\d+))?")


def rates_label(rates: list[OfferedRate]) -> str:
    """`20%, 40%, 60% of the peak`, `2,000, 4,000 tps`, or both kinds, in words."""
    shares = [f"{r.share_of_peak:.0%}" for r in rates if r.share_of_peak is not None]
    absolute = [f"{r.tps:,.0f}" for r in rates if r.tps is not None]
    said = [f"{', '.join(shares)} of the peak"] if shares else []
    said += [f"{', '.join(absolute)} tps"] if absolute else []
    return "; ".join(said)


@dataclass(frozen=True)
class RateList:
    rates: list[OfferedRate]

    def texts(self) -> list[float | str]:
        """As the spec keeps them: tps as numbers, shares as "20%"."""
        return [
            f"{r.share_of_peak * 100:g}%" if r.share_of_peak is not None else float(r.tps or 0)
            for r in self.rates
        ]


DEFAULT_SHARE_STEP = 20.0  # %, between the rates of a range of shares without its own step


def parse_rates(text: str) -> RateList:
    """`2000,4000`, `20%-120%` (20%, 40%, ... 120%: shares of the sweep's peak, every 20%
    unless `/10%` says otherwise), `1000-5000/1000`. Ranges include both ends. A bad rate is
    a ValueError saying which part and why (the spec's validation names the field or flag)."""
    rates: list[OfferedRate] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        found = _RATE_PART.fullmatch(part.replace(" ", ""))
        if found is None:
            raise ValueError(
                f"{part!r} is not a rate: tps (2000), a share of the peak (20%), or a range "
                f"(20%-120%, 1000-5000/1000)"
            )
        lo, hi, step = found["lo"], found["hi"], found["step"]
        share = lo.endswith("%")
        mixed = (hi is not None and hi.endswith("%") != share) or (
            step is not None and step.endswith("%") != share
        )
        if mixed:
            raise ValueError(f"{part!r} mixes tps and shares of the peak")
        low, high = float(lo.rstrip("%")), float((hi or lo).rstrip("%"))
        if not low > 0:
            raise ValueError(f"{part!r}: a rate must be above 0")
        if high < low:
            raise ValueError(f"the range {part!r} ends below its start")
        if not share and high > MAX_RATE_TPS:
            raise ValueError(_TOO_FAST.format(rate=part))
        if hi is not None and step is None and not share:
            raise ValueError(f"the range {part!r} needs a step: {part}/STEP, e.g. 1000-5000/1000")
        every = float(step.rstrip("%")) if step else DEFAULT_SHARE_STEP
        if not every > 0:
            raise ValueError(f"{part!r}: the step must be above 0")
        if (high - low) / every > 100:
            raise ValueError(f"{part!r} makes more than 100 rates")
        values = [low]
        while hi is not None and values[-1] + every < high - 1e-9:
            values.append(round(values[-1] + every, 6))
        if hi is not None and high > low:
            values.append(high)
        rates += [
            OfferedRate(share_of_peak=v / 100) if share else OfferedRate(tps=v) for v in values
        ]
    if not rates:
        raise ValueError(f"no rate in {text!r}")
    return RateList(rates)


_NUMBER = r"\d+(?:\.\d+)?"
# pgbench schedules each thread's transactions in whole microseconds, a thread per client at
# most: beyond a million tps per client its gaps round to zero and the rate is not offered
# (a rate of 1e23 tps was run, and its report judged an objective on it).
MAX_RATE_TPS = 1_000_000.0 * MAX_CLIENTS
_TOO_FAST = (
    "rate {rate} is beyond what pgbench can offer: it schedules in whole microseconds, a "
    f"million tps per client at most ({MAX_RATE_TPS:,.0f} tps with {n_clients(MAX_CLIENTS)})"
)
_RATE_PART = re.compile(rf"(?P<lo>{_NUMBER}%?)(?:-(?P<hi>{_NUMBER}%?))?(?:/(?P<step>{_NUMBER}%?))?")


def parse_action(text: str) -> dict[str, Any]:
    """`--action 20:CHECKPOINT` -> {"at": 20.0, "sql": "CHECKPOINT"}."""
    at, sep, sql = text.partition(":")
    try:
        seconds = float(at)
    except ValueError:
        seconds = -1.0
    if not sep or not sql.strip() or seconds < 0:
        raise SpecError(f"--action {text!r}: expected SECONDS:SQL, e.g. 20:CHECKPOINT")
    return {"at": seconds, "sql": sql.strip()}


def parse_setting(text: str, flag: str = "--set") -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise SpecError(f"{flag} {text!r}: expected NAME=VALUE, e.g. shared_buffers=1GB")
    return name.strip(), value.strip()


def setting_text(value: SettingValue) -> str:
    """A TOML value as PostgreSQL's configuration syntax expects it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    return str(value)
