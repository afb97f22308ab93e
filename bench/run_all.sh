#!/usr/bin/env bash
# Every benchmark, then every field-case recipe (--quick for its time, full for its figures),
# one after another. Run on a quiet host: nothing else should load it meanwhile. Outputs go to
# bench/results/<UTC time>/; docs/benchmarks.md and docs/field-cases.md are written from them.
set -uo pipefail
cd "$(dirname "$0")/.."
out="bench/results/$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$out"
step() {
  local name=$1; shift
  echo "== $(date -u +%H:%M:%S) $name: $*"
  local start=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  echo "   exit $? after $((SECONDS - start)) s"
}
step activity-overhead .venv/bin/python bench/bench_activity.py overhead
step activity-accuracy .venv/bin/python bench/bench_activity.py accuracy
step perf .venv/bin/python bench/bench_perf.py
step usdt .venv/bin/python bench/bench_usdt.py --pairs 5 --seconds 20 --scale 10 --bystander --hold
for recipe in logging syncrep checkpoint cpus scaling; do
  step "quick-$recipe" .venv/bin/pgscope run "$recipe" --quick --json --results-dir "$out/runs"
done
for recipe in logging syncrep checkpoint cpus; do
  step "full-$recipe" .venv/bin/pgscope run "$recipe" --json --results-dir "$out/runs"
done
echo "== done: $out"
