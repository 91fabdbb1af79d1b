#!/usr/bin/env bash
# The CUDA backend's check on one NVIDIA GPU (prepared for an H200; issues 21 and 37,
# docs/gpu.md), in under 8 minutes including the build. Writes every log under $OUT (default
# ./gpu-check-out):
#   versions.txt, mpi.txt, build.log   as scripts/gpu/gpu_common.sh
#   kernel-check.jsonl / .log   section "kernels": a2d kernel --device cuda --check, forward and
#                    backward, bf16 and fp16, on the CPU kernel tests' awkward shapes (odd N,
#                    GQA 12:4, MQA, D 80/96, causal window, shuffled positions), against the fp64
#                    reference with the tensor-core bounds of include/attention2d/tools/check.hpp; the
#                    first (bf16) pass under CUDA_LAUNCH_BLOCKING=1, so that a fault names its
#                    kernel
#   parts.jsonl / .log   section "parts": a2d kernel --parts K (the keys in K parts: forward
#                    partial + accumulate, merge of records + finalize, backward with accumulate
#                    and misaligned record inputs) against the same reference; no MPI needed
#   algorithms.log   section "algorithms": every algorithm at P = 1 on the GPU over --comm mpi
#                    (the staged communicator), --check; NOT RUN where there is no MPI
#   python.log       section "python": torch CUDA tensors through the Python package
#                    (scripts/gpu/gpu_python_check.py): P = 1 against SDPA's fp32 math, a tiny
#                    transformers Llama step, P = 2 on the one GPU (NCCL or staged)
#   sanitizer.log    section "sanitizer": compute-sanitizer --tool memcheck and --tool racecheck
#                    on one tiny case, forward and backward, and on one --parts case
#   speed-a2d.jsonl, speed-torch.jsonl, speed.txt
#                    section "speed": a2d's kernel beside torch SDPA (flash, cuDNN; bf16), B = 1,
#                    H = 16, D = 64 and 128, N = 4096 and 16384, causal and not, forward and
#                    backward, TFLOP/s on unmasked FLOPs
#   summary.txt      pass/fail of each part
#
#   scripts/gpu/gpu_check.sh            on the GPU machine
#   scripts/gpu/gpu_check.sh --dry-run  anywhere: prints every command, runs only what needs no GPU
#                                   (version probes, the torch script's shape list, the summary)
# Every run is under `timeout` (30 s; scripts/gpu/gpu_common.sh), a section stops at its first
# timeout. A2D_GPU_SECTIONS="kernels parts ..." runs only those sections (scripts/gpu_run.sh).
# Exit status: 0 when every check that ran passed (the speed targets are reported, not enforced;
# checks NOT RUN for want of MPI or time are listed, not failures), else 1.
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=scripts/gpu/gpu_common.sh
source scripts/gpu/gpu_common.sh "$@"

# ---- kernels ----
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
if wanted kernels; then
  section kernels 90
  kernel_fail=0 kernel_runs=0
  for dtype in bf16 fp16; do
    # The first pass synchronises after every launch: a fault is reported at its kernel.
    blocking=()
    [[ $dtype == bf16 ]] && blocking=(env CUDA_LAUNCH_BLOCKING=1)
    for c in "${cases[@]}"; do
      kernel_runs=$((kernel_runs + 1))
      # shellcheck disable=SC2086 # the case is a list of options
      step kernel-check.log "${blocking[@]}" "$a2d" kernel --device cuda --dtype "$dtype" $c \
        --backward --check --warmup 0 --repeats 1 --threads 16 --json
      code=$?
      if ((code != 0 && code != 125)); then
        kernel_fail=$((kernel_fail + 1))
        echo "FAILED ($code): --dtype $dtype $c" >>"$OUT/kernel-check.log"
      fi
    done
  done
  grep '^{' "$OUT/kernel-check.log" >"$OUT/kernel-check.jsonl" 2>/dev/null || true
  note "kernel checks: $kernel_fail of $kernel_runs failed ($(elapsed))"
  failures=$((failures + kernel_fail))
fi

# ---- parts: partial + accumulate, merge + finalize, backward accumulate, misaligned records ----
parts_cases=(
  "--parts 3 --seq 333 --kv-seq 501 --heads 12 --kv-heads 4 --head-dim 80 --causal"
  "--parts 4 --seq 777 --heads 12 --kv-heads 4 --head-dim 96 --causal --shuffle 7"
  "--parts 2 --seq 257 --heads 8 --kv-heads 1 --head-dim 128 --window 64 --batch 2"
  "--parts 5 --seq 130 --kv-seq 70 --heads 4 --kv-heads 2 --head-dim 64"
)
if wanted parts; then
  section parts 60
  parts_fail=0 parts_runs=0
  for dtype in bf16 fp16; do
    for c in "${parts_cases[@]}"; do
      parts_runs=$((parts_runs + 1))
      # shellcheck disable=SC2086
      step parts.log "$a2d" kernel --device cuda --dtype "$dtype" $c --backward --check \
        --warmup 0 --repeats 1 --threads 16 --json
      code=$?
      if ((code != 0 && code != 125)); then
        parts_fail=$((parts_fail + 1))
        echo "FAILED ($code): --dtype $dtype $c" >>"$OUT/parts.log"
      fi
    done
  done
  grep '^{' "$OUT/parts.log" >"$OUT/parts.jsonl" 2>/dev/null || true
  note "partial/merge checks (a2d kernel --parts): $parts_fail of $parts_runs failed ($(elapsed))"
  failures=$((failures + parts_fail))
fi

# ---- python: torch CUDA tensors through the package (scripts/gpu/gpu_python_check.py) ----
# The package's modules were configured with the build (gpu_common.sh: A2D_WITH_PYTHON=ON, the
# image's python3 and torch); built here under this section's limit, then three checks: P = 1
# against SDPA's fp32 math (forward, backward, a side stream, refusals), a tiny transformers Llama
# step, and P = 2 on the one GPU (NCCL where it runs two ranks on one GPU, else refused and
# staged). The dry run lists the checks (the script itself, no GPU needed).
if wanted python; then
  section python 120
  ((dry)) && python3 scripts/gpu/gpu_python_check.py --list >>"$OUT/python.log" 2>&1
  python_fail=0 python_runs=0
  run_timeout=60 step python.log cmake --build "$build" -j "$(nproc)" --target a2d_python
  code=$?
  if ((code != 0 && code != 125)); then
    note "python: the package's build FAILED ($code; python.log)"
    python_fail=1 python_runs=1
  else
    pyenv=(env PYTHONPATH="$PWD/$build/python")
    for part in sdpa llama; do
      python_runs=$((python_runs + 1))
      step python.log "${pyenv[@]}" python3 scripts/gpu/gpu_python_check.py "$part"
      code=$?
      ((code != 0 && code != 125)) && { python_fail=$((python_fail + 1));
        echo "FAILED ($code): $part" >>"$OUT/python.log"; }
    done
    python_runs=$((python_runs + 1))
    step python.log "${pyenv[@]}" python3 scripts/launch/launch.py --nproc 2 --timeout 28 -- \
      python3 scripts/gpu/gpu_python_check.py ranks
    code=$?
    ((code != 0 && code != 125)) && { python_fail=$((python_fail + 1));
      echo "FAILED ($code): ranks" >>"$OUT/python.log"; }
  fi
  note "python (CUDA tensors: SDPA, tiny Llama, P = 2): $python_fail of $python_runs failed ($(elapsed))"
  failures=$((failures + python_fail))
fi

# ---- sanitizer: memcheck and racecheck on one tiny case ----
if wanted sanitizer; then
  section sanitizer 60
  sanitizer=$(command -v compute-sanitizer || first_file /usr/local/cuda/bin/compute-sanitizer)
  ((dry)) && [[ -z $sanitizer ]] && sanitizer=compute-sanitizer  # print the commands anyway
  if [[ -z $sanitizer ]]; then
    note "sanitizer: NOT RUN (no compute-sanitizer)"
    not_run=$((not_run + 3))
  else
    tiny=(--device cuda --dtype bf16 --seq 70 --heads 2 --kv-heads 1 --head-dim 80 --causal
          --backward --check --warmup 0 --repeats 1)
    sanitizer_fail=0
    for tool in memcheck racecheck; do
      step sanitizer.log "$sanitizer" --tool "$tool" --error-exitcode 3 "$a2d" kernel "${tiny[@]}"
      code=$?
      ((code != 0 && code != 125)) && { sanitizer_fail=$((sanitizer_fail + 1));
        echo "FAILED ($code): $tool" >>"$OUT/sanitizer.log"; }
    done
    # The partial, merge and record-copy kernels too (memcheck).
    step sanitizer.log "$sanitizer" --tool memcheck --error-exitcode 3 "$a2d" kernel "${tiny[@]}" \
      --parts 2
    code=$?
    ((code != 0 && code != 125)) && { sanitizer_fail=$((sanitizer_fail + 1));
      echo "FAILED ($code): memcheck --parts 2" >>"$OUT/sanitizer.log"; }
    note "sanitizer (memcheck, racecheck, memcheck --parts): $sanitizer_fail of 3 failed ($(elapsed))"
    failures=$((failures + sanitizer_fail))
  fi
fi

# ---- algorithms: every algorithm at P = 1 over the staged MPI communicator ----
if wanted algorithms; then
  if [[ $mpi == ON ]]; then
    section algorithms 75
    algo_fail=0
    for algo in attention2d attention2d-overlap ring allgather-kv ulysses; do
      for dtype in bf16 fp16; do
        step algorithms.log mpirun -np 1 "$a2d" run --device cuda --comm mpi --algo "$algo" \
          --dtype "$dtype" --seq 999 --heads 12 --kv-heads 4 --head-dim 80 --causal --backward \
          --check --warmup 0 --iters 1 --threads 16
        code=$?
        if ((code != 0 && code != 125)); then
          algo_fail=$((algo_fail + 1))
          echo "FAILED ($code): $algo $dtype" >>"$OUT/algorithms.log"
        fi
      done
    done
    note "algorithms at P = 1 (--comm mpi): $algo_fail of 10 failed ($(elapsed))"
    failures=$((failures + algo_fail))
  else
    note "algorithms at P = 1: NOT RUN (no MPI: a2d run is not built)"
    not_run=$((not_run + 10))
  fi
fi

# ---- speed beside torch SDPA ----
if wanted speed; then
  section speed 100
  : >>"$OUT/speed-a2d.log"
  for dim in 128 64; do
    for seq in 4096 16384; do
      for causal in "" "--causal"; do
        # shellcheck disable=SC2086 # $causal is empty or one option
        step speed-a2d.log "$a2d" kernel --device cuda --dtype bf16 --batch 1 --heads 16 \
          --head-dim $dim --seq $seq $causal --backward --warmup 2 --repeats 5 --threads 16 --json
        code=$?
        ((code != 0 && code != 125)) &&
          echo "FAILED ($code): D $dim N $seq $causal" >>"$OUT/speed-a2d.log"
      done
    done
  done
  grep '^{' "$OUT/speed-a2d.log" >"$OUT/speed-a2d.jsonl" 2>/dev/null || true
  torch_args=(--seqs "4096,16384" --heads 16 --head-dims "128,64" --warmup 2 --repeats 5)
  if ((dry)); then
    python3 scripts/gpu/gpu_torch_sdpa.py "${torch_args[@]}" --dry-run >"$OUT/speed-torch.jsonl"
  else
    left=$(( section_end - $(date +%s) ))
    if ((left >= 20)); then
      timeout -k 5 "$left" python3 scripts/gpu/gpu_torch_sdpa.py "${torch_args[@]}" \
        >"$OUT/speed-torch.jsonl" 2>"$OUT/speed-torch.log" ||
        note "torch SDPA timing: failed or cut short (speed-torch.log)"
    else
      note "torch SDPA timing: NOT RUN (section out of time)"
      : >"$OUT/speed-torch.jsonl"
    fi
  fi
  python3 scripts/gpu/gpu_summary.py "$OUT/speed-a2d.jsonl" "$OUT/speed-torch.jsonl" >"$OUT/speed.txt"
  cat "$OUT/speed.txt"
  note "speed: speed.txt ($(elapsed))"
fi

note "gpu_check: $failures failed checks, $not_run not run, in $(elapsed)"
((failures == 0))
