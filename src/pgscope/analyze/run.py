"""A run as analysis sees it: the store's rows plus the analyses derived from them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgscope.analyze.scaling import ScalingAnalysis, analyse
from pgscope.store import RunStore


@dataclass
class RunResult:
    run_dir: Path
    run: dict[str, Any]
    steps: list[dict[str, Any]]
    scaling: ScalingAnalysis

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
    finally:
        store.close()
    if run["status"] == "running":
        # The writer is gone (it holds a lock while alive): it was killed without cleanup.
        run["status"] = "interrupted"
        run["status_reason"] = run["status_reason"] or "the run ended without finishing"
    return RunResult(run_dir, run, steps, analyse(steps, bootstrap=bootstrap))
