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
python3 - "$results" "$ranks" "${problem[*]}" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print(f"# {sys.argv[2]} ranks, {sys.argv[3]}, forward + backward")
print(f"{'algorithm':24} {'layout':11} {'fwd ms':>9} {'bwd ms':>9} {'fwd MB/rank':>12} "
      f"{'bwd MB/rank':>12} {'fwd msgs':>8} {'bwd msgs':>8} {'max err':>9}")
for r in rows:
    name = r["algo"] + (f" {r['grid']}" if r["algo"].startswith("attention2d") else "")
    print(f"{name:24} {r['layout']:11} {r['fwd_ms']:9.1f} {r['bwd_ms']:9.1f} "
          f"{r['bytes_sent_fwd'] / 1e6:12.3f} {r['bytes_sent_bwd'] / 1e6:12.3f} "
          f"{r['messages_fwd']:8d} {r['messages_bwd']:8d} "
          + (f"{r['max_rel_err']:9.2e}" if "max_rel_err" in r else f"{'-':>9}"))
PY
