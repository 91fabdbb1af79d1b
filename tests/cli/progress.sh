#!/usr/bin/env bash
# Long runs say so (docs/reliability.md, "Long runs"), tested cheaply with the thresholds lowered
# through the environment (A2D_PROGRESS_PREDICT, _AFTER, _EVERY): every subcommand that can run
# long (kernel, run, bench, decode, calibrate) prints its prediction first and then progress lines
# (phase, iteration, share done, elapsed, left) on rank 0's stderr, at least one and no more often
# than asked;
# --quiet prints none of them; stdout, --json's lines, is the same with and without them.
#   progress.sh A2D_BINARY MPIEXEC
set -uo pipefail
a2d=$1
mpiexec=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
# Lines from 0.1 s on (so that a fast machine's short runs still print one), then every 0.5 s.
after=0.1
every=0.5
fast=(env A2D_PROGRESS_PREDICT=0 A2D_PROGRESS_AFTER=$after A2D_PROGRESS_EVERY=$every)

# run NAME command...: stdout in NAME.out, stderr in NAME.err, exit code, seconds it ran.
run() {
  local name=$1 begin
  shift
  begin=$(date +%s%N)
  "$@" >"$name.out" 2>"$name.err"
  code=$?
  seconds=$(awk -v ns=$(($(date +%s%N) - begin)) 'BEGIN{printf "%.2f", ns / 1e9}')
  echo "$name: exit $code in $seconds s, $(wc -l <"$name.err") lines on stderr"
  [ "$code" -eq 0 ] || { fail "$name: exit $code"; cat "$name.err"; }
}

# lines NAME COMMAND: the prediction first, then progress lines in the format, no more than the
# cadence allows (one at $after s, then one every $every s), at least one. The phase is free text
# (calibrate's names a measurement, with commas); the rest of the line is fixed.
lines() {
  local name=$1 command=$2
  head -1 "$name.err" | grep -q "^$command: predicted .* for .* (.*); progress on stderr every" ||
    { fail "$name: the first line is not the prediction:"; head -3 "$name.err"; }
  local progress most
  progress=$(grep -c "% done, .* elapsed, ~.* left$" "$name.err")
  most=$(awk -v s="$seconds" -v a="$after" -v e="$every" 'BEGIN{print 1 + int((s - a) / e)}')
  [ "$progress" -ge 1 ] || fail "$name: no progress line"
  [ "$progress" -le "$most" ] || fail "$name: $progress progress lines in $seconds s (at most $most)"
  grep "% done" "$name.err" | grep -Ev "^$command: .+(, iteration [0-9]+ of [0-9]+)?, [0-9]+\.[0-9]% done, [0-9.]+( min [0-9]+)? s elapsed, ~[0-9.]+( min [0-9]+)? s left$" &&
    fail "$name: lines not in the format"
  return 0
}

# same_json A B: the JSON lines of A.out and B.out have the same keys in the same order and the
# same values but for the times and rates (which differ from run to run).
same_json() {
  python3 - "$1.out" "$2.out" <<'PY' || fail "$1 and $2: stdout differs"
import json, re, sys
timed = re.compile(r"(ms|gflops|peak|rss|_s$|per_s|seconds)")
def rows(path):
    out = []
    for line in open(path):
        row = json.loads(line)  # every line of stdout is a JSON object
        out.append([(k, None if timed.search(k) else v) for k, v in row.items()])
    return out
a, b = rows(sys.argv[1]), rows(sys.argv[2])
if a != b:
    print("  ", a, "\n  ", b)
    sys.exit(1)
PY
}

# N = 8192: the forward calls take ~1.6 s here, more than a tick's interval even on a machine twice
# as fast, so a tick lands in them (at N = 4096 they took ~0.4 s: a fresh clone's run under load
# had its ticks in the set-up and the backward only).
kernel=("$a2d" kernel --seq 8192 --heads 4 --head-dim 64 --repeats 3 --backward --json)
run kernel "${fast[@]}" "${kernel[@]}"
lines kernel "a2d kernel"
grep -q "a2d kernel: forward, iteration" kernel.err || fail "kernel: no forward's line"
run kernel_quiet "${fast[@]}" "${kernel[@]}" --quiet
[ -s kernel_quiet.err ] && { fail "kernel --quiet: stderr not empty"; cat kernel_quiet.err; }
same_json kernel kernel_quiet

mpi=("$mpiexec" -np 2 --oversubscribe)
# 13 calls (~1-2 s here): ticks every 0.5 s land inside calls, not only in the setup before them
# (with 4 calls, 0.2-0.5 s of calls, a quiet machine's run printed no call's line 1 time in 3).
job=(run --seq 2048 --heads 4 --iters 12 --backward --json)
run run "${fast[@]}" "${mpi[@]}" "$a2d" "${job[@]}"
lines run "a2d run"
[ "$(grep -c "predicted" run.err)" -eq 1 ] || fail "run: not one prediction (rank 0's)"
grep -q "a2d run: \(forward\|backward\)[.a-z_]*, iteration" run.err || fail "run: no call's line"
run run_quiet "${fast[@]}" "${mpi[@]}" "$a2d" "${job[@]}" --quiet
[ -s run_quiet.err ] && { fail "run --quiet: stderr not empty"; cat run_quiet.err; }
same_json run run_quiet

# 3 rounds of ~0.4 s here: the rounds, not only the setup, span several ticks (at --seq 2048 the
# rounds took 0.1 s, a faster machine's could end before the first tick).
bench=(bench --algo ring,attention2d --seq 6144 --heads 4 --iters 2 --json)
run bench "${fast[@]}" "${mpi[@]}" "$a2d" "${bench[@]}"
lines bench "a2d bench"
grep -q "^a2d bench: round [0-9] of every row: [a-z_.]*, iteration [0-9] of 3" bench.err ||
  fail "bench: no round's line"
run bench_quiet "${fast[@]}" "${mpi[@]}" "$a2d" "${bench[@]}" --quiet
[ -s bench_quiet.err ] && { fail "bench --quiet: stderr not empty"; cat bench_quiet.err; }

# 1000 steps (~0.7 s here): with 40 (under 0.1 s) a CI machine's run ended before the first tick.
decode=(decode --prompt 2048 --heads 4 --steps 1000 --json)
run decode "${fast[@]}" "${mpi[@]}" "$a2d" "${decode[@]}"
lines decode "a2d decode"
grep -q "^a2d decode: predicted .* for the prefill and 1000 decode steps" decode.err ||
  fail "decode: no prediction"
run decode_quiet "${fast[@]}" "${mpi[@]}" "$a2d" "${decode[@]}" --quiet
[ -s decode_quiet.err ] && { fail "decode --quiet: stderr not empty"; cat decode_quiet.err; }

# --kernel-seconds bounds the first measurement by time, not by the machine's speed: 0.3 gives it
# ~1 s, so ticks land inside it (with 0.05 it ended 0.1 s after the first tick).
calibrate=(calibrate --out cal.txt --block 128 --heads 1 --iters 1 --kernel-seconds 0.3)
run calibrate "${fast[@]}" "${mpi[@]}" "$a2d" "${calibrate[@]}"
lines calibrate "a2d calibrate"
grep -q "^a2d calibrate: predicted .* for 7 measurements" calibrate.err ||
  fail "calibrate: no prediction"
grep -q "^a2d calibrate: the kernel's forward and backward rates, unmasked and causal, iteration 1 of 7" \
  calibrate.err || fail "calibrate: no line of its first measurement"
run calibrate_quiet "${fast[@]}" "${mpi[@]}" "$a2d" "${calibrate[@]}" --quiet
[ -s calibrate_quiet.err ] && { fail "calibrate --quiet: stderr not empty"; cat calibrate_quiet.err; }

[ "$failures" -eq 0 ] || { echo "progress.sh: $failures failures"; exit 1; }
echo "progress.sh: passed"
