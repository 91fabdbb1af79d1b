#!/usr/bin/env bash
# A signal from a parent named slurmstepd (srun's tasks: docs/reliability.md, "Signals"): slurmstepd
# signals every task of a step at once and SIGKILL follows within milliseconds, so a2d ends at once
# with 128 + signal and rank 0 prints the one line. A parent of another name (mpirun, orted) is a
# launcher that reports the end itself: the rank ends quietly with the same code. No Slurm needed:
# the parent is bash started through a link named slurmstepd (its comm is the link's name).
#   tests/cli/signals_slurmstepd.sh A2D_BINARY
set -euo pipefail
a2d=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
export SLURM_PROCID=0  # as srun sets it for task 0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
ln -s "$(command -v bash)" "$work/bin/slurmstepd"
ln -s "$(command -v bash)" "$work/bin/launcher"
fail() {
  echo "FAIL: $*"
  exit 1
}
# case PARENT SIGNAL EXPECTED_CODE EXPECTED_LINES
for case in "slurmstepd TERM 143 1" "slurmstepd INT 130 1" "launcher TERM 143 0"; do
  read -r parent signal expected lines_expected <<<"$case"
  log="$work/$parent-$signal.log"
  mkdir "$work/$parent-$signal"
  # The parent signals its child itself (si_pid is the parent), once a2d runs (its handlers are
  # installed before it computes); job control on, so a background job's SIGINT is not ignored.
  code=$("$work/bin/$parent" -c 'set -m
    "$1" run --seq 1024 --heads 2 --head-dim 64 --iters 100000 --timeout 0 --out "$2/out" >"$3" 2>&1 &
    child=$!
    for _ in $(seq 200); do  # until SIGTERM is caught (bit 14 of SigCgt)
      cgt=$(awk "/^SigCgt/ {print \$2}" "/proc/$child/status" 2>/dev/null || echo 0)
      (( 0x$cgt & 0x4000 )) && break
      sleep 0.05
    done
    sleep 0.5
    kill -"$4" "$child"
    wait "$child" 2>/dev/null && echo 0 || echo $?' _ "$a2d" "$work/$parent-$signal" "$log" "$signal")
  cat "$log"
  lines=$(grep -c "^a2d: rank 0 received SIG$signal; the job stops" "$log" || true)
  [ "$code" = "$expected" ] || fail "$parent SIG$signal: exit code $code, not $expected"
  [ "$lines" -eq "$lines_expected" ] || fail "$parent SIG$signal: $lines lines naming the signal, not $lines_expected"
  echo "signals_slurmstepd.sh: parent $parent, SIG$signal: exit $code, $lines line(s)"
done
echo "signals_slurmstepd.sh: passed"
