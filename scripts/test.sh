#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs dependencies, builds (warnings are errors),
# runs every CTest test, then rebuilds with AddressSanitizer + UndefinedBehaviorSanitizer and runs
# the fast tests again under them.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
start=$(date +%s)

scripts/setup.sh
scripts/build.sh build
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 600)

scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DA2D_SANITIZE=ON -DA2D_BUILD_BENCH=OFF
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j "$(nproc)" --timeout 900 -LE slow)

echo "test.sh: all tests passed in $(( $(date +%s) - start )) s"
