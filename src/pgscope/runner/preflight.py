"""Checks before any load: what would fail later, or do what the user did not allow, is said
now in one line, mostly before a run folder exists."""

from __future__ import annotations

import shutil
from pathlib import Path

from pgscope.drive.pgbench import current_scale, tables_needed
from pgscope.drive.readonly import lifting_statement
from pgscope.errors import EnvironmentProblem, RefusedError, SpecError, TargetError
from pgscope.runner.variants import effective_settings, variant_cpus, variant_instances
from pgscope.spec import WRITE_WORKLOADS, LoadedSpec, ScriptRef, Spec, setting_text
from pgscope.target.conn import ConnParams
from pgscope.target.embedded import EmbeddedCluster
from pgscope.target.server import ExistingServer
from pgscope.words import n_clients

MIN_FREE_RESULTS = 64 * 2**20  # the store, logs and per-step transaction logs of a short run
MIN_FREE_CLUSTER = 256 * 2**20  # initdb, WAL, and pgbench's tables on top (per scale unit)


def check_request(
    loaded: LoadedSpec, cores: int, target: ConnParams | None, allow_writes: bool
) -> None:
    """The refusals of a run, said before anything connects or starts (so `run --plan` says
    them too): variants this host cannot run; on a user's server (`target`), what pgscope
    does only to clusters it owns, and writes unless `allow_writes`."""
    check_host_fits(loaded, cores)
    if target is None:
        return
    check_server_request(loaded.spec, ExistingServer(target, allow_writes), allow_writes)
    if not allow_writes:
        check_read_only_scripts(loaded.scripts(), loaded.spec.protocol)


def check_host_fits(loaded: LoadedSpec, cores: int) -> None:
    """Refuse variants this host cannot run: more pinned CPUs than it lets pgscope use, or
    more instances than a step has clients."""
    spec = loaded.spec
    most_pinned = max((variant_cpus(spec, v) or 0 for v in spec.variants), default=0)
    if most_pinned > cores:
        raise EnvironmentProblem(
            f"{loaded.source}: a variant pins the server to {most_pinned} CPUs but this host "
            f"lets pgscope use {cores}; lower pgscope.cpus or run on a bigger host"
        )
    most_instances = max(variant_instances(spec, v) for v in spec.variants)
    if most_instances > min(spec.client_counts(cores)):
        raise SpecError(
            f"{loaded.source}: a variant splits the load over {most_instances} instances but "
            f"a step has only {n_clients(min(spec.client_counts(cores)))}; every instance needs one"
        )


def check_read_only_scripts(scripts: list[ScriptRef], protocol: str) -> None:
    """Refuse, before any load, a script that could lift the read-only guard on a user's
    server (drive/readonly.py says what and why)."""
    why = lifting_statement([script.path for script in scripts], protocol)
    if why is not None:
        raise RefusedError(
            f"script {why} could lift the read-only guard on your server; pgscope only "
            f"reads from an existing server unless you pass --allow-writes"
        )


def check_role(server: ExistingServer, scripts: list[ScriptRef]) -> str | None:
    """Read-only rests on the role: a user's scripts run only as one that cannot write or act
    beyond reading (target/privileges.py), else refused (exit 6) naming what it could do.
    Without scripts, pgscope's own read-only workload runs under the read-only guard as any
    role: what the role could do is returned, to be said."""
    power = server.write_privilege()
    if power is not None and scripts:
        raise RefusedError(
            f"{power}: a user script could write as it; use a role with SELECT only, "
            f"or --allow-writes"
        )
    return power


def check_tables(server: ExistingServer, scale: int) -> None:
    """Without --allow-writes, pgbench's tables must already be there at the spec's scale:
    said before a run folder exists. A role that may not count them is told which GRANT by
    the run, which keeps that reason in its folder."""
    if scale == 0:
        return
    try:
        existing = current_scale(server.conn)
    except TargetError:
        return
    if existing != scale:
        raise tables_needed(scale, existing)


def check_server_request(spec: Spec, server: ExistingServer, allow_writes: bool) -> None:
    """Refuse what pgscope does only to clusters it owns (settings, pinning, instances,
    standbys), and writes to a user's server unless `allow_writes`."""
    if any(variant_instances(spec, v) > 1 for v in spec.variants):
        raise RefusedError(
            "pgscope.instances starts clusters of its own; it cannot split a "
            "user's server: drop --dsn"
        )
    if any(variant_cpus(spec, v) for v in spec.variants):
        raise RefusedError(
            "pgscope.cpus pins the server's processes; pgscope does that only "
            "to an embedded cluster it owns: drop --dsn"
        )
    if spec.standbys:
        raise RefusedError(
            "standbys are started by pgscope next to an embedded cluster; they "
            "cannot be added to an existing server: drop --dsn"
        )
    # The spec's and each variant's own, not merged: the refusal names where a setting is.
    server.refuse_settings({k: setting_text(v) for k, v in spec.settings.items()}, "the spec")
    for name, settings in spec.variants.items():
        server.refuse_settings(
            {k: setting_text(v) for k, v in settings.items()}, f"variant {name!r}"
        )
    if allow_writes:
        return
    if spec.workload in WRITE_WORKLOADS:
        raise RefusedError(
            f"workload {spec.workload} writes to the server; pgscope only reads "
            f"from an existing server unless you pass --allow-writes"
        )
    if spec.init_sql:
        raise RefusedError("init_sql runs arbitrary SQL on the server; pass --allow-writes")
    if spec.actions:
        raise RefusedError(
            "actions run arbitrary SQL on the server during each step; pass --allow-writes"
        )


def check_folders(results_dir: Path, cluster_dir: Path | None, scale: int) -> None:
    """Create the results folder, then check that it and the folder the embedded cluster will
    live in (None: no embedded cluster) have room for the run."""
    make_results_dir(results_dir)
    check_free_space(results_dir, MIN_FREE_RESULTS, "the results folder")
    if cluster_dir is not None:
        check_free_space(
            cluster_dir,
            MIN_FREE_CLUSTER + scale * 16 * 2**20,
            "the cluster's folder (--work-dir)",
        )


def make_results_dir(folder: Path) -> None:
    """Create the results folder first: a folder that cannot exist (read-only parent, a
    pseudo file system such as /proc) is the error to report, not its free space."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot create run folder {folder}: {exc.strerror or exc}"
        ) from None


def check_free_space(folder: Path, needed: int, what: str) -> None:
    """Refuse to start when a folder's file system is nearly full: better now, in one line,
    than a failed write in the middle of a step."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return  # unknown: the write will say
    if free < needed:
        raise EnvironmentProblem(
            f"{what} {folder} has {free / 2**20:.0f} MB free; this run "
            f"needs at least {needed / 2**20:.0f} MB"
        )


def validate_variants(cluster: EmbeddedCluster, spec: Spec) -> None:
    """Check every variant's settings with the server's own parser, before any load: a typo
    in the last variant would otherwise fail the run hours in."""
    for variant in spec.variants:
        cluster.validate_settings(effective_settings(spec, variant), f"variant {variant!r}")
