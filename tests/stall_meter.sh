# shellcheck shell=bash
# Measures how long the whole machine stood still during a timed run, for tests whose bound is in
# wall-clock seconds. Sourced (bash):
#
#   stall_meter_start FILE   starts a ticker that appends a timestamp to FILE every 0.2 s
#   stall_meter_stop FILE [SINCE]
#                            stops it and prints the seconds lost to gaps over 3 s (each gap minus
#                            1 s; with SINCE, epoch seconds, only what was lost after it), 0.0 when
#                            there was none; removes FILE
#
# Why: this VM has been seen standing still for 23 s with nothing running (2026-12-04 14:08:36 UTC:
# the flake hunt's 5 s load sampler overran by 23 s, a 60 s sampler by 24 s, and
# python.torch.watchdog's run across that moment took 29 s where 6.6-6.7 s is usual; no soft-lockup
# message, so the guest's kernel was not stuck, it was not run). This ticker's ticks were at most
# 0.26 s apart over 90 s at a load average of 15-28 on 2 cores, and a 5 s sampler never overran by
# 3 s in 1.9 hours at loads up to 53 but that once: a gap over 3 s is the machine not running,
# which no code under test can answer for. docs/reliability.md, "Flake hunt".
stall_meter_start() {
  local file=$1
  : >"$file"
  (while :; do echo "$EPOCHREALTIME" >>"$file"; sleep 0.2; done) &
  STALL_METER_PID=$!
}

stall_meter_stop() {
  local file=$1 since=${2:-0}
  kill "$STALL_METER_PID" 2>/dev/null
  wait "$STALL_METER_PID" 2>/dev/null
  awk -v since="$since" '
    NR > 1 && $1 - last > 3 && $1 > since {
      from = last > since ? last : since
      if ($1 - from > 1) lost += $1 - from - 1
    }
    { last = $1 }
    END { printf "%.1f\n", lost + 0 }' "$file"
  rm -f "$file"
}
