#!/usr/bin/env bash
# The measurements of docs/benchmarks.md: at P = 4, 9 and 16 ranks and N = 4096 and 16384 (B=1,
# H=8, D=64, causal, forward and backward), calibrate the cost model and run every algorithm and
# every ATTENTION2D grid side by side in one process group, each row beside the model's prediction.
# Prints Markdown tables; raw JSON rows go to $OUT (default bench-results/).
#   scripts/bench/bench_report.sh [A2D_BINARY]
set -euo pipefail
cd "$(dirname "$0")/../.."
a2d=${1:-build/a2d}
out=${OUT:-bench-results}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpiexec --oversubscribe --bind-to core:overload-allowed)
# Each (P, N) group measures the machine first (bench --calibrate) into its own calibration file,
# so that every prediction comes from the same run as the times it is compared with: the machine
# is shared, and its speed drifts by tens of per cent over minutes.
# Rows at N = 4096 take a few hundred ms, where one slow spell of the shared cores is a large part
# of a repeat: they get 11 timed rounds (medians of 11), the rows at N = 16384 (seconds each) 5.
for ranks in 4 9 16; do
  for seq in 4096 16384; do
    iters=5
    if [ "$seq" -le 4096 ]; then iters=11; fi
    rm -f "$out/calibration-p$ranks-n$seq.txt"
    "${mpi[@]}" -np "$ranks" "$a2d" bench --seq "$seq" --heads 8 --head-dim 64 --causal --backward \
      --warmup 1 --iters "$iters" --json --calibrate --calibration "$out/calibration-p$ranks-n$seq.txt" \
      > "$out/bench-p$ranks-n$seq.json"
  done
done
calibrations=() benches=()
for ranks in 4 9 16; do
  for seq in 4096 16384; do
    calibrations+=(--kv "$out/calibration-p$ranks-n$seq.txt" --set "P=$ranks" --set "N=$seq")
    benches+=(--rows "$out/bench-p$ranks-n$seq.json" --set "P=$ranks" --set "N=$seq")
  done
done
scripts/report.py "${calibrations[@]}" P=P N=N \
  'kernel fwd GFLOP/s/rank=kernel_forward_gflops:.1f' \
  'kernel bwd GFLOP/s/rank=kernel_backward_gflops:.1f' 'fwd µs/panel=kernel_forward_panel_us:.1f' \
  "waiting rank's CPU share=wait_share:.2f" 'latency µs=latency_us:.1f' \
  'all-gather GB/s=bandwidth_gbs:.2f' 'sync ms/collective=sync_us / 1e3:.2f' \
  'sync ms/ring step=step_sync_us / 1e3:.2f' 'sort GB/s=permute_gbs:.2f' 'sum GB/s=sum_gbs:.2f' \
  'merge GB/s=merge_gbs:.2f'
echo
scripts/report.py "${benches[@]}" \
  --let 'ratios=[x for r in rows if "skipped" not in r for x in (r["ratio_fwd"], r["ratio_bwd"])]' \
  P=P N=N algorithm=algo \
  'grid / layout="" if "skipped" in row else grid if algo.startswith("attention2d") else layout' \
  'fwd ms="skipped: " + skipped.split(";")[0] if "skipped" in row else fwd_ms:.1f' \
  'pred=pred_fwd_ms:.1f' 'm/p=ratio_fwd:.2f' 'bwd ms=bwd_ms:.1f' 'pred=pred_bwd_ms:.1f' \
  'm/p=ratio_bwd:.2f' 'MB sent fwd+bwd /rank=(bytes_sent_fwd + bytes_sent_bwd) / 1e6:.2f' \
  'msgs=messages_fwd + messages_bwd:d' 'peak MiB=peak_mem_bytes / 1048576:.1f' \
  --summary '"\nmeasured / predicted: %d of %d within ±35 %% (min %.2f, max %.2f)" % (
    sum(1 for x in ratios if 0.65 <= x <= 1.35), len(ratios), min(ratios), max(ratios))'
