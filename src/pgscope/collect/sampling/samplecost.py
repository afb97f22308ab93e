"""What a wait sample costs, as measured: one place for the figures `pgscope doctor` (the
activity collector's cost), `observe --help` and the docs state. A module of its own, light to
import: the CLI's help reads it at start-up."""

from __future__ import annotations

# CPU per sample, pgscope's and the server's together, of each source at 100 Hz: measured
# with `bench/bench_activity.py cpu --rates 100 --repeats 3 --seconds 12 --sources
# sql,memory` (docs/observe.md, docs/benchmarks.md).
SAMPLE_COST_MS = {"sql": 0.115, "memory": 0.040}
COST_HZ = 100


def cost_line() -> str:
    """What sampling costs, in one line (doctor, the collector's listing)."""
    sql, memory = SAMPLE_COST_MS["sql"], SAMPLE_COST_MS["memory"]
    return (
        f"{sql:.3f} ms of CPU per sample through SQL ({sql * COST_HZ / 10:.2f}% of one core at "
        f"{COST_HZ} Hz), {memory:.3f} ms from shared memory ({memory * COST_HZ / 10:.2f}%), "
        f"docs/observe.md"
    )
