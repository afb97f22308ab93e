"""How busy the host is, each second: CPU by kind (user, system, iowait, steal, idle), and how
much of it the database servers, the load generator and pgscope itself take; the rest is
other processes'.

Why: "CPU-bound" means the cores are busy, and it matters who keeps them busy. On a small
host pgbench can take a third of the CPU, and then the client, not the server, is the limit;
beside another workload, the server may have only a part of what looks saturated.

The server is the target's own process tree: its postmaster and every process it started (a
topology's standbys and extra instances, each with their own tree, too), never another
cluster that runs as the same account (issue 30: "CPU used by the cluster" counted every
`postgres` process of the account, 65-85% here from other clusters). Processes shorter than a
second (parallel workers, a connection per transaction) are counted through their
postmaster, which holds their time once they exit. Behind a `--dsn`, the postmaster is the
local one with the server's port and start time, where there is one.

What it costs: reading /proc/stat and the stat files of the processes once a second (a few
ms: one scan of /proc). Works as any user for processes of the same user, and as root for
all; for a server on another host it still measures this host (the load generator).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
from pydantic import BaseModel, ConfigDict, Field

from pgscope.collect.base import Availability, CollectorContext, CollectorEnv, CollectorError
from pgscope.collect.localserver import local_server_for
from pgscope.collect.polling import ThreadCollector
from pgscope.errors import PgscopeError
from pgscope.store import now_us

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_times() -> dict[str, int]:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    return {name: int(value) for name, value in zip(names, fields, strict=False)}


def _process_ticks(pid: int, reaped: bool = False) -> int:
    """utime + stime of one process (clock ticks), with `reaped` also that of its children
    that exited and were waited for (cutime + cstime); 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    own = int(fields[11]) + int(fields[12])
    return own + int(fields[13]) + int(fields[14]) if reaped else own


@dataclass(frozen=True)
class _Process:
    uid: int
    name: str
    parent: int


def _processes() -> dict[int, _Process]:
    """Every process of the host, by pid (one scan of /proc)."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            uid = entry.stat().st_uid
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 1 :]
        found[int(entry.name)] = _Process(uid, name, int(rest.split()[1]))
    return found


KTHREADD = 2  # the kernel's threads' parent: their work (I/O, journaling) serves every process


def process_tree(processes: dict[int, _Process], roots: set[int]) -> set[int]:
    """`roots` and every process descended from one of them."""
    children: dict[int, list[int]] = {}
    for pid, process in processes.items():
        children.setdefault(process.parent, []).append(pid)
    tree, pending = set(roots), list(roots)
    while pending:
        for child in children.get(pending.pop(), ()):
            if child not in tree:
                tree.add(child)
                pending.append(child)
    return tree


class HostOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    interval_s: float = Field(1.0, gt=0, le=60)


def _local_postmaster(ctx: CollectorContext) -> int | None:
    try:
        local = local_server_for(ctx.conn)
    except (PgscopeError, CollectorError, psycopg.Error, OSError):
        return None
    return local.pid if local is not None else None


class HostCollector(ThreadCollector):
    name = "host"
    summary = "CPU busy, iowait and steal each second, and the server's vs pgbench's share"
    cost = "reading /proc once a second"
    default_in_runs = True
    Options = HostOptions

    options: HostOptions
    postmaster: Callable[[], int | None]  # the target's postmaster, found for a --dsn too
    topology: Callable[[], list[int]]  # the postmasters of its standbys and instances
    roots: set[int]  # the postmasters seen at the last second
    reaped: int  # their own ticks and their exited children's, then
    children: set[int]  # their children then

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        if not Path("/proc/stat").is_file():
            return Availability.no("/proc/stat is not readable: not a Linux host")
        return Availability.yes()

    def prepare(self, ctx: CollectorContext) -> None:
        ctx.store.create_tables(self.name)
        self.postmaster = ctx.postmaster_pid
        self.topology = ctx.other_postmasters
        if ctx.postmaster_pid() is None and ctx.env.target_kind == "server":
            # A --dsn names no process: without its postmaster, the server's own processes
            # would count as other processes' (a local server, measured: 99% of the host).
            local = _local_postmaster(ctx)
            if local is not None:
                self.postmaster = lambda: local
            ctx.say(
                f"host: the server is postmaster {local} on this host"
                if local is not None
                else "host: no postmaster on this host matches the server (a remote server, "
                "or a local one only root could match); a local server's CPU counts as other "
                "processes'"
            )

    def _ticks(self, seen: dict[int, int]) -> tuple[int, int, int, int]:
        """Ticks used since the last call by the database servers, pgbench, pgscope and the
        other user-space processes.

        The servers are the target's postmaster and its descendants (and those of a
        topology's standbys and instances): another cluster of the same account is other
        processes'. A process that lived less than the interval (a parallel worker, the
        backend of a connection per transaction) is never seen alive: its postmaster, which
        waits for its children, holds its time (cutime), less what was counted while it was
        seen alive. pgscope is this process (the collectors' threads) and the tracers and
        profilers it started."""
        processes = _processes()
        me = os.getpid()
        roots = {pid for pid in (self.postmaster(), *self.topology()) if pid in processes}
        servers = process_tree(processes, roots)
        children = servers - roots
        clients = {pid for pid, p in processes.items() if p.parent == me and p.name == "pgbench"}
        own = {me} | {pid for pid, p in processes.items() if p.parent == me} - clients - servers
        others = {
            pid
            for pid, p in processes.items()
            if pid not in servers | clients | own and KTHREADD not in (pid, p.parent)
        }
        server = self._ticks_since(sorted(children), seen)
        reaped = sum(_process_ticks(pid, reaped=True) for pid in roots)
        counted = sum(seen.pop(pid, 0) for pid in self.children - children)
        if roots == self.roots:  # else a server started or stopped: a new baseline
            server += max(0, reaped - self.reaped - counted)
        self.roots, self.reaped, self.children = roots, reaped, children
        return (
            server,
            self._ticks_since(sorted(clients), seen),
            self._ticks_since(sorted(own), seen),
            self._ticks_since(sorted(others), seen),
        )

    def run_loop(self) -> None:
        self._sample_until_stopped()

    def _sample_until_stopped(self) -> None:
        cpus = len(os.sched_getaffinity(0))
        previous = _cpu_times()
        seen: dict[int, int] = {}  # pid -> ticks at the previous second (backends come and go)
        self.roots, self.reaped, self.children = set(), 0, set()
        # A baseline, so that the first second does not count what processes used before.
        self._ticks(seen)
        last = time.monotonic()
        while not self.stop_event.wait(self.options.interval_s):
            now = time.monotonic()
            current = _cpu_times()
            delta = {k: current[k] - previous.get(k, 0) for k in current}
            total = sum(delta.values()) or 1
            server, client, own, other = self._ticks(seen)
            elapsed_ticks = (now - last) * CLOCK_TICKS * (os.cpu_count() or cpus)
            self.store.append(
                "host_cpu",
                {
                    "ts_us": [now_us()],
                    "seconds": [now - last],
                    "cpus": [cpus],
                    "busy": [1 - (delta["idle"] + delta.get("iowait", 0)) / total],
                    "user_share": [(delta["user"] + delta["nice"]) / total],
                    "system_share": [
                        (delta["system"] + delta.get("irq", 0) + delta.get("softirq", 0)) / total
                    ],
                    "iowait_share": [delta.get("iowait", 0) / total],
                    "steal_share": [delta.get("steal", 0) / total],
                    "server_share": [server / elapsed_ticks if elapsed_ticks else None],
                    "client_share": [client / elapsed_ticks if elapsed_ticks else None],
                    "own_share": [own / elapsed_ticks if elapsed_ticks else None],
                    "other_share": [other / elapsed_ticks if elapsed_ticks else None],
                },
            )
            previous, last = current, now

    @staticmethod
    def _ticks_since(pids: list[int], seen: dict[int, int]) -> int:
        """CPU ticks the processes used since the last call (new ones: since they started,
        which for a backend younger than a second is close enough)."""
        used = 0
        for pid in pids:
            ticks = _process_ticks(pid)
            used += max(0, ticks - seen.get(pid, 0))
            seen[pid] = ticks
        return used
