"""The host's CPU over the cell's measured windows (the host collector): busy, waiting for
I/O, stolen, and whose (the cluster's, pgbench's, others'); and how busy the CPUs the server
may run on were, which is what "CPU-bound" is about."""

from __future__ import annotations

from pgscope.analyze.facts import CellFacts, FactKind, FactSheet, Family, variant_settings

HOST = "the host collector"
SOURCES = ("host",)
CPU_BUSY = FactKind("host.cpu_busy", "share", "CPU busy", HOST, SOURCES)
IOWAIT = FactKind("host.iowait", "share", "CPU idle waiting for I/O", HOST, SOURCES)
STEAL = FactKind("host.steal", "share", "CPU taken by the hypervisor", HOST, SOURCES)
SERVER_CPU = FactKind("host.server_cpu", "share", "CPU used by the cluster", HOST, SOURCES)
CLIENT_CPU = FactKind("host.client_cpu", "share", "CPU used by pgbench", HOST, SOURCES)
# OTHER_CPU in an observation, where no load generator runs.
OBSERVED_OTHER = (
    "CPU used by processes other than the server's and pgscope's (kernel threads aside)"
)
OTHER_CPU = FactKind(
    "host.other_cpu",
    "share",
    "CPU used by processes other than the servers', pgbench's and pgscope's (kernel threads aside)",
    HOST,
    SOURCES,
)
SERVER_CPUS_BUSY = FactKind(
    "host.server_cpus_busy", "share", "CPU busy on the CPUs the server may use", HOST, SOURCES
)
WALSENDER_CPU = FactKind(
    "wait.walsender_cpu",
    "count",
    "walsenders on CPU, on average",
    "the activity collector",
    ("activity",),
)


class HostFamily(Family):
    name = "host"
    order = 40

    def fill(self, sheet: FactSheet, cell: CellFacts) -> None:
        row = next((h for h in cell.analysis.cpu.host if cell.owns(h)), None)
        if row is None:
            return
        where = cell.where
        if row.walsender_aas is not None:
            sheet.add(WALSENDER_CPU, row.walsender_aas, f"walsenders on CPU, on average, {where}")
        of_host = f"share of the host's CPU time {where}"
        for kind, value in (
            (CPU_BUSY, row.busy),
            (IOWAIT, row.iowait),
            (STEAL, row.steal),
            (SERVER_CPU, row.server),
            (CLIENT_CPU, row.client),
            (OTHER_CPU, row.other),
        ):
            if cell.observed and kind is CLIENT_CPU:
                continue  # an observation drives no pgbench: its clients are the others
            label = OBSERVED_OTHER if cell.observed and kind is OTHER_CPU else kind.label
            sheet.add(kind, value, f"{label}, {of_host}")
        # "CPU-bound" is about the CPUs the server may run on: pinned to 1 of 2, it saturates
        # its one core while the host looks half idle. Pinned to fewer CPUs than the host has,
        # pgbench runs on the others, so the server's own use is what keeps its CPUs busy;
        # pinned to all of them, pgbench shares them and the host's busy share is the answer.
        # Time the hypervisor steals counts as busy, as in the host's share: the server wanted
        # the CPU and did not get it (the host's steal share, taken as even across CPUs).
        pinned_setting = variant_settings(cell.analysis, cell.variant).get("pgscope.cpus")
        pinned = int(pinned_setting) if pinned_setting is not None else None
        if pinned and row.server is not None and row.cpus and pinned < row.cpus:
            sheet.add(
                SERVER_CPUS_BUSY,
                min(1.0, row.server * row.cpus / pinned + (row.steal or 0.0)),
                f"CPU busy on the {pinned} CPU{'s' if pinned > 1 else ''} the server is pinned "
                f"to (its own use plus the hypervisor's steal), {where}",
            )
        else:
            sheet.add(
                SERVER_CPUS_BUSY,
                row.busy,
                f"CPU busy on the CPUs the server may use (all of the host's), {where}",
            )
