#!/usr/bin/env bash
# Interleaved A/B of two versions of pgscope under one benchmark: ROUNDS rounds, each running
# the base commit and the working tree in a random order, each in its own process (and, for
# the benchmarks here, its own fresh cluster). The base runs from a throw-away worktree with
# this tree's benchmark script and this venv (PYTHONPATH to the base's src), so that only the
# code under test differs. Each run holds the load lock, as every load on this host must.
#
#   bench/ab_commits.sh BASE ROUNDS -- bench/bench_activity.py cpu --rates 50,100 --repeats 1
#
# Results: this tree's JSON in bench/results/, the base's copied to bench/results/ab-base/,
# the printed lines in bench/results/ab-<time>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
base=$1 rounds=$2
shift 2
[[ ${1:-} == -- ]] && shift
here=$(pwd)
tmp=$(mktemp -d /tmp/pgscope-ab-XXXXXX)
git worktree add --detach "$tmp" "$base" -q
trap 'git worktree remove --force "$tmp"' EXIT
cp bench/*.py "$tmp/bench/"
mkdir -p bench/results
log="bench/results/ab-$(date -u +%Y%m%d-%H%M%S).log"
for round in $(seq 1 "$rounds"); do
  order=(base new)
  (( RANDOM % 2 )) && order=(new base)
  for which in "${order[@]}"; do
    dir=$here
    [[ $which == base ]] && dir=$tmp
    echo "== round $round: $which" | tee -a "$log"
    (cd "$dir" && flock /tmp/pgscope-load.lock env PYTHONPATH="$dir/src" \
      "$here/.venv/bin/python" "$@") 2>&1 | grep -v '^  ·' | tee -a "$log"
  done
done
# The base's worktree goes at exit: its JSON is kept beside this tree's.
mkdir -p bench/results/ab-base
cp "$tmp"/bench/results/*.json bench/results/ab-base/ 2>/dev/null || true
echo "printed lines: $log; the base's JSON: bench/results/ab-base/, this tree's: bench/results/"
