#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for a bounded time.
#   scripts/dev/fuzz.sh [SECONDS_PER_TARGET]      (default 30; CI runs the default, run longer by hand)
# SECONDS_PER_TARGET 0 only builds them (scripts/test.sh does, beside its first tests).
# New corpus entries go to build-fuzz/corpus/<target> (seeded from fuzz/corpus/<target>). A crash
# leaves build-fuzz/artifacts/<target>/crash-* and fails the script: fix the bug, then commit the
# input under fuzz/regressions/<target>/ so tests/unit/test_fuzz_regressions.cpp replays it.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-30}
scripts/setup.sh >/dev/null
mkdir -p build-fuzz
CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DA2D_FUZZ=ON \
  -DA2D_WITH_MPI=OFF -DA2D_BUILD_TESTS=OFF -DA2D_BUILD_BENCH=OFF -DA2D_WERROR=ON >build-fuzz/configure.log 2>&1 ||
  { cat build-fuzz/configure.log; exit 1; }
cmake --build build-fuzz -j "$(nproc)" --target fuzz_npy fuzz_layout fuzz_mask_ranges
if [ "$seconds" = 0 ]; then
  echo "fuzz.sh: built"
  exit 0
fi
# The targets run side by side (one core each on a 2-core machine), each for SECONDS.
run_target() {
  local target=$1 corpus=build-fuzz/corpus/$1 artifacts=build-fuzz/artifacts/$1
  mkdir -p "$corpus" "$artifacts"
  cp -n fuzz/corpus/$target/* "$corpus"/ 2>/dev/null || true
  # libFuzzer refuses a missing directory, and git keeps no empty ones: pass only what exists.
  local inputs=("$corpus")
  [ -d "fuzz/regressions/$target" ] && inputs+=("fuzz/regressions/$target")
  build-fuzz/fuzz/fuzz_$target -max_total_time="$seconds" -max_len=4096 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "${inputs[@]}" \
    >"build-fuzz/$target.log" 2>&1
}
targets=(npy layout mask_ranges)
pids=()
for target in "${targets[@]}"; do
  echo "fuzz.sh: $target for ${seconds} s"
  run_target "$target" &
  pids+=($!)
done
failed=0
for i in "${!targets[@]}"; do
  target=${targets[$i]} artifacts=build-fuzz/artifacts/${targets[$i]}
  status=0
  wait "${pids[$i]}" || status=$?
  grep -E "^(Done|stat::number_of_executed_units|SUMMARY)|Test unit written|ERROR" "build-fuzz/$target.log" || true
  if [ "$status" -ne 0 ] || [ -n "$(find "$artifacts" -type f)" ]; then
    echo "fuzz.sh: $target failed (exit $status); inputs in $artifacts, log in build-fuzz/$target.log" >&2
    failed=1
  fi
done
[ "$failed" = 0 ] || exit 1
echo "fuzz.sh: no crashes"
