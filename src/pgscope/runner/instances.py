"""`pgscope.instances`: several clusters side by side, each step's clients split over them."""

from __future__ import annotations

from pgscope.drive.pgbench import Pgbench
from pgscope.runner.context import RunContext
from pgscope.runner.initialise import run_init_sql
from pgscope.runner.plan import PlannedStep
from pgscope.runner.variants import effective_settings, variant_instances


def activate_instances(ctx: RunContext, step: PlannedStep) -> list[Pgbench]:
    """Make exactly the step's variant's extra instances run, with its settings, each fresh
    from a CHECKPOINT; stop (but keep) the others. Returns their drivers."""
    servers = ctx.servers
    wanted = variant_instances(ctx.spec, step.variant) - 1
    if servers.cluster is None or (wanted == 0 and not servers.instances):
        return []
    settings = effective_settings(ctx.spec, step.variant)
    while len(servers.instances) < wanted:
        number = len(servers.instances) + 2
        instance = servers.start_instance(number)
        driver = Pgbench(ctx.pgbench.pg, instance.conn, read_only=False, user=ctx.pgbench.user)
        if ctx.spec.scale > 0:
            driver.initialise(ctx.spec.scale, allow_writes=True)
        init_sql = ctx.loaded.init_sql_path()
        if init_sql is not None:
            run_init_sql(ctx.pgbench.pg, instance.conn, init_sql, ctx.pgbench.user)
        ctx.store.add_event("instance", f"instance {number} started and initialised", step.step_id)
    drivers = []
    for index, instance in enumerate(servers.instances):
        if index >= wanted:
            instance.stop()
            continue
        instance.resume()
        instance.apply_settings(settings)
        with instance.connect() as session:
            session.execute("CHECKPOINT")
        drivers.append(
            Pgbench(ctx.pgbench.pg, instance.conn, read_only=False, user=ctx.pgbench.user)
        )
    return drivers


def split_clients(clients: int, instances: int) -> list[int]:
    """Clients per instance, as even as can be: 8 over 3 -> [3, 3, 2]."""
    base, extra = divmod(clients, instances)
    return [base + (1 if i < extra else 0) for i in range(instances)]
