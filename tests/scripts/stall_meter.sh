#!/usr/bin/env bash
# tests/stall_meter.sh, which timing-bound tests use to leave out time the whole machine stood
# still: a run without a pause reports 0.0; a ticker stopped for 4 s (as a paused machine stops
# it) reports about 3 s (the gap minus 1 s); with SINCE after the pause, nothing.
set -euo pipefail
# shellcheck source=tests/stall_meter.sh
source "$(cd "$(dirname "$0")/.." && pwd)/stall_meter.sh"
file=$(mktemp)
trap 'rm -f "$file"' EXIT
fail() { echo "stall_meter: FAIL: $*" >&2; exit 1; }
# Starts the meter and stops its ticker for 4 s, as a machine that is not run stops it.
start_and_pause() {
  stall_meter_start "$file"
  sleep 0.5
  kill -STOP "$STALL_METER_PID"
  sleep 4
  kill -CONT "$STALL_METER_PID"
}

stall_meter_start "$file"
sleep 1.5
lost=$(stall_meter_stop "$file")
[ "$lost" = 0.0 ] || fail "no pause, but $lost s reported"

start_and_pause
sleep 1
lost=$(stall_meter_stop "$file")
awk -v l="$lost" 'BEGIN { exit !(l >= 2.5 && l <= 4) }' || fail "a 4 s pause reported as $lost s"
paused=$lost

start_and_pause
sleep 0.5
after=$EPOCHREALTIME
sleep 1
lost=$(stall_meter_stop "$file" "$after")
[ "$lost" = 0.0 ] || fail "a pause before SINCE counted: $lost s"
echo "stall_meter: passed (a 4 s pause read as $paused s; none when it came before SINCE)"
