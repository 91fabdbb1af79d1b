#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs dependencies, builds (warnings are errors),
# runs the unit tests and the tests too slow for the sanitizers while it rebuilds with
# AddressSanitizer + UndefinedBehaviorSanitizer, then runs every other CTest test under them (each
# test runs in at least one of the two builds; tests/CMakeLists.txt, at its end) while the CUDA
# sources compile, then runs the fuzz targets for a bounded time.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
start=$(date +%s)
phase() { echo "test.sh: $1 done at $(( $(date +%s) - start )) s"; }

scripts/setup.sh
scripts/venv.sh  # torch 2.11 and the Python tools from PyPI (.venv/), before the build finds them
scripts/build.sh build
phase "setup and build"
# The sanitizer build, the CUDA compile and the fuzz targets' build run in the background at the lowest priority while the
# first pass's tests run: many of those tests mostly wait (emulated links, timeouts, signals,
# Slurm's daemons), and the builds take the cores they leave idle; nice 19 keeps them from slowing
# the tests that compute. Their output goes to build-background.log, printed if they fail.
background_builds() {
  renice -n 19 -p "$BASHPID" > /dev/null
  # Line tables only (-g1): the sanitizers' stack traces need file and line, not full debug info,
  # which made this build the longest step of the suite.
  scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DA2D_SANITIZE=ON -DA2D_BUILD_BENCH=OFF \
    -DA2D_WITH_PYTHON=OFF "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
  echo "test.sh: sanitizer build done"
  touch "$asan_ready"  # the sanitizer tests may start; the builds below go on beside them
  # The CUDA pieces, where a CUDA toolkit is installed (building them needs no GPU): configure
  # with A2D_WITH_CUDA=ON and compile the .cu sources (the a2d_cuda objects: the CUDA backend for
  # sm_80 and sm_90, 2 dtypes x 4 head dimensions of each attention kernel; bench/a2d_gemm_peak),
  # with -Xptxas -v, and fail if any attention kernel spills registers
  # (scripts/gpu/check_cuda_spills.sh). The objects are removed first so that ptxas reports on every
  # kernel. Nothing CUDA runs here: scripts/gpu/gpu_check.sh is the check on a GPU (docs/gpu.md).
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then
    cmake -S . -B build-cuda -DA2D_WITH_CUDA=ON -DA2D_WERROR=ON -DA2D_BUILD_TESTS=OFF \
      -DA2D_CUDA_PTXAS_VERBOSE=ON > build-cuda.configure.log 2>&1 ||
      { cat build-cuda.configure.log; return 1; }
    grep -q "CUDA=ON" build-cuda.configure.log ||
      { cat build-cuda.configure.log; echo "test.sh: A2D_WITH_CUDA=ON turned itself off"; return 1; }
    find build-cuda/CMakeFiles/a2d_cuda.dir -name '*.o' -delete 2>/dev/null || true
    cmake --build build-cuda -j "$(nproc)" --target a2d_cuda a2d_gemm_peak > build-cuda.build.log 2>&1 ||
      { cat build-cuda.build.log; return 1; }
    scripts/gpu/check_cuda_spills.sh build-cuda.build.log
    echo "test.sh: CUDA build done"
  else
    echo "test.sh: no CUDA toolkit (/usr/local/cuda/bin/nvcc): the CUDA pieces are not built"
  fi
  scripts/dev/fuzz.sh 0  # the fuzz targets, run at the end
}
builds_log=$PWD/build-background.log
asan_ready=$PWD/build-asan/.built
rm -f "$asan_ready"
set -m  # the builds in a process group of their own, stopped whole if this script ends first
(background_builds) > "$builds_log" 2>&1 &
builds_pid=$!
set +m
trap 'kill -- -"$builds_pid" 2>/dev/null || true' EXIT

# Each test runs in one of the two passes, the strictest build that runs it in time
# (tests/CMakeLists.txt, at its end): here the unit tests (the kernels as released, also run
# sanitized below), the heavy and uninstrumented ones, and the Python and package tests (which the
# sanitizer build does not have) and the SimGrid simulation (sim/CMakeLists.txt; the sanitizer
# build has no SMPI variant); every other test runs under the sanitizers below.
# Each pass's output is also kept (test-times.log) for the slowest tests at the end.
times_log=$PWD/test-times.log
: >"$times_log"
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 600 \
  -L '^(unit|heavy|uninstrumented|python|torch|package|sim)$') | tee -a "$times_log"
phase "tests"

# The sanitizer tests start as soon as their build is done; the CUDA compile and the fuzz
# targets' build (nice 19) take what those tests leave idle.
background_failed() {
  cat "$builds_log"
  echo "test.sh: the background builds (sanitizer, CUDA, fuzz targets) failed"
  exit 1
}
while [[ ! -e $asan_ready ]]; do
  if ! kill -0 "$builds_pid" 2>/dev/null; then
    wait "$builds_pid" || true
    background_failed
  fi
  sleep 2
done
phase "sanitizer build (beside the tests)"

# Sanitizers: unit and command tests, and the MPI tests up to 4 ranks (labels 'heavy' and
# 'uninstrumented' excluded).
# Leak reports from inside Open MPI are suppressed by tests/sanitizers/lsan.supp, nothing else.
# (The Python package is left out there: an instrumented extension module would need the sanitizer
# runtime preloaded into the interpreter; the Python tests run in the build above.)
# The tests' environment (tests/CMakeLists.txt) turns leak checking on and fails on any report.
# The N = 4096 kernel cases, the N = 65536 memory check and the thousand-token kernel cases
# (fp32 matrix and element types) are excluded here too: the sanitized fp64 reference makes them
# the slowest tests, and the uninstrumented run above covers them; smaller cases of the same
# kernels and paths run here. At 4 ranks the sanitizers see the fp32 MPI cases (the 2 x 2 grids,
# the hybrid's U = 2) and the hybrid's bf16; the other 16-bit, fenced and fenced-cuda variants
# (label uninstrumented) they see at 3 ranks (fenced-cuda at 1), and the uninstrumented run has
# them at 4 and at the heavy rank counts. The planner's largest search (cli.model_largest, 45 s
# sanitized) runs there only.
(cd build-asan && ctest --output-on-failure -j "$(nproc)" --timeout 900 \
  -LE '^(heavy|uninstrumented)$' \
  -E 'Nq4096|kernel_memory_65536|Nq1000_Nk1000|KernelDtypes.CrossLengthsNoMaskBatch2|KernelDtypes.ThousandTokens') |
  sed -u 's/Test *\(#[0-9]*\): /Test \1: [sanitizers] /' | tee -a "$times_log"
phase "sanitizer tests"

wait "$builds_pid" || background_failed
trap - EXIT
grep -E '^(test.sh|fuzz.sh|-- attention2d)' "$builds_log" || true
phase "CUDA and fuzz builds (beside the tests)"

# Fuzz targets (libFuzzer, clang; built above), bounded: 20 s each. scripts/dev/fuzz.sh 3600 runs them
# longer.
scripts/dev/fuzz.sh 20

# The ten slowest tests of both passes (wall time each; tests of the first pass ran two at a
# time, the MPI ones one at a time under their lock): where the suite's time goes.
echo "test.sh: the ten slowest tests:"
scripts/dev/slowest_tests.sh "$times_log" 10
echo "test.sh: all tests passed in $(( $(date +%s) - start )) s"
