#!/usr/bin/env bash
# The communicators on one NVIDIA GPU (prepared for an H200; issue 22, docs/gpu.md,
# "Communicators"), in one run of under 8 minutes including the build (shared with
# scripts/gpu/gpu_check.sh: an existing build-gpu/ is reused). Writes every log under $OUT (default
# ./gpu-comm-check-out):
#   versions.txt, build.log   as scripts/gpu/gpu_check.sh
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
# Every run is under `timeout` (30 s; scripts/gpu/gpu_common.sh), a section (staged, nccl, bench)
# stops at its first timeout; A2D_GPU_SECTIONS chooses sections. Without an MPI (none on the
# system and none carried in .gpu-deps/debs, scripts/gpu/gpu_mpi.sh) every check is NOT RUN, which
# is reported and is no failure.
#
#   scripts/gpu/gpu_comm_check.sh            on the GPU machine
#   scripts/gpu/gpu_comm_check.sh --dry-run  anywhere: prints every command, runs what needs no GPU
# Exit status: 0 when every check that ran passed, else 1.
cd "$(dirname "$0")/../.." || exit 1
gpu_out_name=gpu-comm-check-out
# shellcheck source=scripts/gpu/gpu_common.sh
source scripts/gpu/gpu_common.sh "$@"
if [[ $mpi != ON ]]; then
  note "communicators: NOT RUN (no MPI: a2d run is not built)"
  exit 0
fi
mpirun_args=(--oversubscribe --bind-to none)
algos=(attention2d attention2d-overlap ring allgather-kv ulysses hybrid)
problem=(--dtype bf16 --seq 999 --heads 24 --kv-heads 8 --head-dim 80 --backward --check
         --warmup 0 --iters 1)
algo_args() {  # the hybrid's heads group size; the others take their default plans
  [[ $1 == hybrid ]] && echo "--algo hybrid --heads-parallel 2" || echo "--algo $1"
}

# ---- 1. MPI through pinned host buffers, P = 4 and 8 on one GPU ----
if wanted staged; then
  section staged 90
  staged_fail=0 staged_runs=0
  for ranks in 4 8; do
    for algo in "${algos[@]}"; do
      for causal in "" "--causal"; do
        staged_runs=$((staged_runs + 1))
        # shellcheck disable=SC2046,SC2086 # option lists
        step staged.log mpirun -np $ranks "${mpirun_args[@]}" "$a2d" run \
          --device cuda --comm mpi $(algo_args "$algo") "${problem[@]}" $causal
        code=$?
        if ((code != 0 && code != 125)); then
          staged_fail=$((staged_fail + 1))
          echo "FAILED ($code): P $ranks $algo $causal" >>"$OUT/staged.log"
        fi
      done
    done
  done
  note "staged MPI, P = 4 and 8 on one GPU: $staged_fail of $staged_runs failed ($(elapsed))"
  failures=$((failures + staged_fail))
fi

# ---- 2. NCCL at the rank counts the installed NCCL allows on one GPU ----
if wanted nccl; then
  section nccl 60
  # The runtime's version, as `a2d info` (the end of build.log) reports it.
  nccl_version=$(grep -oE '^NCCL [0-9]+\.[0-9]+\.[0-9]+' "$OUT/build.log" | tail -1 | cut -d' ' -f2)
  nccl_fail=0 nccl_runs=0
  for algo in "${algos[@]}"; do
    [[ $algo == hybrid ]] && continue  # U = 2 needs two ranks; run below where NCCL allows them
    for causal in "" "--causal"; do
      nccl_runs=$((nccl_runs + 1))
      # shellcheck disable=SC2046,SC2086
      step nccl.log mpirun -np 1 "${mpirun_args[@]}" "$a2d" run --device cuda \
        --comm nccl $(algo_args "$algo") "${problem[@]}" $causal
      code=$?
      if ((code != 0 && code != 125)); then
        nccl_fail=$((nccl_fail + 1))
        echo "FAILED ($code): NCCL P 1 $algo $causal" >>"$OUT/nccl.log"
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
      step nccl.log env NCCL_MULTI_RANK_GPU_ENABLE=1 mpirun -np 2 \
        "${mpirun_args[@]}" -x NCCL_MULTI_RANK_GPU_ENABLE "$a2d" run --device cuda --comm nccl \
        $(algo_args "$algo") "${problem[@]}" --causal
      code=$?
      if ((code != 0 && code != 125)); then
        nccl_fail=$((nccl_fail + 1))
        echo "FAILED ($code): NCCL P 2 $algo" >>"$OUT/nccl.log"
      fi
    done
  else
    # Below 2.30 (or without the flag) two ranks on one GPU are refused on every rank, exit 2,
    # naming --comm mpi, before any NCCL call.
    nccl_runs=$((nccl_runs + 1))
    step nccl.log mpirun -np 2 "${mpirun_args[@]}" "$a2d" run --device cuda \
      --comm nccl "${problem[@]}"
    code=$?
    if ((!dry && code != 125)) &&
       { ((code != 2)) || ! tail -20 "$OUT/nccl.log" | grep -q "use --comm mpi"; }; then
      nccl_fail=$((nccl_fail + 1))
      echo "FAILED: two ranks on one GPU under NCCL $nccl_version: exit $code" >>"$OUT/nccl.log"
    fi
  fi
  note "NCCL ${nccl_version:-?} on one GPU (P = 1; P = 2 $two_ranks): $nccl_fail of $nccl_runs" \
    "failed ($(elapsed))"
  failures=$((failures + nccl_fail))
fi

# ---- 3. a2d bench at P = 4 on the GPU ----
if wanted bench; then
  section bench 60
  run_timeout=60 step bench.log mpirun -np 4 "${mpirun_args[@]}" "$a2d" bench --device cuda \
       --comm mpi --dtype bf16 --seq 16384 --heads 16 --kv-heads 8 --head-dim 128 --causal \
       --backward --warmup 1 --iters 3
  code=$?
  if ((code == 0)); then
    ((dry)) || sed -n '/^a2d bench:/,$p' "$OUT/bench.log" >"$OUT/bench.txt"
    note "bench at P = 4 (4 processes sharing one GPU: not a cluster's times): bench.txt" \
      "($(elapsed))"
  elif ((code == 125)); then
    note "bench at P = 4: NOT RUN (out of time)"
  else
    note "bench at P = 4: FAILED ($code; bench.log)"
    failures=$((failures + 1))
  fi
fi

note "gpu_comm_check: $failures failed checks, $not_run not run, in $(elapsed)"
((failures == 0))
