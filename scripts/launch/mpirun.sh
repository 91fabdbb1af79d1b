#!/usr/bin/env bash
# mpirun as a supervisor expects it when it stops a job: SIGTERM or SIGINT to this script ends
# the job, prints one line naming the signal and exits 128 + signal (143, 130).
#
#   scripts/launch/mpirun.sh [mpirun options] build/a2d run ...      (MPIEXEC=... for another launcher)
#
# Open MPI 4.1's mpirun, itself sent SIGTERM or SIGINT, ends the ranks with SIGTERM and exits 1
# whatever they do, and it cannot be told to pass either signal on (ess_base_forward_signals
# refuses both): docs/reliability.md, "Signals". Here mpirun is sent the same signal, the ranks
# end quietly (the signal came from their launcher) and leave outputs complete or absent, and
# this script exits with the code the signal calls for. Otherwise mpirun's own exit code.
#
# A job a2d refused (exit 2: bad input found on every rank before any data moved, its message
# printed once) ends with that message alone: Open MPI's mpirun adds two banners for any rank
# that exits non-zero ("Primary job terminated normally, but 1 process returned a non-zero exit
# code ..."), which nothing inside the job can turn off (mpirun -q hides them, and mpirun's own
# errors with them); here they are dropped when the exit code they report is 2. Every other
# line of mpirun and the ranks passes through unchanged.
set -u
fifo=$(mktemp -u "${TMPDIR:-/tmp}/a2d-mpirun.XXXXXX")
mkfifo "$fifo"
# The filter ignores SIGINT and SIGTERM (a Ctrl-C reaches the whole process group): it ends when
# mpirun closes its stderr, so mpirun never writes into a closed pipe.
(
  trap '' INT TERM
  exec awk '
    function out(line) { print line; fflush() }
    function release(   i) { for (i = 1; i <= held; i++) out(hold[i]); held = 0 }
    /^-----------------------------------------------------+$/ {
      if (!open_block) { open_block = 1; n = 0; block[++n] = $0; next }
      block[++n] = $0; open_block = 0
      text = ""
      for (i = 1; i <= n; i++) text = text "\n" block[i]
      if (text ~ /Primary job +terminated normally, but [0-9]+ process(es)? returned/) {
        release(); for (i = 1; i <= n; i++) hold[++held] = block[i]; next
      }
      if (text ~ /exited with non-zero status/ && text ~ /Exit code: +2\n/) { held = 0; next }
      release(); for (i = 1; i <= n; i++) out(block[i]); next
    }
    open_block { block[++n] = $0; next }
    { release(); out($0) }
    END { release(); if (open_block) for (i = 1; i <= n; i++) out(block[i]) }' <"$fifo" >&2
) &
filter=$!
"${MPIEXEC:-mpirun}" "$@" 2>"$fifo" &
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
wait "$filter" 2>/dev/null
rm -f "$fifo"
[ "$received" -ne 0 ] && exit "$received"
exit "$code"
