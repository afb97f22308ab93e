"""The runner: from a validated spec to a run folder, step by step, always tearing down.

Order of work: plan the steps -> create the run store -> bring up the target (embedded cluster
or existing server) -> validate every variant's settings -> initialise the workload's tables ->
run the steps (apply the variant, run pgbench, store progress live, then percentiles) ->
tear down. SIGINT and SIGTERM become exceptions in the main thread, so the same `finally`
blocks stop pgbench and the server on every path; rows already stored stay stored.

Modules, in that order: `plan`, `preflight`, `run` (`execute`), `topology` (the servers and
their teardown), `initialise`, `loop`, `instances`, `step`; `variants` reads a variant's
settings, `context` holds what a run works with.
"""

from pgscope.runner.instances import split_clients
from pgscope.runner.plan import PlannedStep, plan_steps
from pgscope.runner.run import RunOptions, execute, new_run_id
from pgscope.runner.variants import effective_settings

# What other modules imported when the runner was one module.
__all__ = [
    "PlannedStep",
    "RunOptions",
    "effective_settings",
    "execute",
    "new_run_id",
    "plan_steps",
    "split_clients",
]
