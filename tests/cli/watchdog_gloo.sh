#!/usr/bin/env bash
# The watchdog over the Gloo mesh (a2d run --comm gloo): a rank that stalls makes it end the job
# with exit code 124 within the timeout + 10 s, its report naming the rank and its phase; a rank
# that exits is noticed at once by the others, whose report names it and the phase they were in.
#   watchdog_gloo.sh A2D_BINARY MPIEXEC
set -uo pipefail
a2d=$1
mpiexec=$2
fail() { echo "watchdog_gloo.sh: $*" >&2; exit 1; }

# Rank 2 sleeps 600 s in its first kernel call; the timeout is 3 s.
start=$(date +%s)
out=$(A2D_FAULT_STALL=2:forward.kernel:600 timeout 120 "$mpiexec" --oversubscribe -np 4 "$a2d" run \
        --comm gloo --seq 1024 --heads 2 --head-dim 32 --timeout 3 2>&1)
code=$?
elapsed=$(( $(date +%s) - start ))
echo "$out"
[ "$code" -eq 124 ] || fail "a stalled job exited $code, not 124"
[ "$elapsed" -le 13 ] || fail "the watchdog took ${elapsed} s for a 3 s timeout"
grep -q "did not arrive (furthest behind): rank 2 (phase [0-9]* forward.kernel" <<<"$out" ||
  fail "the report does not name rank 2 and its phase"
grep -q "did not arrive (furthest behind): rank 2 (.*) on host $(hostname)\$" <<<"$out" ||
  fail "the report does not name rank 2's host"

# Rank 1 exits in the middle of the backward. mpiexec ends the job itself as soon as a rank exits
# (with that rank's code); before that, the ranks waiting for it name it and their phase (the
# survivors' own exit code, 124, is checked with plain processes in GlooProcesses.*).
start=$(date +%s)
out=$(A2D_FAULT_EXIT=1:backward.kernel timeout 120 "$mpiexec" --oversubscribe -np 3 "$a2d" run \
        --comm gloo --seq 512 --heads 2 --head-dim 32 --backward --timeout 3 2>&1)
code=$?
elapsed=$(( $(date +%s) - start ))
echo "$out"
[ "$code" -ne 0 ] || fail "a job with a dead rank exited 0"
[ "$elapsed" -le 13 ] || fail "a job with a dead rank took ${elapsed} s"
grep -q "a2d watchdog: rank 1 is gone (its connection closed) while this rank was in phase backward\.[a-z_]*" <<<"$out" ||
  fail "no rank reported rank 1 gone with its phase"
echo "watchdog_gloo.sh: all checks passed"
