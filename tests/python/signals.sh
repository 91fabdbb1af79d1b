#!/usr/bin/env bash
# Signals under a torch.distributed launch (scripts/launch.py, gloo; docs/reliability.md,
# "Signals"): SIGTERM to one of 3 training ranks ends the job within 10 s with exit code 143 and
# one line naming the signal; SIGINT to a single process is still Python's KeyboardInterrupt.
#   signals.sh PYTHON [CASE...]      CASE: term (SIGTERM to rank 1 of 3), int (SIGINT, 1 process)
set -uo pipefail
python=$1
shift
cases=${*:-term int}
here=$(cd "$(dirname "$0")" && pwd)
launch="$here/../../scripts/launch.py"
fail() { echo "signals.sh: $*" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
set -m

# start NPROC DIR: the training loop under the launcher, in the background; waits for its pids.
start() {
  "$python" "$launch" --nproc "$1" --timeout 120 --grace 5 -- \
    "$python" "$here/signalled.py" "$2" >"$2.log" 2>&1 &
  launcher=$!
  for _ in $(seq 1 600); do
    [ -f "$2/pid.$(( $1 - 1 ))" ] && return 0
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.1
  done
  cat "$2.log"
  fail "the ranks did not start"
}

# finish DIR: waits up to 15 s for the launcher; sets code and elapsed_ms.
finish() {
  local begin=$(date +%s%N)
  for _ in $(seq 1 150); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$launcher" 2>/dev/null; then
    kill -KILL -- "-$launcher"
    cat "$1.log"
    fail "the job still ran 15 s after the signal"
  fi
  wait "$launcher"
  code=$?
  elapsed_ms=$(( ($(date +%s%N) - begin) / 1000000 ))
  cat "$1.log"
}

if [[ " $cases " == *" term "* ]]; then
mkdir "$work/term"
start 3 "$work/term"
kill -TERM "$(cat "$work/term/pid.1")"
finish "$work/term"
lines=$(grep -c "received SIG" "$work/term.log")
[ "$code" -eq 143 ] || fail "SIGTERM to rank 1: exit code $code, not 143"
[ "$elapsed_ms" -le 10000 ] || fail "SIGTERM to rank 1: the job needed $elapsed_ms ms"
[ "$lines" -eq 1 ] || fail "SIGTERM to rank 1: $lines lines name the signal, not one"
grep -q "^a2d: rank 1 received SIGTERM; the job stops" "$work/term.log" ||
  fail "SIGTERM to rank 1: no line names it"
echo "signals.sh: SIGTERM to rank 1: exit $code after $elapsed_ms ms"
fi

if [[ " $cases " == *" int "* ]]; then
mkdir "$work/int"
start 1 "$work/int"
kill -INT "$(cat "$work/int/pid.0")"
finish "$work/int"
[ "$code" -eq 130 ] || fail "SIGINT to a single process: exit code $code, not 130"
grep -q "KeyboardInterrupt" "$work/int.log" || fail "SIGINT to a single process: no KeyboardInterrupt"
echo "signals.sh: SIGINT to a single process: KeyboardInterrupt, exit $code after $elapsed_ms ms"
fi
echo "signals.sh: passed"
