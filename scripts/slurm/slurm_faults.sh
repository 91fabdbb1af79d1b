#!/usr/bin/env bash
# Ending and failing under Slurm (docs/slurm.md, "Ending and failing"): on a Slurm cluster of
# emulated hosts (scripts/slurm/slurm_cluster.sh), one 3-rank `srun --mpi=pmix_v4 a2d run` (one rank
# per host) per case, ended or broken once its ranks compute:
#   scancel      scancel of the job (sbatch --wrap of the srun)
#   scancel-term scancel --signal=TERM of the job: SIGTERM to its steps only, not the batch shell
#   scancel-full scancel --full --signal=TERM: SIGTERM to the batch shell (and srun in it) too
#   scancel-batch scancel --batch --signal=TERM: SIGTERM to the batch shell and srun only
#   srun-term    SIGTERM to srun (as a batch system's time limit or `kill` does)
#   srun-int     SIGINT twice to srun within a second (Ctrl-C twice: srun cancels the step)
#   rank-kill    SIGKILL to the rank on the last host
#   host-freeze  SIGSTOP to everything on the last host (its slurmd, slurmstepd and rank): a
#                frozen node; a2d's watchdog (--timeout) has to end the job
# For each: seconds from the action until no rank is left on any host, srun's exit status (for
# the batch cases: the job's exit code, scontrol's ExitCode), how the tasks ended (srun's lines:
# their exit codes, or "Killed"), the job's state (squeue -t all), how many lines of a2d name the
# signal, the files in --out (5: complete, 0: none; anything else is reported), a2d's first
# message, whether anything is left. One line per case, then the cluster is torn down.
#   scripts/slurm/slurm_faults.sh --a2d build/a2d [--seq 4096] [--timeout 10] [--cases "scancel ..."]
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
slurm="$repo/scripts/slurm/slurm_cluster.sh"
a2d="$repo/build/a2d" seq=4096 timeout=10
cases="scancel scancel-term scancel-full scancel-batch srun-term srun-int rank-kill host-freeze"
while [ $# -gt 0 ]; do
  case "$1" in
    --a2d) a2d=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    *) echo "slurm_faults: unknown option '$1'" >&2; exit 2 ;;
  esac
done
why=$("$slurm" check) || { echo "SKIP: ${why#slurm_cluster: }"; exit 77; }
name="slf$$"
name=${name:0:10}
work=$(mktemp -d)
trap '"$slurm" down --name "$name" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
"$slurm" up --name "$name" --hosts 3 --slots 1 --rate 1gbit --owner $$ >/dev/null
on() { "$slurm" exec --name "$name" "$@"; }

rank_pids() {  # the a2d processes inside the cluster's hosts
  local h pid
  for h in 0 1 2; do
    for pid in $(ip netns pids "$name-h$h" 2>/dev/null); do
      [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = a2d ] && echo "$pid"
    done
  done
  return 0
}
wait_ranks() {  # until 3 ranks run (30 s at most)
  local deadline=$((SECONDS + 30))
  until [ "$(rank_pids | wc -l)" -ge 3 ]; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.2
  done
  sleep 1.5  # past MPI_Init, inside the computation
}
# Seconds from $1 (date +%s.%N) until no rank is left (or "> 60" after 60 s).
seconds_until_gone() {
  local from=$1 deadline=$((SECONDS + 60))
  while [ -n "$(rank_pids)" ]; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "> 60"; return; }
    sleep 0.1
  done
  awk -v a="$from" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}'
}
job_state() {  # the last job's state once it is final (10 s at most)
  local job=$1 state="" deadline=$((SECONDS + 10))
  while [ "$SECONDS" -lt "$deadline" ]; do
    state=$(on squeue -h -t all -j "$job" -o %T 2>/dev/null || true)
    case "$state" in PENDING | RUNNING | COMPLETING | CONFIGURING | "") sleep 0.2 ;; *) break ;; esac
  done
  echo "${state:-?}"
}

not_started() {  # a case whose ranks did not all start: its output, then every job cancelled
  echo "$1: the ranks did not start within 30 s; the job's output:"
  sed 's/^/    /' "$out" 2>/dev/null | tail -n 8
  on scancel -u "$(id -un)" 2>/dev/null || true
  sleep 2
}
printf '%-13s %-8s %-6s %-14s %-10s %-5s %-5s %s\n' case "gone(s)" srun tasks "job state" lines files \
  "a2d's message"
for case in $cases; do
  out="$work/$case.out"
  run_args=(run --seq "$seq" --heads 4 --head-dim 64 --backward --iters 1000 --timeout "$timeout"
    --out "$work/$case-out")
  status=""
  if [ "${case%%-*}" = scancel ]; then
    job=$(cd "$work" && on sbatch --parsable --nodes=3 --ntasks-per-node=1 --output="$out" \
      --wrap "srun --mpi=pmix_v4 $a2d ${run_args[*]}")
    job=${job%%;*}
    wait_ranks || { not_started "$case"; continue; }
    from=$(date +%s.%N)
    case "$case" in
      scancel) on scancel "$job" ;;
      scancel-term) on scancel --signal=TERM "$job" ;;
      scancel-full) on scancel --full --signal=TERM "$job" ;;
      scancel-batch) on scancel --batch --signal=TERM "$job" ;;
    esac
    gone=$(seconds_until_gone "$from")
  else
    on srun --mpi=pmix_v4 --nodes=3 --ntasks-per-node=1 "$a2d" "${run_args[@]}" >"$out" 2>&1 &
    launcher=$!
    wait_ranks || { not_started "$case"; wait "$launcher" || true; continue; }
    job=$(on squeue -h -o %A | tail -n 1 || true)
    # srun inside the controller's namespace: the launcher's process there (not the child srun
    # forks to watch it, whose parent is srun).
    srun_pid=""
    for pid in $(ip netns pids "$name-ctl"); do
      [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = srun ] || continue
      parent=$(awk '/^PPid:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
      [ "$(cat "/proc/$parent/comm" 2>/dev/null)" = srun ] || { srun_pid=$pid; break; }
    done
    from=$(date +%s.%N)
    case "$case" in
      srun-term) kill -TERM "$srun_pid" ;;
      srun-int) kill -INT "$srun_pid"; sleep 0.3; kill -INT "$srun_pid" ;;
      rank-kill)
        for pid in $(ip netns pids "$name-h2"); do
          [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != a2d ] || kill -KILL "$pid"
        done ;;
      host-freeze)
        frozen=$(ip netns pids "$name-h2")
        # shellcheck disable=SC2086
        kill -STOP $frozen ;;
    esac
    status=0
    wait "$launcher" || status=$?
    srun_ended=$(awk -v a="$from" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
    if [ "$case" = host-freeze ]; then
      # What is left is the frozen host's: thaw it, so it can be counted and ended.
      # shellcheck disable=SC2086
      kill -CONT $frozen 2>/dev/null || true
      status="$status@${srun_ended}s"
    fi
    gone=$(seconds_until_gone "$from")
  fi
  state=$(job_state "$job")
  if [ -z "$status" ]; then  # a batch job: its exit code (scontrol's ExitCode=code:signal)
    status=$(on scontrol show job "$job" 2>/dev/null | grep -o ' ExitCode=[0-9:]*' | cut -d= -f2)
    status="b${status:-?}"
  fi
  # How srun saw the tasks end: "143x3" (three tasks exited 143), "Killedx3", ...
  tasks=$(grep -oE 'task [0-9]+: (Exited with exit code [0-9]+|Killed)' "$out" |
    sed -E 's/.*(code |: )//' | sort | uniq -c | awk '{printf "%s%sx%s", (NR > 1 ? "," : ""), $2, $1}')
  lines=$(grep -c 'received SIG' "$out" || true)
  files=$(ls -A "$work/$case-out" 2>/dev/null | wc -l)
  # a2d's own first line about the end (its watchdog's, a signal's), not Open MPI's or Slurm's.
  message=$(grep -E '^a2d' "$out" | head -n 1 | cut -c1-100 || true)
  printf '%-13s %-8s %-6s %-14s %-10s %-5s %-5s %s\n' "$case" "$gone" "$status" "${tasks:--}" "$state" \
    "$lines" "$files" "${message:--}"
  [ "$files" -eq 0 ] || [ "$files" -eq 5 ] || echo "    $files files in --out: neither complete nor absent"
  if [ -n "${SLURM_FAULTS_VERBOSE:-}" ]; then sed 's/^/    /' "$out"; fi
  left=$(rank_pids | wc -l)
  [ "$left" -eq 0 ] || echo "    $left ranks left after the case"
done
