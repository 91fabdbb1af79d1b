#!/usr/bin/env bash
# Signals (docs/reliability.md, "Signals"): SIGTERM or SIGINT to one rank of a running
# `a2d run --out`, SIGTERM to every rank at once (as scancel or `pkill` send it), and SIGTERM to
# mpirun itself. Every case: the job ends within 10 s, nothing is
# left running, no output file is left partial (the five outputs all there or none), and, where
# a rank is signalled, one line names the signal and the exit code is 128 + signal.
# scripts/launch/mpirun.sh gives mpirun's own signals the same exit codes and one line.
#   signals.sh A2D_BINARY MPIEXEC [CASE...]
#   CASE: rank-term rank-int all-term mpirun-term wrapper-term wrapper-int
set -uo pipefail
a2d=$1
mpiexec=$2
shift 2
cases=${*:-rank-term rank-int all-term mpirun-term wrapper-term wrapper-int}
wrapper="$(cd "$(dirname "$0")" && pwd)/../../scripts/launch/mpirun.sh"
fail() { echo "signals.sh: $*" >&2; exit 1; }
work=$(mktemp -d)
launcher=
# On any failure, nothing of the job is left behind.
trap '[ -z "$launcher" ] || kill -KILL -- "-$launcher" 2>/dev/null; pkill -KILL -f -- "^$a2d run .*--out $work/" ; rm -rf "$work"' EXIT
set -m  # background jobs in their own process groups, signals not ignored

for case in $cases; do
  target=${case%-*}
  signal=$(echo "${case#*-}" | tr a-z A-Z)
  expected=$(( 128 + $(kill -l "$signal") ))
  out="$work/$case"
  log="$work/$case.log"
  command=("$a2d" run --seq 4096 --backward --warmup 0 --iters 1000 --out "$out" --timeout 60)
  if [ "$target" = wrapper ]; then
    MPIEXEC=$mpiexec "$wrapper" --oversubscribe -np 4 "${command[@]}" >"$log" 2>&1 &
  else
    "$mpiexec" --oversubscribe -np 4 "${command[@]}" >"$log" 2>&1 &
  fi
  launcher=$!
  # Wait until every rank is inside the timed loop (the output directory exists by then).
  ranks=()
  for _ in $(seq 1 200); do
    mapfile -t ranks < <(pgrep -f -- "^${command[*]}" | sort -n)
    [ "${#ranks[@]}" -eq 4 ] && [ -d "$out" ] && break
    sleep 0.1
  done
  [ "${#ranks[@]}" -eq 4 ] || { cat "$log"; fail "$case: the ranks did not start (${#ranks[@]} found)"; }
  sleep 1
  case $target in
    rank) kill -s "$signal" "${ranks[2]}" ;;
    all) kill -s "$signal" "${ranks[@]}" ;;
    mpirun|wrapper) kill -s "$signal" "$launcher" ;;
  esac
  start=$(date +%s%N)
  for _ in $(seq 1 150); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$launcher" 2>/dev/null; then
    kill -KILL -- "-$launcher"
    cat "$log"
    fail "$case: the job still ran 15 s after the signal"
  fi
  wait "$launcher"
  code=$?
  launcher=
  elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  cat "$log"
  left=$(pgrep -f -- "^${command[*]}" | wc -l)
  [ "$left" -eq 0 ] || fail "$case: $left ranks left running"
  [ "$elapsed_ms" -le 10000 ] || fail "$case: the job needed $elapsed_ms ms to stop"
  files=$(ls -A "$out" | wc -l)
  [ "$files" -eq 0 ] || [ "$files" -eq 5 ] || fail "$case: $files files in the output folder"
  lines=$(grep -c "received SIG" "$log")
  case $target in
    rank|all|wrapper)
      [ "$code" -eq "$expected" ] || fail "$case: exit code $code, not $expected"
      [ "$lines" -eq 1 ] || fail "$case: $lines lines name the signal, not one"
      grep -Eq "^a2d: (rank [0-9]*|mpirun.sh) received SIG$signal; the job stops" "$log" ||
        fail "$case: no line names SIG$signal" ;;
    mpirun)
      # Open MPI's mpirun, signalled itself, ends the ranks with SIGTERM and exits 1 whatever
      # they do (docs/reliability.md); the ranks stay quiet (the signal is the launcher's).
      [ "$code" -ne 0 ] || fail "$case: exit code 0"
      [ "$lines" -eq 0 ] || fail "$case: $lines lines name a signal" ;;
  esac
  echo "signals.sh: $case: exit $code after $elapsed_ms ms, $files files, $lines line(s) naming the signal"
done
echo "signals.sh: passed"
