#!/usr/bin/env bash
# CTest `slurm.job_and_cancel`: a Slurm cluster of 3 emulated hosts x 2 CPUs
# (scripts/slurm_cluster.sh), then
#   1. sbatch --wait of examples/slurm/cpu.sbatch at N = 301: `a2d info` under srun names the
#      step's 3 nodes x 2 tasks, and `a2d run --check` across them passes;
#   2. a long job (srun --mpi=pmix_v4 a2d run, 3 ranks, one per host) cancelled with scancel once
#      its ranks run: every rank gone within 10 s, the job CANCELLED (squeue -t all and the
#      cluster's jobcomp record; `sacct` needs slurmdbd, which this cluster does not run);
#   3. down: none of the cluster's processes, namespaces or files left.
# Prints each step's seconds. Exits 77 (CTest's skip code), "SKIP: reason", only where the
# namespaces or Slurm's daemons cannot start here (not root, no iproute2, slurm-wlm or munge).
#   tests/slurm/slurm_job.sh A2D_BINARY
set -euo pipefail
a2d=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
slurm="$repo/scripts/slurm_cluster.sh"
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

# ---- 1. a job as users submit it ---------------------------------------------------------------
t0=$SECONDS
cd "$work"
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
# Long: 200 iterations of N = 8192 take minutes here.
job=$(on sbatch --parsable --nodes=3 --ntasks-per-node=1 --output="$work/long-%j.out" \
  --wrap "srun --mpi=pmix_v4 $a2d run --seq 8192 --heads 4 --head-dim 64 --iters 200 --timeout 0")
job=${job%%;*}
[[ "$job" =~ ^[0-9]+$ ]] || fail "sbatch gave no job id ('$job')"
ranks_running() {  # a2d processes inside the cluster's hosts
  local h pid count=0
  for h in 0 1 2; do
    for pid in $(ip netns pids "$name-h$h" 2>/dev/null); do
      [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = a2d ] && count=$((count + 1))
    done
  done
  echo "$count"
}
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
echo "PASS: Slurm job, scancel and teardown in $((SECONDS - started)) s"
