#!/usr/bin/env bash
# CTest `slurm.job_and_cancel`: a Slurm cluster of 3 emulated hosts x 2 CPUs
# (scripts/slurm/slurm_cluster.sh), then
#   1. sbatch --wait of examples/slurm/cpu.sbatch at N = 301: `a2d info` under srun names the
#      step's 3 nodes x 2 tasks, and `a2d run --check` across them passes;
#   2. a long job (srun --mpi=pmix_v4 a2d run, 3 ranks, one per host) cancelled with scancel once
#      its ranks run: every rank gone within 10 s, one line of a2d naming SIGTERM, the job
#      CANCELLED (squeue -t all and the cluster's jobcomp record; `sacct` needs slurmdbd, which
#      this cluster does not run);
#   3. down: none of the cluster's processes, namespaces or files left.
# With `interrupt` (run by hand; not in CTest, docs/slurm.md says why), instead of 1 and 2: Ctrl-C
# twice (SIGINT twice within a second) to an srun of the same long a2d run: every rank gone
# within 10 s, one line naming SIGINT, srun's exit status 130, the job CANCELLED.
# Prints each step's seconds. Exits 77 (CTest's skip code), "SKIP: reason", only where the
# namespaces or Slurm's daemons cannot start here (not root, no iproute2, slurm-wlm or munge).
#   tests/slurm/slurm_job.sh A2D_BINARY [interrupt]
set -euo pipefail
a2d=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
mode=${2:-job}
case "$mode" in job | interrupt) ;; *) echo "slurm_job.sh: unknown mode '$mode'" >&2; exit 2 ;; esac
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
slurm="$repo/scripts/slurm/slurm_cluster.sh"
if ! why=$("$slurm" check); then
  echo "SKIP: cannot start a Slurm cluster here: ${why#slurm_cluster: }"
  exit 77
fi
name="slt$$"
name=${name:0:10}
work=$(mktemp -d)
started=$SECONDS
fail() {
  echo "FAIL: $*"
  for log in /run/a2d-slurm/"$name"/log/*; do
    [ -f "$log" ] && { echo "--- $log"; tail -n 15 "$log"; }
  done
  exit 1
}
cleanup() {
  "$slurm" down --name "$name" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
on() { "$slurm" exec --name "$name" "$@"; }

t0=$SECONDS
"$slurm" up --name "$name" --hosts 3 --slots 2 --rate 1gbit --owner $$ >/dev/null ||
  fail "the Slurm cluster did not come up"
echo "up: $((SECONDS - t0)) s"
on sinfo

ranks_running() {  # a2d processes inside the cluster's hosts
  local h pid count=0
  for h in 0 1 2; do
    for pid in $(ip netns pids "$name-h$h" 2>/dev/null); do
      [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = a2d ] && count=$((count + 1))
    done
  done
  echo "$count"
}
# Long: 200 iterations of N = 8192 take minutes here.
long_run=(run --seq 8192 --heads 4 --head-dim 64 --iters 200 --timeout 0)
cd "$work"

if [ "$mode" = job ]; then
# ---- 1. a job as users submit it ---------------------------------------------------------------
t0=$SECONDS
A2D="$a2d" SEQ=301 on timeout 90 sbatch --wait --nodes=3 --ntasks-per-node=2 \
  --output="$work/job-%j.out" "$repo/examples/slurm/cpu.sbatch" >"$work/submit.txt" 2>&1 ||
  { cat "$work/submit.txt" "$work"/job-*.out 2>/dev/null; fail "the sbatch job failed"; }
cat "$work"/job-*.out
grep -q "nodes: 3 nodes x 2 tasks (slurm: $name-h0 .. $name-h2), block placement" "$work"/job-*.out ||
  fail "a2d info under srun did not name the step's 3 nodes x 2 tasks"
[ "$(grep -c '^check: .*PASS' "$work"/job-*.out)" -ge 1 ] || fail "no passing check in the job's output"
grep -q "FAIL" "$work"/job-*.out && fail "a check failed"
echo "sbatch job: $((SECONDS - t0)) s, passed"

# ---- 2. scancel of a running job -------------------------------------------------------------
job=$(on sbatch --parsable --nodes=3 --ntasks-per-node=1 --output="$work/long-%j.out" \
  --wrap "srun --mpi=pmix_v4 $a2d ${long_run[*]}")
job=${job%%;*}
[[ "$job" =~ ^[0-9]+$ ]] || fail "sbatch gave no job id ('$job')"
deadline=$((SECONDS + 30))
until [ "$(ranks_running)" -ge 3 ]; do
  [ "$SECONDS" -lt "$deadline" ] || { on squeue -t all; fail "the long job's 3 ranks did not start within 30 s"; }
  sleep 0.2
done
sleep 1  # inside the computation, past MPI_Init
cancelled_at=$(date +%s.%N)
on scancel "$job"
deadline=$((SECONDS + 10))
while [ "$(ranks_running)" -gt 0 ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "$(ranks_running) ranks still running 10 s after scancel"
  sleep 0.1
done
gone=$(awk -v a="$cancelled_at" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
echo "scancel: every rank gone after $gone s"
state=""
deadline=$((SECONDS + 10))
while [ "$SECONDS" -lt "$deadline" ]; do
  state=$(on squeue -h -t all -j "$job" -o %T 2>/dev/null || true)
  [ "$state" != CANCELLED ] || break
  sleep 0.2
done
[ "$state" = CANCELLED ] || fail "squeue -t all shows job $job as '$state', not CANCELLED"
on scontrol show job "$job" | grep -o "JobState=[A-Z]*" | head -1
deadline=$((SECONDS + 10))
until grep -q "JobId=$job .*JobState=CANCELLED" "/run/a2d-slurm/$name/jobcomp.txt" 2>/dev/null; do
  [ "$SECONDS" -lt "$deadline" ] || fail "no CANCELLED record of job $job in jobcomp.txt"
  sleep 0.2
done
echo "job $job: CANCELLED (squeue, jobcomp)"
lines=$(grep -c 'received SIGTERM' "$work/long-$job.out" || true)
[ "$lines" -eq 1 ] || { cat "$work/long-$job.out"; fail "$lines lines of a2d name SIGTERM after scancel, not one"; }
grep -m1 'received SIGTERM' "$work/long-$job.out"

else
# ---- Ctrl-C twice to srun (interrupt) ----------------------------------------------------------
t_int=$SECONDS
on srun --mpi=pmix_v4 --nodes=3 --ntasks-per-node=1 "$a2d" "${long_run[@]}" >"$work/int.out" 2>&1 &
launcher=$!
deadline=$((SECONDS + 30))
until [ "$(ranks_running)" -ge 3 ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "the srun's 3 ranks did not start within 30 s"
  sleep 0.2
done
sleep 0.5  # past a2d's start (its handlers)
srun_pid=""  # srun in the controller's namespace (not the child it forks, whose parent is srun)
for pid in $(ip netns pids "$name-ctl"); do
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = srun ] || continue
  parent=$(awk '/^PPid:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  [ "$(cat "/proc/$parent/comm" 2>/dev/null)" = srun ] || { srun_pid=$pid; break; }
done
[ -n "$srun_pid" ] || fail "no srun process found"
interrupted_at=$(date +%s.%N)
kill -INT "$srun_pid"
sleep 0.3
kill -INT "$srun_pid"
deadline=$((SECONDS + 10))
while [ "$(ranks_running)" -gt 0 ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "$(ranks_running) ranks still running 10 s after Ctrl-C"
  sleep 0.1
done
gone=$(awk -v a="$interrupted_at" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
code=0
wait "$launcher" || code=$?
t_int=$((SECONDS - t_int))
cat "$work/int.out"
[ "$code" -eq 130 ] || fail "srun exited $code after Ctrl-C twice, not 130"
lines=$(grep -c 'received SIGINT' "$work/int.out" || true)
[ "$lines" -eq 1 ] || fail "$lines lines of a2d name SIGINT after Ctrl-C, not one"
deadline=$((SECONDS + 10))
while :; do  # the last job: the srun's own allocation
  job=$(on squeue -h -t all -o '%i %T' | sort -n | tail -n 1 || true)
  [ "${job#* }" != CANCELLED ] && [ "$SECONDS" -lt "$deadline" ] || break
  sleep 0.2
done
[ "${job#* }" = CANCELLED ] || fail "the srun's job is '${job#* }', not CANCELLED"
echo "Ctrl-C twice to srun: every rank gone after $gone s, srun exit 130, job ${job% *} CANCELLED ($t_int s)"
fi

# ---- 3. down, nothing left -------------------------------------------------------------------
t0=$SECONDS
cd /
"$slurm" down --name "$name"
echo "down: $((SECONDS - t0)) s"
[ -z "$(ip netns list | awk '{print $1}' | grep -E "^$name-" || true)" ] || fail "namespaces of $name remain"
[ ! -e "/run/a2d-slurm/$name" ] && [ ! -e "/run/a2d-cluster/$name" ] || fail "state of $name remains"
processes=$(ps -eo pid=,stat=,args=)
left=$(grep -F "/run/a2d-slurm/$name/" <<<"$processes" | awk '$2 !~ /^Z/' || true)
[ -z "$left" ] || fail "processes of $name remain: $left"
echo "PASS: Slurm $mode test and teardown in $((SECONDS - started)) s"
