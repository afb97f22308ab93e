"""A run as analysis sees it: the store's rows plus the analyses derived from them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from pgscope.analyze import compare, evidence, pgstats, timeline, waits
from pgscope.analyze.diagnose import Diagnosis, diagnose
from pgscope.analyze.facts import FactSheet, extract
from pgscope.analyze.scaling import ScalingAnalysis, analyse
from pgscope.errors import InputFileError
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
    facts: list[FactSheet] = field(default_factory=list)
    diagnosis: Diagnosis | None = None

    @property
    def host(self) -> dict[str, Any]:
        return dict(json.loads(self.run["host_json"] or "{}"))

    @property
    def complete(self) -> bool:
        return bool(self.run["status"] == "complete")


def load_run(run_dir: Path, *, bootstrap: int = 500) -> RunResult:
    """A run's analyses, from its store; a damaged store is a one-line error."""
    try:
        return _load_run(run_dir, bootstrap)
    except duckdb.Error as exc:
        reason = " ".join(str(exc).split())[:200]
        raise InputFileError(
            f"{run_dir}: the run store is damaged or from an unknown version: {reason}"
        ) from None


def _load_run(run_dir: Path, bootstrap: int) -> RunResult:
    store = RunStore.open(run_dir)
    try:
        run = store.run_row()
        if run["status"] == "running":
            # The writer is gone (it holds a lock while alive): killed without cleanup.
            run["status"] = "interrupted"
            run["status_reason"] = run["status_reason"] or "the run ended without finishing"
        steps = store.steps()
        wait_analysis = waits.analyse(store.db)
        counters = pgstats.per_step(store.db)
        dips = timeline.dips(store.db)
        walsender_cpu = waits.backend_cpu_aas(store.db, "walsender")
        collectors, gaps = [], []
        if store.has_table("collectors"):  # stores of schema version 1 have neither
            collectors = store.query("SELECT * FROM collectors ORDER BY name")
            gaps = store.query("SELECT * FROM collector_gaps ORDER BY start_us")
        spec = json.loads(run["spec_json"] or "{}")
        declared = list(spec.get("variants") or {})
        scaling = analyse(steps, bootstrap=bootstrap, variant_order=declared)
        result = RunResult(
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
        result.facts = extract(store, result)
    finally:
        store.close()
    result.diagnosis = diagnose(result.facts)
    return result
