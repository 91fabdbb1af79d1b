#!/usr/bin/env bash
# What `a2d bench --calibrate` predicts when the machine slows down during the rows only: one core
# loaded with a busy loop after the calibration before the rows and gone before the one after
# them. Runs the same bench twice, with the kernel rates resampled between the rows' rounds (the
# default) and with --no-resample-kernel, and prints measured / predicted for both.
#   scripts/bench/bench_drift.sh [A2D_BINARY]     (about 7 minutes; results in $OUT, default bench-drift)
# An experiment for docs/cost-model.md (section 5), not a test: the busy loop's window is set from
# a timed `a2d calibrate` run like the bench's own, so that it falls inside the rows.
set -euo pipefail
cd "$(dirname "$0")/../.."
a2d=${1:-build/a2d}
out=${OUT:-bench-drift}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpiexec --oversubscribe --bind-to core:overload-allowed -np 4)
problem=(--seq 16384 --heads 8 --head-dim 64 --causal --backward --warmup 1 --iters 9
         --algo attention2d --grid 2x2 --json --calibrate)

# How long the bench's calibration before the rows takes here (the same settings).
start=$(date +%s)
"${mpi[@]}" "$a2d" calibrate --heads 8 --head-dim 64 --iters 9 --kernel-seconds 1 \
  --out "$out/probe-calibration.txt" > /dev/null
calibration_s=$(( $(date +%s) - start ))
# The loop starts 10 s into the rows and lasts 45 s; the rows take longer than a minute.
load_from=$(( calibration_s + 10 ))
load_for=45

for mode in resampled before-after; do
  flags=()
  [ "$mode" = before-after ] && flags=(--no-resample-kernel)
  rm -f "$out/calibration-$mode.txt"
  ( sleep "$load_from"; taskset -c 0 timeout "$load_for" sh -c 'while :; do :; done' || true ) &
  loader=$!
  "${mpi[@]}" "$a2d" bench "${problem[@]}" "${flags[@]}" \
    --calibration "$out/calibration-$mode.txt" > "$out/bench-$mode.json"
  wait "$loader"
done

first=$(mktemp -d)  # each bench's first row
trap 'rm -rf "$first"' EXIT
inputs=()
for mode in resampled before-after; do
  head -1 "$out/bench-$mode.json" >"$first/$mode.json"
  rate=$(sed -n 's/^kernel_forward_causal_gflops[^=]*=//p' "$out/calibration-$mode.txt" | head -1)
  inputs+=(--rows "$first/$mode.json" --set "mode=$mode" --set "rate=$(echo $rate)")
done
scripts/report.py "${inputs[@]}" 'kernel rates=mode' 'fwd ms=fwd_ms:.1f' 'pred=pred_fwd_ms:.1f' \
  'm/p=ratio_fwd:.2f' 'bwd ms=bwd_ms:.1f' 'pred=pred_bwd_ms:.1f' 'm/p=ratio_bwd:.2f' \
  'causal fwd GFLOP/s/rank saved=rate'
