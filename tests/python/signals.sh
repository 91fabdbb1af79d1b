#!/usr/bin/env bash
# Signals under a torch.distributed launch (scripts/launch/launch.py, gloo; docs/reliability.md,
# "Signals"): SIGTERM or SIGINT to one of 3 training ranks ends the job within 10 s with exit code
# 143 or 130 and one line naming the signal, under launch.py, under mpirun (MPI.COMM_WORLD;
# $MPIEXEC, default mpiexec) and with no launcher (3 ranks started by this shell with the env://
# variables, the signal sent by this shell, their parent); SIGINT to a single process is still
# Python's KeyboardInterrupt.
#   signals.sh PYTHON [CASE...]
#   CASE: term, rank-int (SIGTERM, SIGINT to rank 1 of 3 under launch.py), int (SIGINT to 1
#   process), mpi-term, mpi-int (SIGTERM, SIGINT to rank 1 of 3 under mpirun), env-term, env-int
#   (SIGTERM, SIGINT to rank 1 of 3 started by hand)
set -uo pipefail
python=$1
shift
cases=${*:-term rank-int int mpi-term mpi-int env-term env-int}
here=$(cd "$(dirname "$0")" && pwd)
launch="$here/../../scripts/launch/launch.py"
fail() { echo "signals.sh: $*" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
set -m

# start NPROC DIR [mpi]: the training loop under the launcher (launch.py, or mpirun with a third
# argument), in the background; waits for its pids.
start() {
  if [ $# -ge 3 ]; then
    "${MPIEXEC:-mpiexec}" -np "$1" --oversubscribe "$python" "$here/signalled.py" "$2" \
      >"$2.log" 2>&1 &
  else
    "$python" "$launch" --nproc "$1" --timeout 120 --grace 5 -- \
      "$python" "$here/signalled.py" "$2" >"$2.log" 2>&1 &
  fi
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
    kill -KILL $(cat "$1"/pid.* 2>/dev/null) 2>/dev/null  # mpirun's ranks have groups of their own
    cat "$1.log"
    fail "the job still ran 15 s after the signal"
  fi
  wait "$launcher"
  code=$?
  elapsed_ms=$(( ($(date +%s%N) - begin) / 1000000 ))
  cat "$1.log"
}

# one_rank CASE SIGNAL CODE [mpi]: SIGNAL to rank 1 of 3 ends the job within 10 s with CODE and
# one line naming the signal.
one_rank() {
  local name=$1 signal=$2 want=$3
  mkdir "$work/$name"
  start 3 "$work/$name" ${4:+mpi}
  kill "-$signal" "$(cat "$work/$name/pid.1")"
  finish "$work/$name"
  [ "$code" -eq "$want" ] || fail "SIG$signal to rank 1 ($name): exit code $code, not $want"
  one_line "$name" "$signal" "$work/$name.log"
  echo "signals.sh: SIG$signal to rank 1 ($name): exit $code after $elapsed_ms ms"
}
# one_line CASE SIGNAL LOG: what every case asks of the job's output: it ended within 10 s
# (elapsed_ms), and one line names the signal, without a traceback.
one_line() {
  local name=$1 signal=$2 log=$3 lines
  lines=$(grep -c "received SIG" "$log")
  [ "$elapsed_ms" -le 10000 ] || fail "SIG$signal to rank 1 ($name): the job needed $elapsed_ms ms"
  [ "$lines" -eq 1 ] || fail "SIG$signal to rank 1 ($name): $lines lines name the signal, not one"
  grep -q "^a2d: rank 1 received SIG$signal; the job stops" "$log" ||
    fail "SIG$signal to rank 1 ($name): no line names it"
  if grep -q "KeyboardInterrupt" "$log"; then fail "SIG$signal to rank 1 ($name): a traceback"; fi
}
# by_hand CASE SIGNAL CODE: 3 ranks started by this shell with the env:// variables (MASTER_ADDR,
# MASTER_PORT, RANK, WORLD_SIZE; job control on, as in an interactive shell), SIGNAL sent to rank 1
# by this shell, its parent, as a user's `kill` does: every rank exits with CODE within 10 s and
# one line names the signal, as under a launcher.
by_hand() {
  local name=$1 signal=$2 want=$3 dir=$work/$1 port rank pids=() codes=()
  mkdir "$dir"
  port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  for rank in 0 1 2; do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$rank WORLD_SIZE=3 \
      "$python" "$here/signalled.py" "$dir" >"$dir.log.$rank" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 1 600); do
    [ -f "$dir/pid.0" ] && [ -f "$dir/pid.1" ] && [ -f "$dir/pid.2" ] && break
    kill -0 "${pids[@]}" 2>/dev/null || break
    sleep 0.1
  done
  [ -f "$dir/pid.0" ] && [ -f "$dir/pid.1" ] && [ -f "$dir/pid.2" ] ||
    { kill -KILL "${pids[@]}" 2>/dev/null; cat "$dir".log.*; fail "the ranks did not start"; }
  [ "$(ps -o ppid= -p "${pids[1]}" | tr -d ' ')" = "$$" ] || fail "rank 1's parent is not this shell"
  local begin=$(date +%s%N)
  kill "-$signal" "${pids[1]}"
  for _ in $(seq 1 150); do kill -0 "${pids[@]}" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "${pids[@]}" 2>/dev/null; then
    kill -KILL "${pids[@]}" 2>/dev/null
    cat "$dir".log.*
    fail "a rank still ran 15 s after the signal"
  fi
  for rank in 0 1 2; do wait "${pids[$rank]}"; codes+=($?); done
  elapsed_ms=$(( ($(date +%s%N) - begin) / 1000000 ))
  cat "$dir".log.* > "$dir.log"
  cat "$dir.log"
  for rank in 0 1 2; do
    [ "${codes[$rank]}" -eq "$want" ] ||
      fail "SIG$signal to rank 1 ($name): rank $rank's exit code ${codes[$rank]}, not $want"
  done
  one_line "$name" "$signal" "$dir.log"
  echo "signals.sh: SIG$signal to rank 1 ($name): exit ${codes[*]} after $elapsed_ms ms"
}
[[ " $cases " == *" term "* ]] && one_rank term TERM 143
[[ " $cases " == *" rank-int "* ]] && one_rank rank-int INT 130
[[ " $cases " == *" mpi-term "* ]] && one_rank mpi-term TERM 143 mpi
[[ " $cases " == *" mpi-int "* ]] && one_rank mpi-int INT 130 mpi
[[ " $cases " == *" env-term "* ]] && by_hand env-term TERM 143
[[ " $cases " == *" env-int "* ]] && by_hand env-int INT 130

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
