#!/usr/bin/env bash
# The CUDA backend's check on one NVIDIA GPU (prepared for an H200; issue 21, docs/gpu.md), in one
# run of under 8 minutes including the build. Writes every log under $OUT (default
# ./gpu-check-out):
#   versions.txt     driver, CUDA, cuDNN, NCCL, MPI, torch, GPU
#   build.log        the build (sm_90 only, Ninja when available)
#   kernel-check.jsonl / .log
#                    a2d kernel --device cuda --check, forward and backward, bf16 and fp16, on the
#                    CPU kernel tests' awkward shapes (odd N, GQA 12:4, MQA, D 80/96, causal window,
#                    shuffled positions), against the fp64 reference with the tensor-core bounds
#                    of include/attention2d/tools/check.hpp
#   algorithms.log   every algorithm at P = 1 on the GPU, a2d run --device cuda --check
#   speed-a2d.jsonl, speed-torch.jsonl, speed.txt
#                    a2d's kernel beside torch SDPA (flash, cuDNN; bf16), B = 1, H = 16/32,
#                    D = 128, N = 8192/16384/32768, causal and not, forward and backward,
#                    TFLOP/s on unmasked FLOPs
#   summary.txt      pass/fail of each part
#
#   scripts/gpu_check.sh            on the GPU machine
#   scripts/gpu_check.sh --dry-run  anywhere: prints every command, runs only what needs no GPU
#                                   (version probes, the torch script's shape list, the summary)
# Exit status: 0 when every check passed (the speed targets are reported, not enforced), else 1.
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh "$@"

# ---- 1. kernel checks ----
# The awkward shapes of the CPU kernel tests. Bounds: check.hpp's kTensorCore* (O 2u, dV u,
# dQ/dK u + the delta-gradient bound, LSE 1e-5; u = 2^-8 bf16, 2^-11 fp16).
cases=(
  "--seq 333 --kv-seq 501 --heads 12 --kv-heads 4 --head-dim 80 --causal"
  "--seq 999 --heads 12 --kv-heads 4 --head-dim 96 --window 100"
  "--seq 257 --heads 8 --kv-heads 1 --head-dim 128 --causal --batch 2"
  "--seq 1000 --heads 4 --head-dim 64"
  "--seq 777 --heads 12 --kv-heads 4 --head-dim 80 --causal --shuffle 7"
  "--seq 500 --kv-seq 300 --heads 6 --kv-heads 2 --head-dim 96 --window 64 --shuffle 11"
  "--seq 1 --kv-seq 65 --heads 2 --head-dim 128"
  "--seq 2048 --heads 8 --kv-heads 2 --head-dim 128 --causal"
)
kernel_fail=0
for dtype in bf16 fp16; do
  for c in "${cases[@]}"; do
    # shellcheck disable=SC2086 # the case is a list of options
    if ! run kernel-check.log timeout 120 "$a2d" kernel --device cuda --dtype "$dtype" $c \
         --backward --check --warmup 0 --repeats 1 --threads 16 --json; then
      kernel_fail=$((kernel_fail + 1))
      echo "FAILED: --dtype $dtype $c" >>"$OUT/kernel-check.log"
    fi
  done
done
grep '^{' "$OUT/kernel-check.log" >"$OUT/kernel-check.jsonl" 2>/dev/null || true
note "kernel checks: $kernel_fail of $(( ${#cases[@]} * 2 )) failed ($(elapsed))"
failures=$((failures + kernel_fail))

# ---- 2. every algorithm at P = 1 ----
if [[ $mpi == ON ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  algo_fail=0
  for algo in attention2d attention2d-overlap ring allgather-kv ulysses; do
    for dtype in bf16 fp16; do
      if ! run algorithms.log timeout 120 mpirun -np 1 "$a2d" run --device cuda --algo "$algo" \
           --dtype "$dtype" --seq 999 --heads 12 --kv-heads 4 --head-dim 80 --causal --backward \
           --check --warmup 0 --iters 1 --threads 16; then
        algo_fail=$((algo_fail + 1))
        echo "FAILED: $algo $dtype" >>"$OUT/algorithms.log"
      fi
    done
  done
  note "algorithms at P = 1: $algo_fail of 10 failed ($(elapsed))"
  failures=$((failures + algo_fail))
else
  note "algorithms at P = 1: NOT RUN (no MPI compiler wrapper: a2d run is not built)"
  failures=$((failures + 1))
fi

# ---- 3. speed beside torch SDPA ----
: >"$OUT/speed-a2d.log"
for heads in 16 32; do
  for seq in 8192 16384 32768; do
    for causal in "" "--causal"; do
      # shellcheck disable=SC2086 # $causal is empty or one option
      run speed-a2d.log timeout 120 "$a2d" kernel --device cuda --dtype bf16 --batch 1 \
        --heads $heads --head-dim 128 --seq $seq $causal --backward --warmup 2 --repeats 5 \
        --threads 16 --json || echo "FAILED: H $heads N $seq $causal" >>"$OUT/speed-a2d.log"
    done
  done
done
grep '^{' "$OUT/speed-a2d.log" >"$OUT/speed-a2d.jsonl" 2>/dev/null || true
torch_args=(--seqs "8192,16384,32768" --heads "16,32" --head-dim 128 --warmup 2 --repeats 5)
if ((dry)); then
  python3 scripts/gpu_torch_sdpa.py "${torch_args[@]}" --dry-run >"$OUT/speed-torch.jsonl"
else
  timeout 240 python3 scripts/gpu_torch_sdpa.py "${torch_args[@]}" >"$OUT/speed-torch.jsonl" \
    2>"$OUT/speed-torch.log" || note "torch SDPA timing: failed or cut short (speed-torch.log)"
fi
python3 scripts/gpu_summary.py "$OUT/speed-a2d.jsonl" "$OUT/speed-torch.jsonl" >"$OUT/speed.txt"
cat "$OUT/speed.txt"
note "speed: speed.txt ($(elapsed))"

note "gpu_check: $failures failed checks in $(elapsed)"
((failures == 0))
