#!/usr/bin/env bash
# The watchdog under a torch.distributed launch (scripts/launch.py, gloo), on by default: rank 1
# skips a backward, raises (then waits outside attention2d), or exits normally mid-training; each
# RUNS times (default 10). Every run must end within TIMEOUT + 15 s of the misbehaviour (rank 1
# prints its moment; the processes' start, slow under load, is not counted) with exit code 124 and
# a report naming what the waiting ranks are in, or the rank that is gone.
#   watchdog_torch.sh PYTHON [RUNS] [TIMEOUT]
set -uo pipefail
python=$1
runs=${2:-10}
timeout=${3:-3}
here=$(cd "$(dirname "$0")" && pwd)
launch="$here/../../scripts/launch.py"
fail() { echo "watchdog_torch.sh: $*" >&2; exit 1; }
for mode in skip raise exit; do
  for run in $(seq 1 "$runs"); do
    out=$("$python" "$launch" --nproc 3 --timeout $(( ${timeout%.*} + 60 )) --grace 2 -- \
          "$python" "$here/misbehave.py" "$mode" "$timeout" 2>&1)
    code=$?
    end=$(date +%s.%N)
    moment=$(echo "$out" | sed -n 's/^misbehave.py: rank 1 misbehaves at \([0-9.]*\)$/\1/p' | head -1)
    [ -n "$moment" ] || { echo "$out"; fail "$mode run $run: rank 1 never reached its misbehaviour"; }
    elapsed=$(awk -v a="$moment" -v b="$end" 'BEGIN { printf "%d", b - a }')
    case $mode in
      skip)  expected="phase [0-9]* backward\.|phase [0-9]* forward\." ;;
      raise) expected="outside attention2d" ;;
      exit)  expected="rank 1 (is gone|left|closed)" ;;
    esac
    if [ "$code" -ne 124 ] || ! grep -Eq "$expected" <<<"$out" ||
       [ "$elapsed" -gt $(( ${timeout%.*} + 15 )) ]; then
      echo "$out"
      fail "$mode run $run: exit $code ${elapsed} s after the misbehaviour (expected 124 within $timeout + 15 s and /$expected/)"
    fi
    echo "watchdog_torch.sh: $mode run $run: exit 124, ${elapsed} s after the misbehaviour"
  done
done
echo "watchdog_torch.sh: passed ($runs runs of each)"
