#!/usr/bin/env bash
# Configures and builds attention2d.
#   scripts/build.sh [BUILD_DIR] [extra cmake arguments...]
# BUILD_DIR defaults to build/. Warnings are errors (as in CI).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
shift || true
jobs=$(nproc 2>/dev/null || echo 2)
mkdir -p "$build_dir"
# Compiles go through ccache where it is installed (scripts/setup.sh; A2D_CCACHE=0 turns it off):
# its cache stays on the machine, with paths taken relative to the checkout, so a fresh clone
# (CI's) compiles only what changed since the last build of any clone here.
launcher=()
if [[ ${A2D_CCACHE:-1} != 0 ]] && command -v ccache > /dev/null; then
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DA2D_WERROR=ON "${launcher[@]}" "$@" \
  >"$build_dir/configure.log" 2>&1 ||
  { cat "$build_dir/configure.log"; exit 1; }
grep -E "^-- attention2d" "$build_dir/configure.log" || true
cmake --build "$build_dir" -j "$jobs"
