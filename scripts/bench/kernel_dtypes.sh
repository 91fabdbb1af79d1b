#!/usr/bin/env bash
# The element-type table of docs/performance.md: forward and backward GFLOP/s of the fp32, bf16
# and fp16 kernels side by side, on both paths, without mask and causal; B = 1, H = 8, N = 4096,
# D = 128, 1 thread.
#   scripts/bench/kernel_dtypes.sh [BUILD_DIR] [INVOCATIONS] [OLD_A2D]
# BUILD_DIR defaults to build/. Each configuration runs INVOCATIONS (default 3) times, the dtypes
# alternating within each round so that they share the machine's state, as
# `a2d kernel ... --backward --json` (AVX2: --warmup 1 --repeats 3; portable, ~10x slower:
# --warmup 0 --repeats 2), pinned to CPU 1; the table shows the best invocation of each (on a
# machine shared with other work, the best filters out runs that were slowed by it) and its
# ratio to fp32. OLD_A2D, an a2d binary of an earlier build (e.g. before a kernel change), adds
# an fp32 column from it. Every invocation is printed to stderr as JSON.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
invocations=${2:-3}
old=${3:-}

rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
variants="fp32 bf16 fp16"
[ -n "$old" ] && variants="old $variants"
for ((i = 0; i < invocations; ++i)); do
  for path in avx2 portable; do
    repeats=$([ "$path" = avx2 ] && echo "--warmup 1 --repeats 3" || echo "--warmup 0 --repeats 2")
    for mask in "" --causal; do
      for variant in $variants; do
        if [ "$variant" = old ]; then
          command=("$old" kernel)
        else
          command=("$build/a2d" kernel --dtype "$variant")
        fi
        taskset -c 1 "${command[@]}" --path "$path" --seq 4096 --heads 8 --head-dim 128 $mask \
          --backward $repeats --json | sed "s/^{/{\"variant\": \"$variant\", /" |
          tee -a "$rows" >&2
      done
    done
  done
done

declare -A names=([old]="fp32 (OLD_A2D)" [fp32]=fp32 [bf16]=bf16 [fp16]=fp16)
columns=() complete=()
for v in $variants; do
  columns+=("${names[$v]} GFLOP/s=rate(\"$v\"):.1f")
  complete+=("rate(\"$v\")")
done
# One line per (path, mask, pass), from its fp32 row; the best of the invocations per variant.
scripts/report.py --rows "$rows" --best 'path, causal, mode, variant' --by gflops \
  --let 'rate=lambda v: (find(path=path, causal=causal, mode=mode, variant=v) or {}).get("gflops")' \
  --where 'variant == "fp32" and path in ("avx2", "portable")' \
  --where "all(x is not None for x in ($(IFS=,; echo "${complete[*]}"),))" \
  --sort '(("avx2", "portable").index(path), causal, mode != "forward")' \
  path=path 'mask="causal" if causal else "none"' pass=mode "${columns[@]}" \
  'bf16 / fp32=rate("bf16") / gflops:.2f' 'fp16 / fp32=rate("fp16") / gflops:.2f'
