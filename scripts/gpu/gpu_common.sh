# shellcheck shell=bash
# Shared by scripts/gpu_run.sh, scripts/gpu/gpu_check.sh and scripts/gpu/gpu_comm_check.sh (sourced, from
# the repository root): the options (--dry-run), $OUT, the MPI (scripts/gpu/gpu_mpi.sh: the system's,
# else the one carried in .gpu-deps/debs), the log helpers, the time limits, the versions
# (versions.txt) and the build of a2d for sm_90 with CUDA, NCCL and, where mpicxx is there, MPI
# (build.log; the Python package is configured there too, against the image's python3 and torch,
# and built by gpu_check.sh's section "python"). Sets dry, OUT, build, a2d, mpi, failures, not_run, start and the functions note,
# run, section, step, elapsed, wanted.
#
# Time limits (docs/gpu.md, "How the H200 run goes"): every run of a check is one `step` under
# `timeout` of A2D_GPU_RUN_TIMEOUT seconds (default 30); a section (`section NAME SECONDS`) has a
# limit of its own, and stops at its first timeout (its remaining steps are NOT RUN); nothing
# starts past A2D_GPU_DEADLINE (epoch seconds; gpu_run.sh sets it 8 minutes after its start).
# A2D_GPU_PREBUILT=1 (set by gpu_run.sh for the scripts it calls) skips the versions and the build
# when $a2d exists. A2D_GPU_SECTIONS (a list of section names; default all) chooses sections.
set -uo pipefail
dry=0
[[ ${1:-} == --dry-run ]] && dry=1
OUT=${OUT:-$PWD/${gpu_out_name:-gpu-check-out}}
mkdir -p "$OUT"
build=${A2D_GPU_BUILD:-build-gpu}
a2d=$build/a2d
start=$(date +%s)
run_timeout=${A2D_GPU_RUN_TIMEOUT:-30}
deadline=${A2D_GPU_DEADLINE:-$((start + 480))}
# shellcheck disable=SC2034 # counted by the sourcing script
failures=0 not_run=0
[[ ${A2D_GPU_PREBUILT:-0} == 1 ]] || : >"$OUT/summary.txt"  # gpu_run.sh's scripts share one

note() { echo "$*" | tee -a "$OUT/summary.txt"; }
first_file() { for f in "$@"; do [[ -e $f ]] && { echo "$f"; return; }; done; }
elapsed() { echo "$(( $(date +%s) - start )) s"; }
# Whether section $1 is wanted (A2D_GPU_SECTIONS unset or naming it).
wanted() { [[ -z ${A2D_GPU_SECTIONS:-} || " $A2D_GPU_SECTIONS " == *" $1 "* ]]; }
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
# section NAME SECONDS: the steps that follow belong to NAME and stop SECONDS from now (or at the
# deadline, whichever is first), or at their first timeout.
section_name="" section_end=0 section_stopped=0
section() {
  section_name=$1
  section_end=$(( $(date +%s) + $2 ))
  ((section_end > deadline)) && section_end=$deadline
  section_stopped=0
}
# step LOG COMMAND...: `run` under `timeout` (run_timeout, or less where the section or the
# deadline ends sooner). Returns the command's status; 124 for a timeout (which stops the
# section); 125 for a step not run (section stopped or out of time: counted in not_run, never a
# failure).
step() {
  local log=$1
  shift
  local remaining=$(( section_end - $(date +%s) ))
  local left=$remaining
  ((left > run_timeout)) && left=$run_timeout
  if ((section_stopped)) || ((!dry && remaining < 5)); then
    echo "NOT RUN (section $section_name stopped or out of time): $*" >>"$OUT/$log"
    not_run=$((not_run + 1))
    return 125
  fi
  run "$log" timeout -k 5 "$left" "$@"
  local code=$?
  if ((code == 124 || code == 137)); then
    section_stopped=1
    note "$section_name: stopped at its first timeout ($left s): $*"
    return 124
  fi
  return "$code"
}

# ---- MPI: the system's, else the Open MPI carried in .gpu-deps/debs (scripts/gpu_fetch_mpi.sh) ----
# shellcheck source=scripts/gpu/gpu_mpi.sh
source scripts/gpu/gpu_mpi.sh >"$OUT/mpi.txt" 2>&1
cat "$OUT/mpi.txt"
mpi=ON
command -v mpicxx >/dev/null && command -v mpirun >/dev/null || mpi=OFF

# NCCL (linked for device discovery): the toolkit's, else the nvidia-nccl wheel of the torch
# environment (its library has only the versioned name, so the path is given to CMake whole).
nccl_root=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.dirname(n.__file__) if n.__file__ else n.__path__[0])' 2>/dev/null || true)
nccl_args=()
if [[ ! -e /usr/local/cuda/include/nccl.h && -n $nccl_root && -e $nccl_root/include/nccl.h ]]; then
  nccl_lib=$(first_file "$nccl_root"/lib/libnccl.so "$nccl_root"/lib/libnccl.so.2)
  nccl_args=(-DA2D_NCCL_INCLUDE="$nccl_root/include" -DA2D_NCCL_LIBRARY="$nccl_lib")
  export LD_LIBRARY_PATH="$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

if [[ ${A2D_GPU_PREBUILT:-0} == 1 && ( -x $a2d || $dry == 1 ) ]]; then
  return 0
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
  cat "$OUT/mpi.txt"
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
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if run build.log cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
     -DA2D_WITH_CUDA=ON -DA2D_CUDA_ARCHITECTURES=90 -DA2D_CUDA_PTXAS_VERBOSE=ON \
     -DA2D_WITH_MPI=$mpi -DA2D_BUILD_TESTS=OFF -DA2D_BUILD_BENCH=OFF -DA2D_WITH_PYTHON=ON \
     -DPython_EXECUTABLE="$(command -v python3 || echo /usr/bin/python3)" \
     "${nccl_args[@]}" &&
   { ((dry)) || grep -q "CUDA=ON" "$OUT/build.log" ||
     { echo "A2D_WITH_CUDA turned itself off" >>"$OUT/build.log"; false; }; } &&
   run build.log timeout "${A2D_GPU_BUILD_TIMEOUT:-240}" cmake --build "$build" -j "$(nproc)" --target a2d; then
  note "build: ok ($(elapsed)); MPI=$mpi"
  if ((!dry)); then
    scripts/gpu/check_cuda_spills.sh "$OUT/build.log" >"$OUT/spills.txt" 2>&1 ||
      note "register spills: see spills.txt"
    run build.log timeout 30 "$a2d" info
  fi
else
  note "build: FAILED (build.log)"
  exit 1
fi

