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

python3 - "$rows" "$variants" <<'EOF'
import json
import sys

variants = sys.argv[2].split()
best = {}
for line in open(sys.argv[1]):
    row = json.loads(line)
    key = (row["path"], row["causal"], row["mode"], row["variant"])
    if key not in best or row["gflops"] > best[key]["gflops"]:
        best[key] = row

names = {"old": "fp32 (OLD_A2D)", "fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}
print("| path | mask | pass | " + " | ".join(f"{names[v]} GFLOP/s" for v in variants) +
      " | bf16 / fp32 | fp16 / fp32 |")
print("|---" * (5 + len(variants)) + "|")
for path in ("avx2", "portable"):
    for causal in (False, True):
        for mode in ("forward", "backward"):
            cells = [best.get((path, causal, mode, v)) for v in variants]
            if any(c is None for c in cells):
                continue
            rate = {v: c["gflops"] for v, c in zip(variants, cells)}
            print(f"| {path} | {'causal' if causal else 'none'} | {mode} | " +
                  " | ".join(f"{rate[v]:.1f}" for v in variants) +
                  f" | {rate['bf16'] / rate['fp32']:.2f} | {rate['fp16'] / rate['fp32']:.2f} |")
EOF
