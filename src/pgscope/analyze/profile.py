"""CPU and off-CPU profiles read back from the store, and what they say.

Pure functions of the run store's `profile_stacks` (written by the perf and offcpu
collectors): profiles per step or per variant, the top functions with self and total share,
the kernel/user split, the share in kernel lock slow paths (the field cases' signature), a
differential between two profiles normalised per sample, and the trees the flame graph views
draw. Nothing here talks to a server or formats output.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pgscope.duck import Queryable

KERNEL_SUFFIX = "_[k]"

# Kernel functions where a task spins or queues for a mutex or a spinlock; a sample with one
# of these in its kernel stack is "in a kernel lock". Compiler suffixes (.isra.0,
# .constprop.0) are ignored when matching.
KERNEL_LOCK_FUNCTIONS = frozenset(
    {
        "mutex_spin_on_owner",
        "__mutex_lock",
        "__mutex_lock_slowpath",
        "mutex_lock_killable",
        "osq_lock",
        "_raw_spin_lock",
        "_raw_spin_lock_irq",
        "_raw_spin_lock_irqsave",
        "_raw_spin_lock_bh",
        "_raw_read_lock",
        "_raw_write_lock",
        "native_queued_spin_lock_slowpath",
        "queued_spin_lock_slowpath",
        "__pv_queued_spin_lock_slowpath",
        "rwsem_down_read_slowpath",
        "rwsem_down_write_slowpath",
        "rwsem_spin_on_owner",
        "rwsem_optimistic_spin",
    }
)


# PostgreSQL's own spin loops (storage/lmgr/s_lock.c). `s_lock` runs only when the inline
# test-and-set of SpinLockAcquire failed, and `perform_spin_delay` once per failed retry of
# any spin loop (s_lock, LockBufHdr, a buffer pin waiting for the header lock, an LWLock's
# wait-list lock); below it `pg_usleep` sleeps once the spins run out. With either on the
# stack the process waits for a lock another one holds. Not `finish_spin_delay`: every
# LockBufHdr calls it, contended or not. (`pg_spin_delay` is the pause instruction, inlined:
# no frame.)
SPIN_FUNCTIONS = frozenset({"s_lock", "perform_spin_delay"})
# The snapshot: every statement of a READ COMMITTED transaction takes one (and the catalog
# cache its own); its cost grows with the backends in the process array.
SNAPSHOT_FUNCTIONS = frozenset({"GetSnapshotData"})


def is_kernel(frame: str) -> bool:
    return frame.endswith(KERNEL_SUFFIX)


def base_name(frame: str) -> str:
    """A kernel frame without its `_[k]` mark and compiler suffix (`.isra.0`)."""
    name = frame[: -len(KERNEL_SUFFIX)] if is_kernel(frame) else frame
    return name.split(".", 1)[0] if name and name[0] != "." else name


def is_kernel_lock(frame: str) -> bool:
    return is_kernel(frame) and base_name(frame) in KERNEL_LOCK_FUNCTIONS


@dataclass(frozen=True)
class Profile:
    """Folded stacks: (role, state, frames root first) -> value (samples or microseconds)."""

    kind: str  # "cpu" or "offcpu"
    stacks: dict[tuple[str, str | None, tuple[str, ...]], int]
    label: str = ""

    @property
    def total(self) -> int:
        return sum(self.stacks.values())

    @property
    def unit(self) -> str:
        return "samples" if self.kind == "cpu" else "microseconds"

    def full_stacks(self) -> Iterable[tuple[tuple[str, ...], int]]:
        """Each stack under its role (and, off CPU, its state): what folded files and flame
        graphs show, e.g. ("backend", "PostgresMain", ...)."""
        for (role, state, frames), value in self.stacks.items():
            prefix = (role,) if state is None else (role, f"[{state}]")
            yield prefix + frames, value

    def only(
        self, roles: Iterable[str] | None = None, states: Iterable[str] | None = None
    ) -> Profile:
        keep_roles = set(roles) if roles is not None else None
        keep_states = set(states) if states is not None else None
        return Profile(
            self.kind,
            {
                key: value
                for key, value in self.stacks.items()
                if (keep_roles is None or key[0] in keep_roles)
                and (keep_states is None or key[1] in keep_states)
            },
            self.label,
        )


def load_profile(
    store: Queryable,
    kind: str = "cpu",
    step_ids: Sequence[int | None] | None = None,
    label: str = "",
) -> Profile:
    """The sum of the profiles of `step_ids` (None: every recording of that kind; a None in
    the list: the standalone session's)."""
    sql = "SELECT role, state, stack, sum(value) AS value FROM profile_stacks WHERE kind = ?"
    params: list[Any] = [kind]
    if step_ids is not None:
        steps = [s for s in step_ids if s is not None]
        conditions = []
        if steps:
            conditions.append(f"step_id IN ({', '.join('?' * len(steps))})")
            params.extend(steps)
        if any(s is None for s in step_ids):
            conditions.append("step_id IS NULL")
        sql += f" AND ({' OR '.join(conditions) or 'false'})"
    sql += " GROUP BY ALL ORDER BY ALL"  # a stable order: the same run, the same document
    if not _has_profiles(store):
        return Profile(kind, {}, label)
    stacks = {
        (r["role"], r["state"], tuple(r["stack"].split(";"))): int(r["value"])
        for r in store.query(sql, params)
    }
    return Profile(kind, stacks, label)


def _has_profiles(store: Queryable) -> bool:
    return store.has_table("profile_stacks")


@dataclass(frozen=True)
class Recording:
    step_id: int | None
    kind: str
    variant: str | None
    clients: int | None
    repeat: int | None
    total: int
    note: str | None


def recordings(store: Queryable) -> list[Recording]:
    """Every stored profile recording with its step's variant and client count."""
    if not _has_profiles(store):
        return []
    rows = store.query(
        "SELECT p.step_id, p.kind, s.variant, s.clients, s.repeat, p.total, p.note "
        "FROM profiles p LEFT JOIN steps s USING (step_id) ORDER BY p.kind, p.step_id"
    )
    return [Recording(**row) for row in rows]


def steps_of(
    store: Queryable,
    variant: str | None = None,
    clients: int | None = None,
    rate: float | None = None,
) -> list[int]:
    """Step ids of a variant and/or client count, at an offered rate (None: the closed-loop
    steps, the sweep's)."""
    sql = "SELECT step_id FROM steps WHERE rate IS NOT DISTINCT FROM ?"
    params: list[Any] = [rate]
    if variant is not None:
        sql += " AND variant = ?"
        params.append(variant)
    if clients is not None:
        sql += " AND clients = ?"
        params.append(clients)
    return [r["step_id"] for r in store.query(sql + " ORDER BY step_id", params)]


# ---------------------------------------------------------------------------------------------
# What a profile says


@dataclass(frozen=True)
class FunctionShare:
    name: str
    self_value: int  # where the function is the leaf
    total_value: int  # where it is anywhere on the stack (counted once per stack)
    self_share: float
    total_share: float

    @property
    def kernel(self) -> bool:
        return is_kernel(self.name)


def function_values(profile: Profile) -> tuple[Counter[str], Counter[str]]:
    """(self, total) value per function."""
    self_values: Counter[str] = Counter()
    total_values: Counter[str] = Counter()
    for (_, _, frames), value in profile.stacks.items():
        if frames:
            self_values[frames[-1]] += value
        for name in set(frames):
            total_values[name] += value
    return self_values, total_values


def top_functions(profile: Profile, limit: int = 20, by: str = "self") -> list[FunctionShare]:
    """The functions with the largest self (or total) share."""
    total = profile.total
    if total == 0:
        return []
    self_values, total_values = function_values(profile)
    ranked = self_values if by == "self" else total_values
    return [
        FunctionShare(
            name,
            self_values[name],
            total_values[name],
            self_values[name] / total,
            total_values[name] / total,
        )
        for name, _ in ranked.most_common(limit)
    ]


@dataclass(frozen=True)
class KernelUserSplit:
    kernel: int
    user: int

    @property
    def total(self) -> int:
        return self.kernel + self.user

    @property
    def kernel_share(self) -> float:
        return self.kernel / self.total if self.total else 0.0


def kernel_user_split(profile: Profile) -> KernelUserSplit:
    """Value whose leaf frame is in the kernel vs in user space (a stackless sample counts
    as user: perf could not say otherwise)."""
    kernel = sum(v for (_, _, f), v in profile.stacks.items() if f and is_kernel(f[-1]))
    return KernelUserSplit(kernel, profile.total - kernel)


@dataclass(frozen=True)
class LockShare:
    value: int
    share: float
    functions: list[tuple[str, int]] = field(default_factory=list)  # innermost lock frame


def kernel_lock_share(profile: Profile) -> LockShare:
    """The value spent in kernel mutex/spinlock slow paths, and which lock functions."""
    total = profile.total
    value = 0
    by_function: Counter[str] = Counter()
    for (_, _, frames), count in profile.stacks.items():
        locks = [f for f in frames if is_kernel_lock(f)]
        if locks:
            value += count
            by_function[base_name(locks[-1])] += count
    return LockShare(value, value / total if total else 0.0, by_function.most_common())


@dataclass(frozen=True)
class CallSite:
    """Where a hot spot was called from: the nearest named function above it (Debian's
    stripped `postgres` names only exported functions: a static caller such as PinBuffer or
    LWLockWaitListLock is `postgres+0x…`, and the name is the exported one that called it),
    and the most frequent named function above that."""

    caller: str
    via: str | None
    value: int  # samples under this caller


@dataclass(frozen=True)
class HotSpot:
    """Samples with any of `functions` on the stack, each stack counted once (its callees
    included: the spin loop's sleep, the snapshot's ProcArrayLock), by caller."""

    functions: list[str]
    value: int
    sites: list[CallSite]  # most value first


def hot_spot(profile: Profile, functions: Iterable[str], limit: int = 5) -> HotSpot:
    """The samples in `functions` and who called them: for each stack, the outermost of them
    and the named user frames above it (s_lock called from perform_spin_delay's caller is one
    spin, not two)."""
    wanted = frozenset(functions)
    value = 0
    callers: Counter[str] = Counter()
    vias: dict[str, Counter[str | None]] = defaultdict(Counter)
    for (_, _, frames), count in profile.stacks.items():
        at = next(
            (i for i, f in enumerate(frames) if not is_kernel(f) and base_name(f) in wanted), None
        )
        if at is None:
            continue
        value += count
        above = [base_name(f) for f in reversed(frames[:at]) if not is_kernel(f) and is_named(f)]
        caller = above[0] if above else "[unknown]"
        callers[caller] += count
        vias[caller][above[1] if len(above) > 1 else None] += count
    sites = [
        CallSite(caller, vias[caller].most_common(1)[0][0], count)
        for caller, count in sorted(callers.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
    ]
    return HotSpot(sorted(wanted), value, sites)


@dataclass(frozen=True)
class FunctionDelta:
    """One function in two profiles, as shares of each profile's total."""

    name: str
    self_a: float
    self_b: float
    total_a: float
    total_b: float

    @property
    def total_delta(self) -> float:
        return self.total_b - self.total_a

    @property
    def self_delta(self) -> float:
        return self.self_b - self.self_a


@dataclass(frozen=True)
class Differential:
    a: str
    b: str
    total_a: int
    total_b: int
    grew: list[FunctionDelta]  # largest growth of total share first
    shrank: list[FunctionDelta]  # largest shrinkage first


def differential(
    a: Profile | FunctionTable, b: Profile | FunctionTable, limit: int = 20
) -> Differential:
    """What grew and what shrank from `a` to `b`, per function, in shares of each profile's
    own total: a profile twice as long does not look twice as hot."""
    ta = a if isinstance(a, FunctionTable) else function_table(a, min_share=0.0)
    tb = b if isinstance(b, FunctionTable) else function_table(b, min_share=0.0)
    na, nb = ta.total or 1, tb.total or 1
    deltas = [
        FunctionDelta(
            name,
            ta.self_values.get(name, 0) / na,
            tb.self_values.get(name, 0) / nb,
            ta.total_values.get(name, 0) / na,
            tb.total_values.get(name, 0) / nb,
        )
        for name in set(ta.total_values) | set(tb.total_values)
    ]
    grew = sorted((d for d in deltas if d.total_delta > 0), key=lambda d: (-d.total_delta, d.name))
    shrank = sorted((d for d in deltas if d.total_delta < 0), key=lambda d: (d.total_delta, d.name))
    return Differential(ta.label, tb.label, ta.total, tb.total, grew[:limit], shrank[:limit])


@dataclass(frozen=True)
class FunctionTable:
    """A profile reduced to what the facts and comparisons read: per-function values (those
    under `min_share` of the total left out: they cannot carry a finding), and the kernel and
    kernel-lock totals."""

    kind: str  # "cpu" or "offcpu"
    label: str
    total: int
    kernel: int  # value whose leaf frame is in the kernel
    kernel_lock: int  # value in kernel mutex/spinlock slow paths
    self_values: dict[str, int]  # where the function is the leaf
    total_values: dict[str, int]  # where it is anywhere on the stack

    @property
    def kernel_share(self) -> float:
        return self.kernel / self.total if self.total else 0.0

    @property
    def kernel_lock_share(self) -> float:
        return self.kernel_lock / self.total if self.total else 0.0


def function_table(profile: Profile, min_share: float = 0.001) -> FunctionTable:
    self_values, total_values = function_values(profile)
    floor = profile.total * min_share
    return FunctionTable(
        profile.kind,
        profile.label,
        profile.total,
        kernel_user_split(profile).kernel,
        kernel_lock_share(profile).value,
        _ranked(self_values, floor),
        _ranked(total_values, floor),
    )


def _ranked(values: Counter[str], floor: float) -> dict[str, int]:
    """Largest first, ties by name: counts come from sets of frames, whose order is each
    process's own (string hashing is seeded per process)."""
    ranked = sorted(values.items(), key=lambda item: (-item[1], item[0]))
    return {n: v for n, v in ranked if v >= floor and v > 0}


@dataclass(frozen=True)
class FlameGraph:
    """One flame graph view: a profile's tree, or a differential's (`b`'s shape, each node
    with its change from `a`), with the table shown under it."""

    title: str
    kind: str
    unit: str  # what a value counts: "samples" or "µs off CPU"
    label: str
    total: int
    tree: dict[str, Any]  # d3-flame-graph's input: name, value, children (and delta)
    top_self: list[FunctionShare] = field(default_factory=list)
    base_label: str | None = None  # a differential: what it is compared with
    base_total: int | None = None
    differential: Differential | None = None


def flame_unit(kind: str) -> str:
    return "samples" if kind == "cpu" else "µs off CPU"


def flame_graph(profile: Profile, title: str, top: int = 25) -> FlameGraph:
    return FlameGraph(
        title,
        profile.kind,
        flame_unit(profile.kind),
        profile.label,
        profile.total,
        flame_tree(profile),
        top_functions(profile, top, "self"),
    )


def diff_flame_graph(a: Profile, b: Profile, title: str, limit: int = 20) -> FlameGraph:
    return FlameGraph(
        title,
        b.kind,
        flame_unit(b.kind),
        b.label,
        b.total,
        diff_flame_tree(a, b),
        base_label=a.label,
        base_total=a.total,
        differential=differential(a, b, limit),
    )


# ---------------------------------------------------------------------------------------------
# Trees for the flame graph views (d3-flame-graph's input: name, value, children)


def flame_tree(profile: Profile) -> dict[str, Any]:
    """The profile as a tree of frames; each node's value includes its children's."""
    root: dict[str, Any] = {"name": "all", "value": 0, "children": {}}
    for frames, value in profile.full_stacks():
        node = root
        node["value"] += value
        for frame in frames:
            node = node["children"].setdefault(frame, {"name": frame, "value": 0, "children": {}})
            node["value"] += value
    return _listed(root)


def diff_flame_tree(a: Profile, b: Profile) -> dict[str, Any]:
    """`b`'s tree, each node with `delta`: its value in `b` minus its value in `a` scaled to
    `b`'s total (positive: grew). Frames only in `a` appear with value 0."""
    scale = b.total / a.total if a.total else 0.0
    root: dict[str, Any] = {"name": "all", "value": 0, "base": 0.0, "children": {}}
    for profile, weight in ((b, None), (a, scale)):
        for frames, value in profile.full_stacks():
            node = root
            nodes = [node]
            for frame in frames:
                node = node["children"].setdefault(
                    frame, {"name": frame, "value": 0, "base": 0.0, "children": {}}
                )
                nodes.append(node)
            for visited in nodes:
                if weight is None:
                    visited["value"] += value
                else:
                    visited["base"] += value * weight

    def finish(node: dict[str, Any]) -> dict[str, Any]:
        base = node.pop("base")
        node["delta"] = round(node["value"] - base, 3)
        node["children"] = [finish(c) for c in node["children"].values()]
        return node

    return finish(root)


def _listed(node: dict[str, Any]) -> dict[str, Any]:
    node["children"] = [_listed(c) for c in node["children"].values()]
    return node


def is_named(frame: str) -> bool:
    """A frame with a symbol (not `postgres+0x1234` nor `[unknown]`)."""
    return not frame.startswith("[") and "+0x" not in frame


def wait_sites(profile: Profile, limit: int = 15) -> list[tuple[str, int, float]]:
    """Off CPU: where processes blocked, as "caller > callee" of the two innermost named user
    frames (e.g. "XLogFlush > fdatasync", "secure_read > epoll_wait"), with value and share.
    Kernel frames say how (futex, epoll, fsync); these say why."""
    sites: Counter[str] = Counter()
    for (_, _, frames), value in profile.stacks.items():
        named = [f for f in frames if not is_kernel(f) and is_named(f)]
        sites[" > ".join(named[-2:]) if named else "[no user stack]"] += value
    total = profile.total or 1
    return [(site, value, value / total) for site, value in sites.most_common(limit)]


# ---------------------------------------------------------------------------------------------
# One document per profile (for --json and the report)


def summarize(profile: Profile, limit: int = 15) -> dict[str, Any]:
    split = kernel_user_split(profile)
    locks = kernel_lock_share(profile)
    roles: dict[str, int] = defaultdict(int)
    for (role, _, _), value in profile.stacks.items():
        roles[role] += value
    return {
        "label": profile.label,
        "kind": profile.kind,
        "unit": profile.unit,
        "total": profile.total,
        "by_role": dict(sorted(roles.items(), key=lambda kv: -kv[1])),
        "kernel_share": split.kernel_share,
        "kernel_lock_share": locks.share,
        "kernel_lock_functions": dict(locks.functions),
        "top_self": [f.__dict__ for f in top_functions(profile, limit, "self")],
        "top_total": [f.__dict__ for f in top_functions(profile, limit, "total")],
        "wait_sites": [
            {"site": site, "value": value, "share": share}
            for site, value, share in wait_sites(profile, limit)
        ]
        if profile.kind == "offcpu"
        else [],
    }
