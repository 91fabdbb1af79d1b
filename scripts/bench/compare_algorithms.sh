#!/usr/bin/env bash
# Runs every algorithm (ATTENTION2D, its overlapped variant, Ring in three layouts, all-gather K/V,
# Ulysses) on the same problem and prints one table: time (slowest rank, median of 3 after one
# warm-up), bytes and messages the busiest rank sent per call, and (with --check among the
# options) the largest error against the fp64 reference.
#   scripts/bench/compare_algorithms.sh [RANKS] [a2d run options...]
# Default: 16 ranks, N = 2048, H = Hkv = 16, D = 64, causal; forward and backward always.
# docs/baselines.md quotes its output. Needs build/ (scripts/build.sh build).
set -euo pipefail
cd "$(dirname "$0")/../.."
ranks=${1:-16}
shift || true
problem=("$@")
if [ ${#problem[@]} -eq 0 ]; then
  problem=(--seq 2048 --heads 16 --kv-heads 16 --head-dim 64 --causal)
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
variants=("attention2d" "attention2d-overlap" "ring --layout zigzag" "ring --layout striped"
          "ring --layout contiguous" "allgather-kv" "ulysses")
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for variant in "${variants[@]}"; do
  # shellcheck disable=SC2086
  mpiexec -np "$ranks" --oversubscribe build/a2d run --algo $variant "${problem[@]}" --backward \
    --json --warmup 1 --iters 3 >>"$results"
done
scripts/report.py --rows "$results" --text --missing - \
  --title "# $ranks ranks, ${problem[*]}, forward + backward" \
  'algorithm=algo + (" " + grid if algo.startswith("attention2d") else ""):24' 'layout=layout:11' \
  'fwd ms=fwd_ms:9.1f' 'bwd ms=bwd_ms:9.1f' 'fwd MB/rank=bytes_sent_fwd / 1e6:12.3f' \
  'bwd MB/rank=bytes_sent_bwd / 1e6:12.3f' 'fwd msgs=messages_fwd:8d' 'bwd msgs=messages_bwd:8d' \
  'max err=max_rel_err:9.2e'
