"""How a folded profile is stored: the `profiles`, `profile_processes` and `profile_stacks`
tables both profile collectors (perf on-CPU, offcpu) write, one batch per recording.

Costs one append per table per recording (column-wise, ~7 ms per 1000 rows).
docs/collector-perf.md documents the tables.
"""

from __future__ import annotations

from collections import Counter

from pgscope.store import RunStore

# The flame-graph tools' mark of a kernel frame; analyze/profile.py splits on it.
KERNEL_SUFFIX = "_[k]"


def store_folded(
    store: RunStore,
    step_id: int | None,
    kind: str,
    rows: Counter[tuple[str, str | None, str]],
    *,
    started_us: int,
    ended_us: int,
    hz: int | None,
    processes: Counter[tuple[int, str]],
    unknown_share: float,
    note: str | None,
) -> int:
    """Write one recording: its `profiles` row, its (role, state, stack) -> value rows and
    its (pid, role) -> value rows."""
    items = sorted(rows.items(), key=lambda kv: -kv[1])
    store.append(
        "profile_stacks",
        {
            "step_id": [step_id] * len(items),
            "kind": [kind] * len(items),
            "role": [k[0] for k, _ in items],
            "state": [k[1] for k, _ in items],
            "stack": [k[2] for k, _ in items],
            "value": [v for _, v in items],
        },
    )
    store.append(
        "profile_processes",
        {
            "step_id": [step_id] * len(processes),
            "kind": [kind] * len(processes),
            "pid": [pid for pid, _ in processes],
            "role": [role for _, role in processes],
            "value": list(processes.values()),
        },
    )
    total = sum(rows.values())
    store.db.execute(
        "INSERT INTO profiles VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            step_id,
            kind,
            started_us,
            ended_us,
            hz,
            total,
            len(items),
            len({pid for pid, _ in processes}),
            unknown_share,
            note,
        ],
    )
    return total
