#!/usr/bin/env bash
# The communicators on one NVIDIA GPU (prepared for an H200; issue 22, docs/gpu.md,
# "Communicators"), in one run of under 8 minutes including the build (shared with
# scripts/gpu_check.sh: an existing build-gpu/ is reused). Writes every log under $OUT (default
# ./gpu-comm-check-out):
#   versions.txt, build.log   as scripts/gpu_check.sh
#   staged.log        every algorithm (the hybrid with U = 2) at P = 4 and P = 8 ranks sharing the
#                     GPU, over MPI through pinned host buffers (--comm mpi), --check against the
#                     fp64 reference: bf16, GQA 24:8, N = 999, D = 80, causal and not
#   nccl.log          every algorithm over NCCL (--comm nccl, --check) at the rank count the
#                     installed NCCL allows on one GPU: 1, and 2 where NCCL >= 2.30 with
#                     NCCL_MULTI_RANK_GPU_ENABLE=1; below 2.30 two ranks must be refused on every
#                     rank with the message naming --comm mpi
#   bench.log, bench.txt
#                     a2d bench at P = 4 on the GPU (--comm mpi; bf16, N = 16384, 16:8 heads,
#                     D = 128, causal, forward and backward). Four processes time-slice one GPU
#                     here: these are not a cluster's times, and the ratios between algorithms
#                     mostly show the staging copies and the kernels' share of the GPU.
#   summary.txt       pass/fail of each part
#
#   scripts/gpu_comm_check.sh            on the GPU machine
#   scripts/gpu_comm_check.sh --dry-run  anywhere: prints every command, runs what needs no GPU
# Exit status: 0 when every check passed, else 1.
cd "$(dirname "$0")/.." || exit 1
gpu_out_name=gpu-comm-check-out
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh "$@"
if [[ $mpi != ON ]]; then
  note "communicators: NOT RUN (no MPI compiler wrapper: a2d run is not built)"
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun_args=(--oversubscribe --bind-to none)
algos=(attention2d attention2d-overlap ring allgather-kv ulysses hybrid)
problem=(--dtype bf16 --seq 999 --heads 24 --kv-heads 8 --head-dim 80 --backward --check
         --warmup 0 --iters 1)
algo_args() {  # the hybrid's heads group size; the others take their default plans
  [[ $1 == hybrid ]] && echo "--algo hybrid --heads-parallel 2" || echo "--algo $1"
}

# ---- 1. MPI through pinned host buffers, P = 4 and 8 on one GPU ----
staged_fail=0 staged_runs=0
for ranks in 4 8; do
  for algo in "${algos[@]}"; do
    for causal in "" "--causal"; do
      staged_runs=$((staged_runs + 1))
      # shellcheck disable=SC2046,SC2086 # option lists
      if ! run staged.log timeout 120 mpirun -np $ranks "${mpirun_args[@]}" "$a2d" run \
           --device cuda --comm mpi $(algo_args "$algo") "${problem[@]}" $causal; then
        staged_fail=$((staged_fail + 1))
        echo "FAILED: P $ranks $algo $causal" >>"$OUT/staged.log"
      fi
    done
  done
done
note "staged MPI, P = 4 and 8 on one GPU: $staged_fail of $staged_runs failed ($(elapsed))"
failures=$((failures + staged_fail))

# ---- 2. NCCL at the rank counts the installed NCCL allows on one GPU ----
# The runtime's version, as `a2d info` (the end of build.log) reports it.
nccl_version=$(grep -oE '^NCCL [0-9]+\.[0-9]+\.[0-9]+' "$OUT/build.log" | tail -1 | cut -d' ' -f2)
nccl_fail=0 nccl_runs=0
for algo in "${algos[@]}"; do
  [[ $algo == hybrid ]] && continue  # U = 2 needs two ranks; run below where NCCL allows them
  for causal in "" "--causal"; do
    nccl_runs=$((nccl_runs + 1))
    # shellcheck disable=SC2046,SC2086
    if ! run nccl.log timeout 120 mpirun -np 1 "${mpirun_args[@]}" "$a2d" run --device cuda \
         --comm nccl $(algo_args "$algo") "${problem[@]}" $causal; then
      nccl_fail=$((nccl_fail + 1))
      echo "FAILED: NCCL P 1 $algo $causal" >>"$OUT/nccl.log"
    fi
  done
done
two_ranks="refused"
if [[ -n $nccl_version ]] && printf '%s\n2.30.0\n' "$nccl_version" | sort -V -C -r 2>/dev/null; then
  two_ranks="run"
fi
if [[ $two_ranks == run ]]; then
  for algo in "${algos[@]}"; do
    nccl_runs=$((nccl_runs + 1))
    # shellcheck disable=SC2046
    if ! run nccl.log timeout 120 env NCCL_MULTI_RANK_GPU_ENABLE=1 mpirun -np 2 \
         "${mpirun_args[@]}" -x NCCL_MULTI_RANK_GPU_ENABLE "$a2d" run --device cuda --comm nccl \
         $(algo_args "$algo") "${problem[@]}" --causal; then
      nccl_fail=$((nccl_fail + 1))
      echo "FAILED: NCCL P 2 $algo" >>"$OUT/nccl.log"
    fi
  done
else
  # Below 2.30 (or without the flag) two ranks on one GPU are refused on every rank, exit 2,
  # naming --comm mpi, before any NCCL call.
  nccl_runs=$((nccl_runs + 1))
  run nccl.log timeout 120 mpirun -np 2 "${mpirun_args[@]}" "$a2d" run --device cuda \
    --comm nccl "${problem[@]}"
  code=$?
  if ((!dry)) && { ((code != 2)) || ! tail -20 "$OUT/nccl.log" | grep -q "use --comm mpi"; }; then
    nccl_fail=$((nccl_fail + 1))
    echo "FAILED: two ranks on one GPU under NCCL $nccl_version: exit $code" >>"$OUT/nccl.log"
  fi
fi
note "NCCL ${nccl_version:-?} on one GPU (P = 1; P = 2 $two_ranks): $nccl_fail of $nccl_runs" \
  "failed ($(elapsed))"
failures=$((failures + nccl_fail))

# ---- 3. a2d bench at P = 4 on the GPU ----
if run bench.log timeout 240 mpirun -np 4 "${mpirun_args[@]}" "$a2d" bench --device cuda \
     --comm mpi --dtype bf16 --seq 16384 --heads 16 --kv-heads 8 --head-dim 128 --causal \
     --backward --warmup 1 --iters 3; then
  ((dry)) || sed -n '/^a2d bench:/,$p' "$OUT/bench.log" >"$OUT/bench.txt"
  note "bench at P = 4 (4 processes sharing one GPU: not a cluster's times): bench.txt" \
    "($(elapsed))"
else
  note "bench at P = 4: FAILED (bench.log)"
  failures=$((failures + 1))
fi

note "gpu_comm_check: $failures failed checks in $(elapsed)"
((failures == 0))
