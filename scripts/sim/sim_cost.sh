#!/usr/bin/env bash
# What a simulation costs here beyond the sweeps' own records (docs/simulation.md, "Cost"):
# Ring Attention at P = 2048 (its P^2 ring steps are what bound it), and the host memory of the
# two ways SMPI can hold the ranks' globals (shared, as sim/run.sh runs them, or a copy of the
# program per rank) at P = 16 and 256. Wall time and peak memory of every run, with the load
# average, go to OUT (replaced). scripts/sim/sim_scale.sh records the same for each of its runs.
#
#   scripts/sim/sim_cost.sh [--out docs/sim/cost.jsonl] [--no-ring]
#
# About 25 minutes here, of which Ring Attention at P = 2048 is about 20; --no-ring leaves it
# out (the globals' memory alone: about 3 minutes).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=docs/sim/cost.jsonl
ring=1
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --no-ring) ring=0; shift ;;
    *) echo "sim_cost: unknown option '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$(dirname "$out")"
: >"$out"
h100=(--machine-file sim/machines/h100-8x400.machine --cuda-rules --memory-gbs 3350 --heads 40
      --head-dim 128 --causal --dtype bf16 --backward)
if [ "$ring" = 1 ]; then
  sim/sweep.py --platform h100-fattree-512x8 --np 2048 --out "$out" --plans ring --timeout 3600 -- \
    "${h100[@]}" --seq 65536
fi
for config in "a100-16x4 16 a100-hdr 4" "h100-fattree-32x8 256 h100-ndr 8"; do
  read -r platform p machine per_node <<<"$config"
  for privatize in "" --privatize; do
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    /usr/bin/time -f "%e %M" -o /tmp/a2d-sim-cost.$$ sim/run.sh --platform "$platform" -np "$p" \
      $privatize -- --machine "$machine" --gpus-per-node "$per_node" \
      --seq 65536 --heads 40 --head-dim 128 --causal --backward --plans attention2d >/dev/null
    read -r wall rss </tmp/a2d-sim-cost.$$
    echo "{\"platform\": \"$platform\", \"ranks\": $p, \"privatize\": \"${privatize:-no}\", \"sim_wall_s\": $wall, \"sim_max_rss_mib\": $((rss / 1024)), \"load_before\": \"$load\"}" >>"$out"
  done
done
rm -f /tmp/a2d-sim-cost.$$
cat "$out"
