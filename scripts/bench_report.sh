#!/usr/bin/env bash
# The measurements of docs/benchmarks.md: on this machine, calibrate the cost model at P = 4, 9 and
# 16 ranks, then run every algorithm and every ATTENTION2D grid side by side at N = 4096 and
# 16384 (B=1, H=8, D=64, causal, forward and backward), each row beside the model's prediction.
# Prints Markdown tables; raw JSON rows go to $OUT (default bench-results/).
#   scripts/bench_report.sh [A2D_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
a2d=${1:-build/a2d}
out=${OUT:-bench-results}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export A2D_CALIBRATION="$out/calibration.txt"
mpi=(mpiexec --oversubscribe --bind-to core:overload-allowed)
for ranks in 4 9 16; do
  "${mpi[@]}" -np "$ranks" "$a2d" calibrate --block 1024 --head-dim 64 --iters 9 > "$out/calibrate-$ranks.txt"
done
for ranks in 4 9 16; do
  for seq in 4096 16384; do
    "${mpi[@]}" -np "$ranks" "$a2d" bench --seq "$seq" --heads 8 --head-dim 64 --causal --backward \
      --warmup 1 --iters 3 --json > "$out/bench-p$ranks-n$seq.json"
  done
done
python3 - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
print("| P | N | algorithm | grid / layout | fwd ms | pred | m/p | bwd ms | pred | m/p | MB sent fwd+bwd /rank | msgs | peak MiB |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
ratios = []
for ranks in (4, 9, 16):
    for seq in (4096, 16384):
        path = os.path.join(out, "bench-p%d-n%d.json" % (ranks, seq))
        for line in open(path):
            r = json.loads(line)
            if "skipped" in r:
                print("| %d | %d | %s | | skipped: %s | | | | | | | | |" % (ranks, seq, r["algo"], r["skipped"].split(";")[0]))
                continue
            grid = r["grid"] if r["algo"].startswith("attention2d") else r["layout"]
            ratios += [r["ratio_fwd"], r["ratio_bwd"]]
            print("| %d | %d | %s | %s | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f | %.2f | %d | %.1f |" % (
                ranks, seq, r["algo"], grid, r["fwd_ms"], r["pred_fwd_ms"], r["ratio_fwd"],
                r["bwd_ms"], r["pred_bwd_ms"], r["ratio_bwd"],
                (r["bytes_sent_fwd"] + r["bytes_sent_bwd"]) / 1e6,
                r["messages_fwd"] + r["messages_bwd"], r["peak_mem_bytes"] / 1048576))
within = sum(1 for x in ratios if 0.65 <= x <= 1.35)
print()
print("measured / predicted: %d of %d within ±35 %% (min %.2f, max %.2f)" % (within, len(ratios), min(ratios), max(ratios)))
PY
