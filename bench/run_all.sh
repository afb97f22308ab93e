#!/usr/bin/env bash
# Every benchmark, then every field-case recipe (--quick for its time, full for its figures),
# one after another. Run on a quiet host: nothing else should load it meanwhile (not even the
# test suite). Outputs go to bench/results/<UTC time>/; docs/benchmarks.md and
# docs/field-cases.md are written from them.
#
#   bench/run_all.sh            everything (~95 min on the 2-vCPU development VM)
#   bench/run_all.sh collectors the collector benchmarks only (~55 min)
#   bench/run_all.sh recipes    the recipes only (~40 min)
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out="bench/results/$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$out"
step() {
  local name=$1; shift
  echo "== $(date -u +%H:%M:%S) $name: $*"
  local start=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  echo "   exit $? after $((SECONDS - start)) s"
}
if [[ $what == all || $what == collectors ]]; then
  step activity-cpu .venv/bin/python bench/bench_activity.py cpu
  step activity-pgws-cpu .venv/bin/python bench/bench_activity.py pgws-cpu
  step activity-floor .venv/bin/python bench/bench_activity.py floor --repeats 5 --seconds 6
  step perf .venv/bin/python bench/bench_perf.py --pairs 5 --seconds 15 --profile-seconds 60
  step usdt .venv/bin/python bench/bench_usdt.py --pairs 5 --seconds 10 --scale 10 --bystander --hold
  step trap-cost .venv/bin/python bench/bench_trap_cost.py --pairs 7 --seconds 10
  step pglocks-cost .venv/bin/python bench/bench_pglocks.py
  step plans-cost .venv/bin/python bench/bench_plans.py --pairs 7 --seconds 20
  step observe-analysis .venv/bin/python bench/bench_observe.py
  step repository .venv/bin/python bench/bench_repository.py
fi
if [[ $what == all || $what == recipes ]]; then
  for recipe in logging syncrep checkpoint cpus scaling; do
    step "quick-$recipe" .venv/bin/pgscope run "$recipe" --quick --json --results-dir "$out/runs"
  done
  for recipe in logging syncrep checkpoint cpus; do
    step "full-$recipe" .venv/bin/pgscope run "$recipe" --json --results-dir "$out/runs"
  done
  step planted-checkpoint .venv/bin/python bench/planted_checkpoint.py --mb-per-s 64 \
    --results-dir "$out/runs" -- --quick
fi
echo "== done: $out"
