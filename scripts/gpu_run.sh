#!/usr/bin/env bash
# The one script a session with a GPU calls (issue 37; docs/gpu.md, "How the H200 run goes"):
# the versions, the build, then the checks and timings of scripts/gpu/gpu_check.sh and
# scripts/gpu/gpu_comm_check.sh, each section with its own time limit, the whole within 8 minutes
# (A2D_GPU_BUDGET seconds, default 480) so that the device tool's 10-minute command keeps room.
#
#   section       limit   what
#   versions      -       driver, nvcc, cuDNN, NCCL, MPI (system or carried), torch
#   build         240 s   a2d for sm_90 (CUDA, NCCL; MPI where mpicxx is there)
#   kernels        90 s   a2d kernel --check, awkward shapes, bf16 (CUDA_LAUNCH_BLOCKING=1) + fp16
#   parts          60 s   a2d kernel --parts: partial/accumulate, merge/finalize, misaligned records
#   python        120 s   torch CUDA tensors through the package: SDPA fp32 math, tiny Llama, P = 2
#   sanitizer      60 s   compute-sanitizer memcheck + racecheck, one tiny case
#   algorithms     75 s   every algorithm at P = 1, --comm mpi (needs MPI)
#   staged         90 s   every algorithm at P = 4 and 8 on the GPU, --comm mpi (needs MPI)
#   nccl           60 s   every algorithm over --comm nccl at P = 1 (2 where NCCL >= 2.30)
#   speed         100 s   a2d kernel beside torch SDPA (flash, cuDNN), bf16
#   bench          60 s   a2d bench at P = 4 on the GPU (needs MPI)
# Each run inside a section is limited to 30 s and a section stops at its first timeout; no
# section starts a run past the budget. MPI: the system's, else the Open MPI that
# scripts/gpu_fetch_mpi.sh put in .gpu-deps/debs here (carry [".gpu-deps/debs"]); without one
# the MPI sections are NOT RUN, which is reported and is no failure.
#
# Logs: everything under $OUT/logs while running; at the end $OUT holds summary.txt,
# versions.txt, speed.txt and gpu-run-logs.tar.gz (all the logs), so that what comes back from
# the device tool (at most 8 files) is complete.
#   scripts/gpu_run.sh            on the GPU machine (OUT defaults to ./gpu-run-out)
#   scripts/gpu_run.sh --dry-run  anywhere: prints every command, runs what needs no GPU
# Exit status: 0 when every check that ran passed, else 1.
cd "$(dirname "$0")/.." || exit 1
final_out=${OUT:-$PWD/gpu-run-out}
mkdir -p "$final_out/logs"
export OUT=$final_out/logs
A2D_GPU_DEADLINE=$(( $(date +%s) + ${A2D_GPU_BUDGET:-480} ))
export A2D_GPU_DEADLINE
# The logs are packed however the script ends (a failed build exits from gpu_common.sh).
pack() {
  for file in summary.txt versions.txt speed.txt; do
    [[ -e $OUT/$file ]] && cp "$OUT/$file" "$final_out/$file"
  done
  tar czf "$final_out/gpu-run-logs.tar.gz" -C "$OUT" . && rm -rf "$OUT"
}
trap pack EXIT
# shellcheck source=scripts/gpu/gpu_common.sh
source scripts/gpu/gpu_common.sh "$@"   # the versions and the build (exits 1 if the build fails)

export A2D_GPU_PREBUILT=1
status=0
# The correctness sections first (so that a slow speed section cannot crowd them out), then the
# communicators, then the timings.
A2D_GPU_SECTIONS="kernels parts python sanitizer algorithms" scripts/gpu/gpu_check.sh "$@" || status=1
A2D_GPU_SECTIONS="staged nccl" scripts/gpu/gpu_comm_check.sh "$@" || status=1
A2D_GPU_SECTIONS="speed" scripts/gpu/gpu_check.sh "$@" || status=1
A2D_GPU_SECTIONS="bench" scripts/gpu/gpu_comm_check.sh "$@" || status=1

echo "gpu_run: $( ((status == 0)) && echo "every check that ran passed" || echo "FAILURES") in $(elapsed)" |
  tee -a "$OUT/summary.txt"
exit $status
