#!/usr/bin/env bash
# Refused runs end with a2d's message alone and exit 2 (scripts/launch/mpirun.sh drops mpirun's banners
# for that code), output paths are checked before any work with the true reason, and --out
# creates its parents.
#   refusals.sh A2D_BINARY MPIEXEC
set -uo pipefail
a2d=$1
export MPIEXEC=$2
wrapper="$(cd "$(dirname "$0")/../.." && pwd)/scripts/launch/mpirun.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
failures=0

# expect CODE EXACT_OUTPUT -- command...: the combined output is exactly the given text.
expect() {
  local code=$1 want=$2
  shift 3
  local output status
  output=$("$@" 2>&1)
  status=$?
  if [ "$status" -ne "$code" ] || [ "$output" != "$want" ]; then
    echo "FAIL: $*"
    echo "  exit $status (expected $code), output:"
    printf '%s\n' "$output" | sed 's/^/    /'
    echo "  expected:"
    printf '%s\n' "$want" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok: $*"
  fi
}

mpi=("$wrapper" -np 2 --oversubscribe)
expect 2 "a2d: unknown dtype 'fp8'; choose fp32, bf16 or fp16 (on every rank)" -- \
  "${mpi[@]}" "$a2d" run --dtype fp8
echo "keep me" >existing.txt
expect 2 "a2d: rank 0: --out existing.txt is a regular file, not a directory" -- \
  "${mpi[@]}" "$a2d" run --seq 64 --heads 2 --out existing.txt
[ "$(cat existing.txt)" = "keep me" ] || { echo "FAIL: existing.txt changed"; failures=$((failures + 1)); }
expect 2 "a2d: rank 0: --out existing.txt/results: existing.txt is a file, not a directory" -- \
  "${mpi[@]}" "$a2d" run --seq 64 --heads 2 --out existing.txt/results
# Where calibrate and bench --calibrate will write is checked first (no measuring for a minute).
start=$(date +%s)
expect 2 "a2d: rank 0: --out existing.txt/calibration.txt: existing.txt is a file, not a directory" -- \
  "${mpi[@]}" "$a2d" calibrate --out existing.txt/calibration.txt
expect 2 "a2d: rank 0: --calibration existing.txt/c.txt: existing.txt is a file, not a directory" -- \
  "${mpi[@]}" "$a2d" bench --seq 64 --heads 2 --calibrate --calibration existing.txt/c.txt
expect 2 "a2d: rank 0: --out . is a directory; give a file name" -- \
  "${mpi[@]}" "$a2d" calibrate --out .
elapsed=$(($(date +%s) - start))
if [ "$elapsed" -gt 30 ]; then
  echo "FAIL: the refusals of calibrate and bench --calibrate took ${elapsed} s"
  failures=$((failures + 1))
fi
# --out creates the directory and its parents.
"${mpi[@]}" "$a2d" run --algo ring --seq 64 --heads 2 --warmup 0 --iters 1 --out a/b/c >/dev/null 2>&1
if [ -f a/b/c/o.npy ] && [ -f a/b/c/lse.npy ]; then
  echo "ok: --out a/b/c created with its parents"
else
  echo "FAIL: --out a/b/c: no a/b/c/o.npy"
  failures=$((failures + 1))
fi
[ "$failures" -eq 0 ]
