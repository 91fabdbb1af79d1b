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
# The grid is named (2 x 2 on 4 ranks; A2D_GRID for another): without --grid the planner picks
# one for its default machine, which is not this one.
grid=${A2D_GRID:-}
if [ -z "$grid" ] && [ "$ranks" = 4 ]; then grid=2x2; fi
mpiexec -np "$ranks" --oversubscribe build/a2d run --algo attention2d ${grid:+--grid "$grid"} \
  --seq 4096 --heads 8 --kv-heads 2 --head-dim 64 --causal --backward --check
