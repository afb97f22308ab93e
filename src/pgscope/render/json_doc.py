"""The machine-readable form of a run (`--json`, summary.json). Computes nothing itself."""

from __future__ import annotations

from typing import Any

from pgscope.analyze.run import RunResult

JSON_SCHEMA_VERSION = 1


def step_json(step: dict[str, Any]) -> dict[str, Any]:
    return {
        "step_id": step["step_id"],
        "variant": step["variant"],
        "clients": step["clients"],
        "repeat": step["repeat"],
        "status": step["status"],
        "error": step["error"],
        "tps": step["tps"],
        "xacts": step["xacts"],
        "failed_xacts": step["failed"],
        "latency_ms": {
            "mean": step["latency_mean_ms"],
            "p50": step["p50_ms"],
            "p90": step["p90_ms"],
            "p95": step["p95_ms"],
            "p99": step["p99_ms"],
            "p999": step["p999_ms"],
            "max": step["max_ms"],
        },
        "started_us": step["started_us"],
        "ended_us": step["ended_us"],
    }


def run_document(result: RunResult) -> dict[str, Any]:
    run = result.run
    fits = {v: f.to_json() for v, f in result.scaling.fits.items()}
    first_variant = next(iter(result.scaling.variants()), None)
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "run_id": run["run_id"],
        "run_dir": str(result.run_dir.resolve()),
        "status": run["status"],
        "status_reason": run["status_reason"],
        "recipe": run["recipe"],
        "command_line": run["command_line"],
        "pgscope_version": run["pgscope_version"],
        "target": {
            "kind": run["target_kind"],
            "conninfo": run["target_conninfo"],
            "server_version": run["server_version"],
        },
        "host": result.host,
        "started_us": run["started_us"],
        "ended_us": run["ended_us"],
        "steps": [step_json(s) for s in result.steps],
        "summary": [c.to_json() for c in result.scaling.cells],
        # The first variant's fit at top level: what a single-variant run is about.
        "usl": fits.get(first_variant) if first_variant else None,
        "fits": fits,
        "fit_errors": result.scaling.fit_errors,
        "waits": result.waits.to_json() if result.waits is not None else None,
        "counters": [c.to_json() for c in result.counters],
        "comparisons": [c.to_json() for c in result.comparisons],
        "dips": [d.to_json() for d in result.dips],
        "evidence": [e.to_json() for e in result.evidence],
        "diagnosis": result.diagnosis.to_json() if result.diagnosis else None,
        "findings": result.diagnosis.to_json()["findings"] if result.diagnosis else [],
        "facts": [sheet.to_json() for sheet in result.facts],
        "collectors": result.collectors,
        "collector_gaps": result.gaps,
    }
