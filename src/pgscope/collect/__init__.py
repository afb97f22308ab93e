"""Evidence collectors, one module per question, all behind one small protocol (`base.py`),
grouped by how they ask: `sampling/` (what sessions are doing, many times a second),
`statistics/` (what the server counts), `tracing/` (kernel-side, on the server's probes),
`profiles/` (where its processes spend CPU). What they share sits here: the protocol, guarded
driving (`manager.py`), polling bases, finding the server's processes.

The registry discovers every `Collector` subclass defined in a module of this package or its
groups, so a new collector is a new file, nothing else.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

if TYPE_CHECKING:
    from pgscope.collect.base import Collector


@cache
def registry() -> dict[str, type[Collector]]:
    from pgscope.collect.base import Collector

    for module in pkgutil.walk_packages(__path__, f"{__name__}."):
        if not module.name.rsplit(".", 1)[-1].startswith("_"):
            importlib.import_module(module.name)
    found: dict[str, type[Collector]] = {}
    pending = list(Collector.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if getattr(cls, "name", None) and not getattr(cls, "__abstractmethods__", None):
            found[cls.name] = cls
    return dict(sorted(found.items()))


def default_selection() -> dict[str, dict[str, Any]]:
    """What runs collect when a spec does not say: every collector marked default_in_runs."""
    return {name: {} for name, cls in registry().items() if cls.default_in_runs}


def validate_options(name: str, options: dict[str, Any]) -> str | None:
    """None when `options` suit collector `name`; else why not, one line."""
    known = registry()
    if name not in known:
        return f"unknown collector {name!r} (known: {', '.join(known) or 'none'})"
    try:
        known[name].Options.model_validate(options)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        return f"collector {name!r}: option {where}: {error['msg']}"
    return None


def build(name: str, options: dict[str, Any]) -> Collector:
    cls = registry()[name]
    return cls(cls.Options.model_validate(options))


def offered() -> dict[str, str]:
    """Every collector's name and what it records: what a report says a run could add."""
    return {name: cls.summary for name, cls in registry().items()}
