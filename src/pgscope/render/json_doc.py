"""The machine-readable form of a run (`--json`, summary.json): the analysis model as one JSON
document, a key per report section (docs/json.md). Computes nothing itself."""

from __future__ import annotations

from typing import Any

from pgscope.analyze.model import RunAnalysis, to_document


def run_document(analysis: RunAnalysis) -> dict[str, Any]:
    return to_document(analysis)
