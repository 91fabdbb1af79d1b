#!/usr/bin/env bash
# The main job, from a fresh clone: installs dependencies, builds, and runs ATTENTION2D forward and
# backward on 4 local MPI ranks (a 2 x 2 grid), checked against the fp64 reference, with its
# report (slowest rank's time, GFLOP/s per rank, bytes and messages each rank sent, errors).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

scripts/setup.sh
scripts/venv.sh  # torch 2.11 and the Python tools from PyPI (.venv/), before the build finds them
scripts/build.sh build
ranks=${A2D_RANKS:-4}
set -x
mpiexec -np "$ranks" --oversubscribe build/a2d run --algo attention2d --seq 4096 --heads 8 \
  --kv-heads 2 --head-dim 64 --causal --backward --check
