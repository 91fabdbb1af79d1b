#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs dependencies, builds (warnings are errors),
# runs every CTest test, then rebuilds with AddressSanitizer + UndefinedBehaviorSanitizer and runs
# the fast tests again under them, then runs the fuzz targets for a bounded time.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
start=$(date +%s)
phase() { echo "test.sh: $1 done at $(( $(date +%s) - start )) s"; }

scripts/setup.sh
scripts/build.sh build
phase "setup and build"
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 600)
phase "tests"

# Sanitizers: unit and command tests, and the MPI tests up to 4 ranks (label 'heavy' excluded).
# Leak reports from inside Open MPI are suppressed by tests/sanitizers/lsan.supp, nothing else.
scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DA2D_SANITIZE=ON -DA2D_BUILD_BENCH=OFF
phase "sanitizer build"
# The tests' environment (tests/CMakeLists.txt) turns leak checking on and fails on any report.
# The N = 4096 kernel cases and the N = 65536 memory check are excluded here too: the sanitized
# fp64 reference makes them the slowest tests, and the uninstrumented run above covers them.
(cd build-asan && ctest --output-on-failure -j "$(nproc)" --timeout 900 -LE heavy \
  -E 'Nq4096|kernel_memory_65536')
phase "sanitizer tests"

# Fuzz targets (libFuzzer, clang), bounded: 20 s each. scripts/fuzz.sh 3600 runs them longer.
scripts/fuzz.sh 20

echo "test.sh: all tests passed in $(( $(date +%s) - start )) s"
