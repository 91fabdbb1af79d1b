#!/usr/bin/env bash
# Beyond the paper, in SimGrid (docs/simulation.md, "Beyond the paper"): ATTENTION2D (no-overlap
# and overlapped), the heads x ATTENTION2D hybrid, Ring Attention, all-gather K/V and Ulysses on
# H100 fat trees of P = 256, 1024 and 4096 GPUs (8 per node; sim/platforms/h100-fattree-*x8),
# GPT-3 13B-like attention (40 heads x 128), causal, bf16, forward + backward. A grid algorithm
# runs the cost model's fastest plan of it; the planner's first three plans run too, for its
# regret. The model's machine (and the device's kernel rates) is sim/machines/h100-8x400.machine,
# which describes the platform. Every plan is a SimGrid run of its own (sim/sweep.py); one JSON
# line each goes to docs/sim/scale-pP.jsonl for each P (replaced).
#
#   scripts/sim/sim_scale.sh [--ps "256 1024 4096"]
#   sim/report.py scale docs/sim/scale-p*.jsonl --plot docs/sim/speedup_vs_p.svg
#
# P = 4096 runs N = 2^20 only (each plan a few minutes here, mostly SMPI's communicator set-up;
# docs/simulation.md, "Cost"), where Ring Attention is not simulated (its P^2 steps) and the
# report takes the model's Ring time, marked so. Plans whose engine keeps index arrays of the whole sequence
# on every rank (Ring Attention, all-gather K/V) are refused by sim/sweep.py's memory estimate
# where P of them exceed 16 GiB, and the line says so.
set -euo pipefail
cd "$(dirname "$0")/../.."
ps="256 1024 4096"
while [ $# -gt 0 ]; do
  case "$1" in
    --ps) ps=$2; shift 2 ;;
    *) echo "sim_scale: unknown option '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p docs/sim
start=$(date +%s)
echo "sim_scale: load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
problem=(--machine-file sim/machines/h100-8x400.machine --cuda-rules --memory-gbs 3350
         --heads 40 --head-dim 128 --causal --dtype bf16 --backward)
plans=attention2d,attention2d-overlap,hybrid,ring,allgather-kv,ulysses
for p in $ps; do
  platform=h100-fattree-$((p / 8))x8
  out=docs/sim/scale-p$p.jsonl
  : >"$out"
  seqs="65536 262144 1048576"
  [ "$p" -ge 4096 ] && seqs="1048576"
  refuse=()
  # Ring Attention's P^2 steps (a message and a kernel call each): 19 min here at P = 2048, so
  # about four times that at 4096 (docs/simulation.md, "Cost").
  [ "$p" -ge 4096 ] && refuse=(--not-simulated "ring=P^2 = 16.8 million ring steps, about 75 min here (19 min at P = 2048; docs/simulation.md, Cost)")
  for n in $seqs; do
    sim/sweep.py --platform "$platform" --np "$p" --out "$out" --plans "$plans" --top 3 \
      "${refuse[@]}" -- "${problem[@]}" --seq "$n"
  done
done
echo "sim_scale: done in $(( $(date +%s) - start )) s; load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
