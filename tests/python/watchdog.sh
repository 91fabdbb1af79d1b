#!/usr/bin/env bash
# A stalled rank in a Python job: attention2d.watchdog(3) ends the whole job with exit code 124,
# naming the rank and the phase, long before the stall would end.
#   watchdog.sh MPIEXEC PYTHON
set -uo pipefail
mpiexec=$1
python=$2
here=$(dirname "$0")
fail() { echo "python watchdog.sh: $*" >&2; exit 1; }
start=$(date +%s)
out=$(A2D_FAULT_STALL=1:forward.kernel:600 timeout 120 "$mpiexec" --oversubscribe -np 3 \
        "$python" "$here/watchdog.py" 3 2>&1)
code=$?
elapsed=$(( $(date +%s) - start ))
echo "$out"
[ "$code" -eq 124 ] || fail "exit code $code, expected 124 (the watchdog's)"
[ "$elapsed" -lt 60 ] || fail "the watchdog took ${elapsed} s for a 3 s timeout"
grep -q "rank 1 (phase [0-9]* forward.kernel" <<<"$out" || fail "rank 1 and its phase not named"
echo "python watchdog.sh: passed"
