#!/usr/bin/env bash
# cuBLAS GEMM throughput of GPU 0 in bf16 and fp32, square and at attention's product shapes
# (bench/cuda/gemm_peak.cu), beside the datasheet peaks the accelerator presets use
# (docs/cost-model.md, section 5). Needs a GPU and the CUDA toolkit (nvcc, cuBLAS).
#   scripts/gpu/gpu_gemm_peak.sh [REPEATS]
set -euo pipefail
cd "$(dirname "$0")/../.."
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mkdir -p build-gpu
if [[ ! -x build-gpu/a2d_gemm_peak || bench/cuda/gemm_peak.cu -nt build-gpu/a2d_gemm_peak ]]; then
  "$nvcc" -O2 -std=c++17 -arch=sm_80 -gencode arch=compute_90,code=sm_90 \
    -o build-gpu/a2d_gemm_peak bench/cuda/gemm_peak.cu -lcublas
fi
command -v nvidia-smi > /dev/null &&
  nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv
build-gpu/a2d_gemm_peak "${1:-21}"
