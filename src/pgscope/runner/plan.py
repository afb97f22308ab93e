"""The steps of a run, in the order they run: interleaved and seeded, so drift is spread.

A run with offered rates (open loop) runs its closed-loop sweep first, then its rates: a rate
given as a share of the peak is known only once the sweep measured it (the loop resolves it,
`resolved`)."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from pgscope.errors import SpecError
from pgscope.spec import MAX_STEPS, OfferedRate, Spec
from pgscope.words import counted


@dataclass(frozen=True)
class PlannedStep:
    """One measurement: a variant at a client count, in repeat block `repeat`; `step_id`
    is its place in the run, from 1. An open-loop step has its `offered` rate, and once it is
    resolved (a share of the peak: once the sweep measured it) its `rate` in tps."""

    step_id: int
    variant: str
    clients: int
    repeat: int
    offered: OfferedRate | None = None
    rate: float | None = None

    @property
    def open_loop(self) -> bool:
        return self.offered is not None

    def resolved(self, rate: float) -> PlannedStep:
        return dataclasses.replace(self, rate=rate)

    def describe(self) -> str:
        """The load in words: "clients=4", or "clients=4  offered 4,000 tps"."""
        who = f"clients={self.clients}"
        if self.offered is None:
            return who
        if self.rate is not None:
            rate = f"{self.rate:,.0f} tps"
            if self.offered.share_of_peak is not None:
                rate += f" ({self.offered.share_of_peak:.0%} of the peak)"
        else:
            rate = self.offered.label
        return f"{who}  offered {rate}"


def plan_steps(spec: Spec, cores: int, seed: int) -> list[PlannedStep]:
    """Every (variant, clients) cell once per repeat block; then, with offered rates, every
    (variant, rate) once per repeat block.

    With order="random", each block visits the variants in a fresh random order and, within
    a variant, the client counts (the rates) in a fresh random order: drift over the run
    (caches, disk, a noisy neighbour) spreads over all cells instead of masquerading as an
    effect. Cells of one variant stay together within a block, so a variant needing a restart
    costs one restart per block, not one per step.
    """
    rng = random.Random(seed)
    variants = list(spec.variants)
    clients = spec.client_counts(cores)
    rates = spec.offered_rates()
    # Each repeat block has the sweep's cells and, open loop, the rates.
    total = len(variants) * (len(clients) + len(rates)) * spec.repeats
    if total > MAX_STEPS:  # said before the list of them is made
        per_block = counted(len(clients), "client count")
        if rates:
            per_block = f"({per_block} + {counted(len(rates), 'rate')})"
        raise SpecError(
            f"the experiment has {total:,} steps ({counted(len(variants), 'variant')} "
            f"x {per_block} x {counted(spec.repeats, 'repeat')}); "
            f"at most {MAX_STEPS:,} can run: fewer client counts (--clients 1,2,4-8), "
            f"rates, repeats or variants"
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
    if not rates:
        return steps
    # The rates after the whole sweep: a share of the peak needs the peak measured. Their
    # clients are a pool: by default the widest the sweep measured, so that the pool is not
    # what runs short (a throttled client sleeps between its transactions, and pays a wake-up
    # for each) and the closed loop's latency at the same clients is known.
    rate_clients = spec.rate_client_count(cores)
    for repeat in range(1, spec.repeats + 1):
        block_variants = variants[:]
        if spec.order == "random":
            rng.shuffle(block_variants)
        for variant in block_variants:
            block_rates = rates[:]
            if spec.order == "random":
                rng.shuffle(block_rates)
            for offered in block_rates:
                steps.append(
                    PlannedStep(
                        len(steps) + 1,
                        variant,
                        rate_clients,
                        repeat,
                        offered,
                        offered.tps,
                    )
                )
    return steps
