#!/usr/bin/env bash
# The watchdog under a torch.distributed launch (scripts/launch/launch.py, gloo), on by default: rank 1
# skips a backward, raises (then waits outside attention2d), exits normally mid-training, or stops
# itself (SIGSTOP); each RUNS times (default 10). Every run must end within TIMEOUT + 15 s of the
# misbehaviour (rank 1 prints its moment; the processes' start, slow under load, is not counted;
# for raise, within the idle limit of 2 x TIMEOUT + 15 s) with exit code 124 and a report naming
# what the waiting ranks are in, or the rank that is gone or not answering. And a healthy job
# whose rank 1 spends 2.5 x TIMEOUT outside attention2d (a checkpoint save) while the others wait
# inside must finish, exit code 0, with no report. Time the whole machine stood still during a run
# (tests/stall_meter.sh: no process ran, as this VM has been seen to do for 23 s) is not counted
# against the bound; the run says so.
#   watchdog_torch.sh PYTHON [RUNS] [TIMEOUT]
set -uo pipefail
python=$1
runs=${2:-10}
timeout=${3:-3}
here=$(cd "$(dirname "$0")" && pwd)
launch="$here/../../scripts/launch/launch.py"
# shellcheck source=tests/stall_meter.sh
source "$here/../stall_meter.sh"
ticks=$(mktemp)
trap 'rm -f "$ticks"' EXIT
fail() { echo "watchdog_torch.sh: $*" >&2; exit 1; }
for mode in skip raise exit freeze slow; do
  for run in $(seq 1 "$runs"); do
    stall_meter_start "$ticks"
    out=$("$python" "$launch" --nproc 3 --timeout $(( ${timeout%.*} + 60 )) --grace 2 -- \
          "$python" "$here/misbehave.py" "$mode" "$timeout" 2>&1)
    code=$?
    end=$(date +%s.%N)
    moment=$(echo "$out" | sed -n 's/^misbehave.py: rank 1 misbehaves at \([0-9.]*\)$/\1/p' | head -1)
    stalled=$(stall_meter_stop "$ticks" "${moment:-0}")
    [ -n "$moment" ] || { echo "$out"; fail "$mode run $run: rank 1 never reached its misbehaviour"; }
    elapsed=$(awk -v a="$moment" -v b="$end" -v s="$stalled" 'BEGIN { printf "%d", b - a - s }')
    note=""
    [ "$stalled" = 0.0 ] || note=" (the machine stood still for $stalled s of it: not counted)"
    bound=$(( ${timeout%.*} + 15 ))
    case $mode in
      # the waiting ranks are in a call: its shard check (check.*) or an algorithm phase
      skip)   expected="phase [0-9]* (backward\.|forward\.|check\.backward|check\.forward)" ;;
      raise)  expected="outside attention2d"; bound=$(( 2 * ${timeout%.*} + 15 )) ;;
      exit)   expected="rank 1 (is gone|left|closed)" ;;
      freeze) expected="not answering \(dead or stuck\): rank 1 " ;;
      slow)
        if [ "$code" -ne 0 ] || grep -q "a2d watchdog" <<<"$out" ||
           [ "$(grep -o "misbehave.py: rank [0-9] finished" <<<"$out" | wc -l)" -ne 3 ]; then
          echo "$out"
          fail "slow run $run: exit $code (a rank busy outside attention2d must not end a healthy job)"
        fi
        echo "watchdog_torch.sh: slow run $run: finished, exit 0, ${elapsed} s after rank 1 left$note"
        continue
        ;;
    esac
    if [ "$code" -ne 124 ] || ! grep -Eq "$expected" <<<"$out" || [ "$elapsed" -gt "$bound" ]; then
      echo "$out"
      fail "$mode run $run: exit $code ${elapsed} s after the misbehaviour$note (expected 124 within $bound s and /$expected/)"
    fi
    echo "watchdog_torch.sh: $mode run $run: exit 124, ${elapsed} s after the misbehaviour$note"
  done
done
echo "watchdog_torch.sh: passed ($runs runs of each)"
