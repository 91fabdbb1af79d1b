#!/usr/bin/env bash
# Installs everything attention2d needs to build, test and benchmark on Debian 12 (apt-get).
# Idempotent: packages already present are not reinstalled. Run as root (or with sudo available).
# The Python package's dependencies (torch 2.11, numpy, pytest, mpi4py, pybind11, transformers)
# come from PyPI into a git-ignored virtual environment: scripts/venv.sh (test.sh and main.sh run
# it after this script).
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libopenmpi-dev openmpi-bin          # the MPI engine of the distributed algorithms
  libpmix-dev                         # the launcher's PMIx: the start of a job is watched through it
  libgloo-dev                         # the Gloo communicator (--comm gloo; jobs without mpirun)
  libgtest-dev libgmock-dev           # GoogleTest (CTest-registered tests)
  python3                             # test helpers that parse JSON output
  clang libclang-rt-14-dev            # libFuzzer and sanitizer runtimes for the fuzz targets
  gnuplot-nox                         # plots of `a2d model --plot` and scripts/cluster/cluster_report.py
  iproute2 util-linux                 # scripts/cluster/cluster.sh: ip netns, tc (tbf), unshare --uts
  slurm-wlm munge                     # scripts/slurm/slurm_cluster.sh: Slurm 22.05 on the emulated hosts
  libopenblas-dev                     # bench/a2d_tile_gemm only: BLAS vs own micro-kernels
  python3-dev python3-venv python3-pip   # the Python package (python/): its headers, and the
                                         # venv scripts/venv.sh makes (torch, pybind11, ... from PyPI)
  ccache                              # compiles reused across builds and clones (build.sh, pip_install.sh)
  libsimgrid-dev                      # SimGrid 3.32 (smpicxx, smpirun): the SMPI build of sim/ (docs/simulation.md)
)

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  run=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: run as root or install sudo" >&2; exit 1; }
    run=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${run[@]}" apt-get update -qq
  "${run[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
