#!/usr/bin/env bash
# The kernel performance table of docs/performance.md: forward and backward, D = 64 and 128,
# without mask and causal, on 1 and 2 threads, fp32, B = 1, H = 8, N = 4096.
#   scripts/bench/kernel_table.sh [BUILD_DIR] [INVOCATIONS] [PATH]
# BUILD_DIR defaults to build/, PATH (auto, portable, avx2, avx512) to auto. Each configuration runs
# INVOCATIONS (default 3) times as `a2d kernel ... --warmup 1 --repeats 5 --json`, pinned with
# taskset (1 thread: CPU 1; 2 threads: CPUs 0-1, OpenMP threads bound to cores); the table shows
# the invocation with the highest GFLOP/s (each a median of 5 runs), next to the FMA peak that
# invocation measured. On a machine shared with other work, taking the best invocation filters
# out runs that were slowed by it; every invocation is printed to stderr as JSON.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
invocations=${2:-3}
path=${3:-auto}
export OMP_PROC_BIND=close OMP_PLACES=cores

rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for threads in 1 2; do
  cpus=$([ "$threads" = 1 ] && echo 1 || echo 0-1)
  for dim in 128 64; do
    for mask in "" --causal; do
      for ((i = 0; i < invocations; ++i)); do
        taskset -c "$cpus" "$build/a2d" kernel --path "$path" --seq 4096 --heads 8 \
          --head-dim "$dim" $mask --backward --threads "$threads" --warmup 1 --repeats 5 --json |
          tee -a "$rows" >&2
      done
    done
  done
done

one='(one := find(mode=mode, head_dim=head_dim, causal=causal, threads=1))'
scripts/report.py --rows "$rows" --best 'mode, head_dim, causal, threads' --by gflops \
  --sort '(mode != "forward", -head_dim, causal, threads)' \
  pass=mode D=head_dim 'mask="causal" if causal else "none"' threads=threads \
  'ms (median)=ms:.1f' 'GFLOP/s=gflops:.1f' 'FMA peak GFLOP/s=peak_gflops:.1f' \
  '% of peak=pct_peak:.1f' \
  "2 threads / 1 thread=\"%.2fx\" % (gflops / one['gflops']) if threads == 2 and $one else ''" \
  --summary '"".join("\n%s D=%d, 1 thread: causal efficiency / non-causal efficiency = %.2f"
                     % (m, d, c["pct_peak"] / f["pct_peak"])
                     for d in (128, 64) for m in ("forward", "backward")
                     for f, c in [(find(mode=m, head_dim=d, causal=False, threads=1),
                                   find(mode=m, head_dim=d, causal=True, threads=1))] if f and c)'
