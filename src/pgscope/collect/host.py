"""How busy the host is, each second: CPU by kind (user, system, iowait, steal, idle), and how
much of it the cluster's processes and the load generator take.

Why both: "CPU-bound" means the cores are busy, and it matters who keeps them busy. On a small
host pgbench can take a third of the CPU, and then the client, not the server, is the limit.

What it costs: reading /proc/stat and the stat files of the cluster's and pgbench's processes
once a second (well under 1 ms). Works as any user for processes of the same user, and as root
for all; for a server on another host it still measures this host (the load generator).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from pgscope.collect.base import Availability, CollectorContext, CollectorEnv
from pgscope.collect.polling import ThreadCollector
from pgscope.proc import child_pids
from pgscope.store import now_us

SCHEMA = """
CREATE TABLE IF NOT EXISTS host_cpu (
    ts_us BIGINT NOT NULL,      -- end of the interval (host clock)
    seconds DOUBLE,             -- length of the interval
    cpus INTEGER,               -- CPUs pgscope may use (the busy shares are of these)
    busy DOUBLE,                -- share of CPU time not idle and not iowait, all kinds
    user_share DOUBLE,          -- user + nice
    system_share DOUBLE,        -- system + irq + softirq
    iowait_share DOUBLE,
    steal_share DOUBLE,         -- taken by the hypervisor for other guests
    server_share DOUBLE,        -- share of all CPU time used by the cluster's processes
    client_share DOUBLE         -- ... by pgbench processes started by pgscope
);
"""

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_times() -> dict[str, int]:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    return {name: int(value) for name, value in zip(names, fields, strict=False)}


def _process_ticks(pid: int) -> int:
    """utime + stime of one process (clock ticks); 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def _comm(pid: int) -> str | None:
    """A process's command name; None once it is gone (it may exit between any two reads:
    a vanished /proc/PID/comm once ended the collector, and the CPU evidence, mid-run)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def _pgbench_pids() -> list[int]:
    """pgbench processes whose parent is this process (the ones pgscope started)."""
    return [pid for pid in child_pids(os.getpid()) if _comm(pid) == "pgbench"]


class HostOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    interval_s: float = Field(1.0, gt=0, le=60)


class HostCollector(ThreadCollector):
    name = "host"
    summary = "CPU busy, iowait and steal each second, and the server's vs pgbench's share"
    cost = "reading /proc once a second"
    default_in_runs = True
    Options = HostOptions

    options: HostOptions

    @classmethod
    def check(cls, env: CollectorEnv) -> Availability:
        if not Path("/proc/stat").is_file():
            return Availability.no("/proc/stat is not readable: not a Linux host")
        return Availability.yes()

    def prepare(self, ctx: CollectorContext) -> None:
        ctx.store.ensure_schema(SCHEMA)

    def _server_pids(self) -> list[int]:
        pid = self.ctx.postmaster_pid()
        return [pid, *child_pids(pid)] if pid else []

    def run_loop(self) -> None:
        self._sample_until_stopped()

    def _sample_until_stopped(self) -> None:
        cpus = len(os.sched_getaffinity(0))
        previous = _cpu_times()
        seen: dict[int, int] = {}  # pid -> ticks at the previous second (backends come and go)
        # A baseline, so that the first second does not count what processes used before.
        self._ticks_since(self._server_pids() + _pgbench_pids(), seen)
        last = time.monotonic()
        while not self.stop_event.wait(self.options.interval_s):
            now = time.monotonic()
            current = _cpu_times()
            delta = {k: current[k] - previous.get(k, 0) for k in current}
            total = sum(delta.values()) or 1
            server = self._ticks_since(self._server_pids(), seen)
            client = self._ticks_since(_pgbench_pids(), seen)
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
