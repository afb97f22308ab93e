"""A run's workload and a server setting in the words every layer shows them with: the spec
writes a run's name from them, `runs` lists them, `compare` checks two runs against them."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pgscope.words import human_bytes, plain


def split_weight(text: str) -> tuple[str, int]:
    """`FILE[@weight]` -> (FILE, weight): `x.sql@3` is ("x.sql", 3); `x@y.sql` is
    ("x@y.sql", 1)."""
    name, sep, weight = text.rpartition("@")
    if not sep or not weight.isdigit():
        return text, 1
    return name, int(weight)


def workload_label(workload: str | None, scripts: list[str]) -> str:
    """A builtin and scripts as a reader names them: "select-only", "insert.sql",
    "select-only + mine.sql@3" (file names; weights other than 1)."""
    parts = [workload] if workload else []
    for script in scripts:
        name, weight = split_weight(script)
        parts.append(Path(name).name + (f"@{weight}" if weight != 1 else ""))
    return " + ".join(parts) or "none"


def driven_workload(spec: Mapping[str, Any]) -> str | None:
    """The workload a run's recorded spec drove, labelled; None when pgscope drove no load
    (`sample`, `observe`: their spec names neither a workload nor scripts)."""
    if "workload" not in spec and not spec.get("scripts"):
        return None
    return workload_label(spec.get("workload"), spec.get("scripts") or [])


def listed_run(row: dict[str, Any], verdict: str | None) -> dict[str, Any]:
    """A run as `runs` lists it, from a folder or a repository: the store's summary row
    (`RunStore.summary`, with `run_id` and `run_dir`), with what a reader asks first, and the
    verdict its analysis gave (None: not analysed)."""
    row = dict(row)
    spec = row.pop("spec", {})
    kind, conninfo = row.pop("target_kind", None), row.pop("target_conninfo", None)
    started, best = row.get("started_us"), row.pop("best_tps", None)
    return {
        # An unreadable store still has its folder's name: DATE-TIME-NAME-HEX.
        "name": row["recipe"] or "-".join(row["run_id"].split("-")[2:-1]) or row["run_id"],
        "date": None
        if started is None
        else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started / 1e6)),
        "target": "embedded" if kind == "embedded" else shown_conninfo(conninfo) or kind or None,
        "workload": driven_workload(spec),
        "scale": spec.get("scale"),
        "clients": row.pop("clients", []),
        "best_tps": None if best is None else round(best, 1),
        "verdict": verdict,
        **row,
    }


# pg_settings' units: memory in bytes, time in seconds.
_MEMORY = {"B": 1, "kB": 2**10, "8kB": 8 * 2**10, "MB": 2**20, "16MB": 16 * 2**20}
_TIME = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}
# The largest that divides a duration exactly names it: 300 s is "5 min", 1500 ms stays.
_TIME_NAMES = (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0), ("ms", 1e-3))


def setting_label(setting: str, unit: str | None) -> str:
    """A setting as pg_settings gives it (`setting`, `unit`) in human units: shared_buffers
    964161 x 8kB is "7.36 GiB", checkpoint_timeout 300 s is "5 min", "off" is "off"."""
    if not unit:
        return setting
    try:
        number = float(setting)
    except ValueError:
        return f"{setting} {unit}"
    if number <= 0:  # -1 and 0 mean "off" or "as another setting" to PostgreSQL: no size
        return setting
    if unit in _MEMORY:
        return human_bytes(number * _MEMORY[unit])
    if unit in _TIME:
        seconds = number * _TIME[unit]
        for name, size in _TIME_NAMES:
            count = seconds / size
            if count >= 1 and abs(count - round(count)) < 1e-9:
                return f"{round(count)} {name}"
        return f"{plain(number)} {unit}"
    return f"{setting} {unit}"


# The read-only guard pgscope puts last in the `options` of every session it opens on a user's
# server (drive/readonly.py): its own, never the user's, so never shown as the user's.
READ_ONLY_OPTION = "-c default_transaction_read_only=on"


def shown_conninfo(conninfo: str | None) -> str | None:
    """A stored connection string as the user gave it: without pgscope's read-only guard
    (`options='-c default_transaction_read_only=on'`, or the guard after the user's own
    options). Text that is not a connection string is returned as it is."""
    if not conninfo or READ_ONLY_OPTION not in conninfo:
        return conninfo
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        params = {k: str(v) for k, v in conninfo_to_dict(conninfo).items() if v is not None}
    except ProgrammingError:
        return conninfo
    options = params.get("options", "")
    if options.rstrip().endswith(READ_ONLY_OPTION):
        rest = options.rstrip()[: -len(READ_ONLY_OPTION)].rstrip()
        if rest:
            params["options"] = rest
        else:
            del params["options"]
    return make_conninfo(**params)
