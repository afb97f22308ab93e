"""The steps of a run, in the order they run: interleaved and seeded, so drift is spread."""

from __future__ import annotations

import random
from dataclasses import dataclass

from pgscope.errors import SpecError
from pgscope.spec import MAX_STEPS, Spec
from pgscope.words import counted


@dataclass(frozen=True)
class PlannedStep:
    """One measurement: a variant at a client count, in repeat block `repeat`; `step_id`
    is its place in the run, from 1."""

    step_id: int
    variant: str
    clients: int
    repeat: int


def plan_steps(spec: Spec, cores: int, seed: int) -> list[PlannedStep]:
    """Every (variant, clients) cell once per repeat block.

    With order="random", each block visits the variants in a fresh random order and, within
    a variant, the client counts in a fresh random order: drift over the run (caches, disk,
    a noisy neighbour) spreads over all cells instead of masquerading as an effect. Cells of
    one variant stay together within a block, so a variant needing a restart costs one
    restart per block, not one per step.
    """
    rng = random.Random(seed)
    variants = list(spec.variants)
    clients = spec.client_counts(cores)
    total = len(variants) * len(clients) * spec.repeats
    if total > MAX_STEPS:  # said before the list of them is made
        raise SpecError(
            f"the experiment has {total:,} steps ({counted(len(variants), 'variant')} "
            f"x {counted(len(clients), 'client count')} x {counted(spec.repeats, 'repeat')}); "
            f"at most {MAX_STEPS:,} can run: fewer client counts (--clients 1,2,4-8), "
            f"repeats or variants"
        )
    steps: list[PlannedStep] = []
    for repeat in range(1, spec.repeats + 1):
        block_variants = variants[:]
        if spec.order == "random":
            rng.shuffle(block_variants)
        for variant in block_variants:
            block_clients = clients[:]
            if spec.order == "random":
                rng.shuffle(block_clients)
            for n in block_clients:
                steps.append(PlannedStep(len(steps) + 1, variant, n, repeat))
    return steps
