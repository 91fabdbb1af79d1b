# shellcheck shell=bash
# Shared by scripts/gpu_check.sh and scripts/gpu_comm_check.sh (sourced, from the repository
# root): the options (--dry-run), $OUT, the log helpers, the versions (versions.txt) and the build
# of a2d for sm_90 with CUDA, NCCL and, where mpicxx is there, MPI (build.log). Sets dry, OUT,
# build, a2d, mpi, failures, start and the functions note, run, elapsed.
set -uo pipefail
dry=0
[[ ${1:-} == --dry-run ]] && dry=1
OUT=${OUT:-$PWD/${gpu_out_name:-gpu-check-out}}
mkdir -p "$OUT"
build=${A2D_GPU_BUILD:-build-gpu}
a2d=$build/a2d
start=$(date +%s)
# shellcheck disable=SC2034 # counted by the sourcing script
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

