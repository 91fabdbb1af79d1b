#!/usr/bin/env bash
# The paper's setting in SimGrid (docs/simulation.md, "The paper's table"): ATTENTION2D-NO and
# ATTENTION2D-O on the square grid (with the K/V transpose) and Ring Attention (zigzag), forward +
# backward, GPT-3-like attention (760M: 16 heads x 96, 2.7B: 32 x 80, 13B: 40 x 128), causal,
# bf16, batch 1, N = 2^13 ... 2^17, on 16 and 64 GPUs of both testbeds (sim/platforms/a100-16x4,
# h100-64x1). One JSON line per plan (a2d sim's, with the platform) is written to OUT.
#
#   scripts/sim/sim_paper.sh [--out docs/sim/paper.jsonl] [--binary build/smpi/a2d]
#   sim/report.py paper docs/sim/paper.jsonl          (the tables of docs/simulation.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=docs/sim/paper.jsonl binary=build/smpi/a2d
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --binary) binary=$2; shift 2 ;;
    *) echo "sim_paper: unknown option '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$(dirname "$out")"
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
start=$(date +%s)
echo "sim_paper: load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for testbed in "a100-16x4 a100-hdr 4" "h100-64x1 h100-ndr 1"; do
  read -r platform machine per_node <<<"$testbed"
  for p in 16 64; do
    side=$([ "$p" = 16 ] && echo 4 || echo 8)
    for model in "760M 16 96" "2.7B 32 80" "13B 40 128"; do
      read -r name heads dim <<<"$model"
      for n in 8192 16384 32768 65536 131072; do
        sim/run.sh --platform "$platform" -np "$p" --binary "$binary" -- \
          --machine "$machine" --gpus-per-node "$per_node" --seq "$n" --heads "$heads" \
          --head-dim "$dim" --causal --dtype bf16 --backward --warmup 0 --json \
          --plans "attention2d:${side}x${side},attention2d-overlap:${side}x${side},ring" |
          sed "s/^{/{\"platform\": \"$platform\", \"model\": \"$name\", /" >>"$rows"
      done
    done
  done
done
mv "$rows" "$out"
trap - EXIT
echo "sim_paper: $(wc -l <"$out") rows in $(( $(date +%s) - start )) s; load after: $(cut -d' ' -f1-3 /proc/loadavg); $out" >&2
