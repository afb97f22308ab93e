"""What `pgscope run`'s flags say about the spec: each flag declared once, with the spec field it
sets and how its text becomes that field's value. `run` (and `run --plan`) gives the result to
`spec.load_spec`, which names the flag, not the field, when a value it set is refused."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _same(value: Any) -> Any:
    return value


def _clients(text: str | None) -> Any:
    from pgscope.spec import parse_client_list  # pydantic's models: only when a flag is given

    if text is None:
        return None
    return "auto" if text == "auto" else parse_client_list(text)


def _only_if_given(value: bool) -> bool | None:
    # An absent switch leaves the spec's own choice standing: only True overrides.
    return True if value else None


def _actions(texts: list[str] | None) -> list[Any] | None:
    from pgscope.spec import parse_action

    return [parse_action(text) for text in texts] if texts else None


def _collectors(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    return {name.strip(): {} for name in text.split(",") if name.strip()}


def _none_collectors(value: bool) -> dict[str, Any] | None:
    return {} if value else None


def _scripts(texts: list[str] | None) -> list[str] | None:
    return [_absolute_script(text) for text in texts] if texts else None


def _absolute_script(text: str) -> str:
    """A --script FILE[@weight] path made absolute against the current directory (spec files
    resolve theirs against the spec's own directory)."""
    name, sep, weight = text.rpartition("@")
    if not sep or not weight.isdigit():
        name, sep, weight = text, "", ""
    path = Path(name).expanduser()
    return f"{path if path.is_absolute() else Path.cwd() / path}{sep}{weight}"


def _absolute(path: Path | None) -> str | None:
    return None if path is None else str(path.expanduser().absolute())


def _some(values: list[str] | None) -> list[str] | None:
    return values or None


@dataclass(frozen=True)
class Flag:
    param: str  # the `run` command's parameter
    flag: str  # as the user typed it, for errors
    field: str  # the spec's field it sets
    value: Callable[[Any], Any] = _same  # None: the flag was not given


# In order: a later flag setting the same field wins (--no-collectors over --collectors).
FLAGS: tuple[Flag, ...] = (
    Flag("clients", "--clients", "clients", _clients),
    Flag("duration", "--duration", "duration"),
    Flag("warmup", "--warmup", "warmup"),
    Flag("repeats", "--repeats", "repeats"),
    Flag("scale", "--scale", "scale"),
    Flag("workload", "--workload", "workload"),
    Flag("protocol", "--protocol", "protocol"),
    Flag("max_tries", "--max-tries", "max_tries"),
    Flag("order", "--order", "order"),
    Flag("connect", "--connect", "connect_per_transaction", _only_if_given),
    Flag("action", "--action", "actions", _actions),
    Flag("collectors", "--collectors", "collectors", _collectors),
    Flag("no_collectors", "--no-collectors", "collectors", _none_collectors),
    Flag("seed", "--seed", "seed"),
    Flag("rate", "--rate", "rates"),
    Flag("rate_clients", "--rate-clients", "rate_clients"),
    Flag("slo", "--slo", "slo", _some),
    Flag("script", "--script", "scripts", _scripts),
    Flag("init_sql", "--init-sql", "init_sql", _absolute),
)


def spec_overrides(given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The fields the flags in `given` (the command's parameters by name) set, and for each
    the flag that set it."""
    overrides: dict[str, Any] = {}
    flags: dict[str, str] = {}
    for flag in FLAGS:
        value = flag.value(given.get(flag.param))
        if value is not None:
            overrides[flag.field] = value
            flags[flag.field] = flag.flag
    if "scripts" in overrides and given.get("workload") is None:
        # Scripts given and no --workload: the scripts alone, whatever the spec's workload.
        overrides["workload"] = None
    return overrides, flags
