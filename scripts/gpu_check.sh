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
#                    of include/attention2d/check.hpp
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
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
dry=0
[[ ${1:-} == --dry-run ]] && dry=1
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
build=${A2D_GPU_BUILD:-build-gpu}
a2d=$build/a2d
start=$(date +%s)
failures=0
: >"$OUT/summary.txt"

note() { echo "$*" | tee -a "$OUT/summary.txt"; }
first_file() { for f in "$@"; do [[ -e $f ]] && { echo "$f"; return; }; done; }
elapsed() { echo "$(( $(date +%s) - start )) s"; }
# Runs a command (or, dry, prints it), appending its output to a log.
run() {
  local log=$1
  shift
  echo "+ $*" >>"$OUT/$log"
  if ((dry)); then
    echo "dry-run: $*"
    return 0
  fi
  "$@" >>"$OUT/$log" 2>&1
}

# NCCL (linked for device discovery): the toolkit's, else the nvidia-nccl wheel of the torch
# environment (its library has only the versioned name, so the path is given to CMake whole).
nccl_root=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.dirname(n.__file__) if n.__file__ else n.__path__[0])' 2>/dev/null || true)
nccl_args=()
if [[ ! -e /usr/local/cuda/include/nccl.h && -n $nccl_root && -e $nccl_root/include/nccl.h ]]; then
  nccl_lib=$(first_file "$nccl_root"/lib/libnccl.so "$nccl_root"/lib/libnccl.so.2)
  nccl_args=(-DA2D_NCCL_INCLUDE="$nccl_root/include" -DA2D_NCCL_LIBRARY="$nccl_lib")
  export LD_LIBRARY_PATH="$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# ---- versions ----
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -srm)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  else
    echo "nvidia-smi: not found"
  fi
  nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  if [[ -x $nvcc ]]; then "$nvcc" --version | tail -2; else echo "nvcc: not found"; fi
  header=$(first_file /usr/local/cuda/include/cudnn_version.h /usr/include/cudnn_version.h)
  if [[ -n $header ]]; then
    echo "cuDNN (header $header): $(awk '/#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) /{printf "%s.", $3}' "$header" | sed 's/\.$//')"
  fi
  header=$(first_file /usr/local/cuda/include/nccl.h /usr/include/nccl.h "${nccl_root:-/none}/include/nccl.h")
  if [[ -n $header ]]; then
    echo "NCCL (header $header): $(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{printf "%s.", $3}' "$header" | sed 's/\.$//')"
  fi
  if command -v mpirun >/dev/null; then mpirun --version 2>&1 | head -1; else echo "MPI: no mpirun"; fi
  python3 - <<'EOF' 2>&1 || true
try:
    import torch
    print("torch", torch.__version__, "CUDA", torch.version.cuda,
          "cuDNN", torch.backends.cudnn.version(),
          "NCCL", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-",
          "GPU", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
except Exception as error:  # no torch, or no GPU
    print("torch:", error)
EOF
} >"$OUT/versions.txt" 2>&1
cat "$OUT/versions.txt"

# ---- build ----
mpi=ON
command -v mpicxx >/dev/null || mpi=OFF
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if run build.log cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
     -DA2D_WITH_CUDA=ON -DA2D_CUDA_ARCHITECTURES=90 -DA2D_CUDA_PTXAS_VERBOSE=ON \
     -DA2D_WITH_MPI=$mpi -DA2D_BUILD_TESTS=OFF -DA2D_BUILD_BENCH=OFF -DA2D_WITH_PYTHON=OFF \
     "${nccl_args[@]}" &&
   { ((dry)) || grep -q "CUDA=ON" "$OUT/build.log" ||
     { echo "A2D_WITH_CUDA turned itself off" >>"$OUT/build.log"; false; }; } &&
   run build.log timeout 300 cmake --build "$build" -j "$(nproc)" --target a2d; then
  note "build: ok ($(elapsed)); MPI=$mpi"
  if ((!dry)); then
    scripts/check_cuda_spills.sh "$OUT/build.log" >"$OUT/spills.txt" 2>&1 ||
      note "register spills: see spills.txt"
    run build.log "$a2d" info
  fi
else
  note "build: FAILED (build.log)"
  exit 1
fi

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
