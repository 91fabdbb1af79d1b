#!/usr/bin/env bash
# mpirun as a supervisor expects it when it stops a job: SIGTERM or SIGINT to this script ends
# the job, prints one line naming the signal and exits 128 + signal (143, 130).
#
#   scripts/mpirun.sh [mpirun options] build/a2d run ...      (MPIEXEC=... for another launcher)
#
# Open MPI 4.1's mpirun, itself sent SIGTERM or SIGINT, ends the ranks with SIGTERM and exits 1
# whatever they do, and it cannot be told to pass either signal on (ess_base_forward_signals
# refuses both): docs/reliability.md, "Signals". Here mpirun is sent the same signal, the ranks
# end quietly (the signal came from their launcher) and leave outputs complete or absent, and
# this script exits with the code the signal calls for. Otherwise mpirun's own exit code.
set -u
"${MPIEXEC:-mpirun}" "$@" &
launcher=$!
received=0
on_signal() {
  if [ "$received" -eq 0 ]; then
    received=$(( 128 + $(kill -l "$1") ))
    echo "a2d: mpirun.sh received SIG$1; the job stops" >&2
  fi
  kill -s "$1" "$launcher" 2>/dev/null
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
# `wait` returns early when a trapped signal arrives: wait again until mpirun has ended.
while :; do
  wait "$launcher"
  code=$?
  kill -0 "$launcher" 2>/dev/null || break
done
[ "$received" -ne 0 ] && exit "$received"
exit "$code"
