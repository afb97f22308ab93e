"""A run as analysis sees it: the store's rows plus the analyses derived from them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgscope.analyze import compare, evidence, pgstats, timeline, waits
from pgscope.analyze.scaling import ScalingAnalysis, analyse
from pgscope.store import RunStore


@dataclass
class RunResult:
    run_dir: Path
    run: dict[str, Any]
    steps: list[dict[str, Any]]
    scaling: ScalingAnalysis
    waits: waits.WaitAnalysis | None
    counters: list[pgstats.StepStats]
    comparisons: list[compare.Comparison]
    dips: list[timeline.Dip]
    evidence: list[evidence.VariantEvidence]
    collectors: list[dict[str, Any]]
    gaps: list[dict[str, Any]]

    @property
    def host(self) -> dict[str, Any]:
        return dict(json.loads(self.run["host_json"] or "{}"))

    @property
    def complete(self) -> bool:
        return bool(self.run["status"] == "complete")


def load_run(run_dir: Path, *, bootstrap: int = 500) -> RunResult:
    store = RunStore.open(run_dir)
    try:
        run = store.run_row()
        steps = store.steps()
        wait_analysis = waits.analyse(store.db)
        counters = pgstats.per_step(store.db)
        dips = timeline.dips(store.db)
        walsender_cpu = waits.backend_cpu_aas(store.db, "walsender")
        collectors, gaps = [], []
        if store.has_table("collectors"):  # stores of schema version 1 have neither
            collectors = store.query("SELECT * FROM collectors ORDER BY name")
            gaps = store.query("SELECT * FROM collector_gaps ORDER BY start_us")
    finally:
        store.close()
    if run["status"] == "running":
        # The writer is gone (it holds a lock while alive): it was killed without cleanup.
        run["status"] = "interrupted"
        run["status_reason"] = run["status_reason"] or "the run ended without finishing"
    spec = json.loads(run["spec_json"] or "{}")
    declared = list(spec.get("variants") or {})
    scaling = analyse(steps, bootstrap=bootstrap, variant_order=declared)
    return RunResult(
        run_dir,
        run,
        steps,
        scaling,
        wait_analysis,
        counters,
        compare.compare_variants(steps, spec.get("baseline") or next(iter(declared), None)),
        dips,
        evidence.per_variant(scaling.cells, wait_analysis, counters, walsender_cpu),
        collectors,
        gaps,
    )
