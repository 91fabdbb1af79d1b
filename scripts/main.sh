#!/usr/bin/env bash
# The main job, from a fresh clone: installs dependencies, builds, and runs a checked attention run
# with its report (time, GFLOP/s, and the error of every output against the fp64 reference).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

scripts/setup.sh
scripts/build.sh build
threads=$(nproc 2>/dev/null || echo 2)
set -x
build/a2d kernel --seq 2048 --heads 12 --kv-heads 4 --head-dim 80 --causal --backward \
  --threads "$threads" --check
