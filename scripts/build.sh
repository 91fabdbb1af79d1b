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
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DA2D_WERROR=ON "$@" >"$build_dir/configure.log" 2>&1 ||
  { cat "$build_dir/configure.log"; exit 1; }
grep -E "^-- attention2d" "$build_dir/configure.log" || true
cmake --build "$build_dir" -j "$jobs"
