#!/usr/bin/env bash
# No hangs: a rank that stalls mid-run makes the watchdog abort the whole job, naming the phase
# and the rank that did not arrive; a rank that dies ends the job; a check that outlasts the timeout
# is no hang; ranks given different problems all stop with the same error.
#   watchdog.sh A2D_BINARY MPIEXEC
set -uo pipefail
a2d=$1
mpiexec=$2
fail() { echo "watchdog.sh: $*" >&2; exit 1; }

# Rank 2 sleeps 600 s in its first kernel call; the timeout is 3 s: the job must end, non-zero,
# well before the stall would.
start=$(date +%s)
out=$(A2D_FAULT_STALL=2:forward.kernel:600 timeout 120 "$mpiexec" --oversubscribe -np 4 "$a2d" run \
        --seq 1024 --heads 2 --head-dim 32 --timeout 3 2>&1)
code=$?
elapsed=$(( $(date +%s) - start ))
echo "$out"
[ "$code" -ne 0 ] || fail "a stalled job exited 0"
[ "$code" -ne 124 ] || [ "$elapsed" -lt 60 ] || fail "the job needed ${elapsed} s"
[ "$elapsed" -lt 60 ] || fail "the watchdog took ${elapsed} s for a 3 s timeout"
grep -q "did not arrive (furthest behind): rank 2 (phase [0-9]* forward.kernel" <<<"$out" ||
  fail "the report does not name rank 2 and its phase"
grep -q "did not arrive (furthest behind): rank 2 (.*) on host $(hostname)\$" <<<"$out" ||
  fail "the report does not name rank 2's host"

# A rank that exits in the middle of the backward: the job ends non-zero.
out=$(A2D_FAULT_EXIT=1:backward.kernel timeout 120 "$mpiexec" --oversubscribe -np 3 "$a2d" run \
        --seq 512 --heads 2 --head-dim 32 --backward --timeout 3 2>&1)
code=$?
[ "$code" -ne 0 ] && [ "$code" -ne 124 ] || [ "$code" -eq 124 ] || fail "unexpected exit $code"
[ "$code" -ne 0 ] || fail "a job with a dead rank exited 0"

# A check longer than the timeout is no hang: rank 0's fp64 reference (about 4 s here) beats the
# watchdog's heart row by row while the others wait. Before, a --timeout shorter than the
# reference aborted a healthy job: at the default 300 s, for 4 heads of 64, every --check from
# N = 23k or so here; and at 64 ranks on 2 cores, where the waiting ranks' polls every 0.5 ms
# slowed the reference 100-fold, every --check.
out=$(timeout 120 "$mpiexec" --oversubscribe -np 2 "$a2d" run --seq 3072 --heads 2 --head-dim 64 \
        --backward --check --warmup 0 --iters 1 --timeout 1 2>&1)
code=$?
echo "$out"
[ "$code" -eq 0 ] || fail "a check longer than --timeout 1 exited $code"
grep -q "^check: .*: PASS$" <<<"$out" || fail "the long check did not pass"
! grep -q "watchdog" <<<"$out" || fail "the watchdog spoke during a healthy check"

# Different problems on different ranks (MPMD): the error holds on every rank and is printed
# once, exit code 2.
out=$(timeout 120 "$mpiexec" --oversubscribe -np 1 "$a2d" run --seq 256 --heads 8 --head-dim 32 : \
        -np 2 "$a2d" run --seq 256 --heads 4 --head-dim 32 2>&1)
code=$?
echo "$out"
[ "$code" -eq 2 ] || fail "mismatched ranks gave exit code $code, not 2"
[ "$(echo "$out" | grep -c '^  heads: 4 on ranks 1-2; 8 on rank 0')" -eq 1 ] ||
  fail "the mismatch is not named exactly once"
echo "watchdog.sh: all checks passed"
