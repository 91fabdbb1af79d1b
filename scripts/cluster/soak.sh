#!/usr/bin/env bash
# A soak: for --minutes M, command-line jobs back to back on an emulated cluster
# (scripts/cluster/cluster.sh, --hosts H x 1 rank), and in parallel one long-lived Python job; with
# --faults, faults of scripts/cluster/faults.sh's kinds at random moments. Everything random comes from
# --seed, and every fault is logged with its moment, so a failure can be replayed.
#
#   scripts/cluster/soak.sh --minutes M [--faults] [--seed S] [--hosts 3] [--timeout 20]
#                   [--a2d build/a2d] [--log DIR]
#
# Jobs: `a2d run` of every algorithm in turn (attention2d, attention2d-overlap, ring,
# allgather-kv, ulysses, hybrid), forward and backward, --check, --out, on inputs written by
# scripts/cluster/soak_check.py (shape, GQA ratio, head dim and mask drawn from the seed), each bounded by
# --timeout (the watchdog), its launch by 60 s (cluster.sh run --start-timeout), and from outside
# by 60 + --timeout + 60 s. After each job, soak_check.py
# compares its outputs with an fp64 reference of its own:
#   wrong  the job reported success with an output outside the bound (1e-5, fp32's)
#   lost   an output missing or partial while the job reported success; or a failed job left a
#          partial file, or part of the set
#   hung   the job still running past 60 + --timeout + 60 s (killed then)
# A job that failed with no fault during it is counted and fails the soak too.
#
# Python: scripts/cluster/soak_python.py under mpirun (2 ranks, this machine's namespace: the faults
# strike the cluster, not it), PYTHONPATH=build/python, the venv's interpreter (.venv/bin/python): forward and backward
# calls with changing shapes, masks, algorithms and dtypes, each checked, and every 30th call a
# decode run of 100 steps; each call ends with gc.collect() and malloc_trim(0), after which each
# rank records its RSS at rest. That RSS and the ranks' open files are sampled every 2 s. After the
# warm-up (the first 5 minutes, or 40 % of a shorter soak, and at least the first 16 calls) the
# median RSS of the last third of the samples may exceed that of the first third by at most 1 MiB
# per 1000 calls, and never less than 0.25 MiB (the RSS at rest moves by up to 0.1 MiB without a
# leak), and its open files (the median of the last third against that of the warm-up) may not
# grow.
#
# Faults (--faults): every 15-45 s one of link_flap (4 s), link_down (--timeout + 15 s), slow
# (rate / 100 for 10 s), stop_ranks (SIGSTOP for --timeout + 5 s), kill_rank, disk_full (the
# outputs' tmpfs filled for 10 s), freeze_host (every process of a host, --timeout + 15 s), on a
# host other than h0 (mpirun's), as scripts/cluster/faults.sh does them.
#
# The last line: `R runs, W wrong, L lost, H hung, rss +X MiB, fds +Y` (R: command-line jobs
# plus Python calls; W, L, H over both; X, Y: the Python ranks' growth after the warm-up, the
# larger of the two). Exits 0 when W, L and H are 0, no job failed without a fault, no Python
# call failed, and the growth is within the bounds above; 1 otherwise; 77 where namespaces
# cannot be made. Needs root. Tears everything down, also when interrupted.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cluster="$repo/scripts/cluster/cluster.sh"
a2d="$repo/build/a2d"
python=$repo/.venv/bin/python  # the interpreter build/python was built for (scripts/venv.sh)
[ -x "$python" ] || python=/usr/bin/python3
minutes="" faults=0 seed=1 hosts=3 timeout=20 log="" start_timeout=60
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --faults) faults=1; shift ;;
    --seed) seed=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --a2d) a2d=$2; shift 2 ;;
    --log) log=$2; shift 2 ;;
    -h | --help) sed -n '2,39p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[[ "$minutes" =~ ^[0-9]+$ && "$minutes" -ge 1 ]] || { echo "soak: --minutes M (whole minutes, at least 1)" >&2; exit 2; }
[ "$hosts" -ge 3 ] || { echo "soak: --hosts 3 or more" >&2; exit 2; }
if ! why=$("$cluster" check); then
  echo "SKIP: cannot emulate a cluster here: ${why#cluster: }"
  exit 77
fi
[ -x "$a2d" ] || { echo "soak: no $a2d (build first, or --a2d PATH)" >&2; exit 2; }
[ -d "$repo/build/python/attention2d" ] || { echo "soak: no build/python (scripts/build.sh build)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

name="soak$$"
name=${name:0:10}
work=${log:-$(mktemp -d /tmp/a2d-soak.XXXXXX)}
mkdir -p "$work"
out_root="$work/out"
mkdir -p "$out_root" "$work/in"
background=()
python_launcher=""
cleanup() {
  local pid
  touch "$work/py.stop"
  for pid in "${background[@]}"; do kill "$pid" 2>/dev/null || true; done
  if [ -n "$python_launcher" ] && kill -0 "$python_launcher" 2>/dev/null; then
    sleep 5
    kill -TERM "$python_launcher" 2>/dev/null || true
  fi
  umount "$out_root" 2>/dev/null || true
  "$cluster" down --name "$name" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
say() { echo "soak: $*" | tee -a "$work/soak.log" >&2; }

"$cluster" up --name "$name" --hosts "$hosts" --slots 1 --rate 200mbit --no-calibrate \
  --owner $$ >/dev/null
mount -t tmpfs -o size=64m a2dsoak "$out_root"
start=$(date +%s.%N)
deadline=$(($(date +%s) + minutes * 60))
clock() { awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}'; }
say "seed $seed, $minutes min, $hosts hosts x 1 rank, --timeout $timeout, faults $([ "$faults" = 1 ] && echo on || echo off); log in $work"

# ---- the Python job and its samples ------------------------------------------------------------
PYTHONPATH="$repo/build/python" mpirun -np 2 --oversubscribe --bind-to none \
  "$python" "$repo/scripts/cluster/soak_python.py" "$seed" "$work/py.status" "$work/py.stop" \
  >"$work/python.log" 2>&1 &
python_launcher=$!
sample_python() {
  local calls pid0 pid1 line
  while [ ! -f "$work/py.stop" ]; do
    if [ -f "$work/py.status" ] && [ -f "$work/py.status.1" ]; then
      line=$(cat "$work/py.status")
      calls=$(echo "$line" | awk '{print $2}')
      pid0=$(echo "$line" | awk '{print $NF}')
      pid1=$(awk '{print $2}' "$work/py.status.1")
      # RSS at rest (each rank's own, after its last call's gc.collect() and malloc_trim(0));
      # open files from /proc.
      echo "$(clock) $calls $(echo "$line" | awk '{for (i = 1; i < NF; ++i) if ($i == "rss_kib") print $(i + 1)}')" \
        "$(ls "/proc/$pid0/fd" 2>/dev/null | wc -l)" \
        "$(awk '{print $4}' "$work/py.status.1")" \
        "$(ls "/proc/$pid1/fd" 2>/dev/null | wc -l)" >>"$work/py.samples"
    fi
    sleep 2
  done
}
sample_python &
background+=($!)

# ---- faults ------------------------------------------------------------------------------------
link() { ip -n "$name-h$2" link set eth0 "$1"; ip -n "$name-br" link set "p$2" "$1"; }
set_rate() {
  tc -n "$name-h$1" qdisc change dev eth0 root tbf rate "$2" burst 256kb latency 20ms
  tc -n "$name-br" qdisc change dev "p$1" root tbf rate "$2" burst 256kb latency 20ms
}
a2d_pids_of_host() {
  local pid
  for pid in $(ip netns pids "$name-h$1"); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = a2d ] && echo "$pid"
  done
  return 0
}
inject_faults() {
  RANDOM=$((seed + 7919))
  local kinds=(link_flap link_down slow stop_ranks kill_rank disk_full freeze_host)
  local kind host wait_s pids file pid
  while :; do
    wait_s=$((15 + RANDOM % 31))
    sleep "$wait_s"
    kind=${kinds[$((RANDOM % ${#kinds[@]}))]}
    host=$((1 + RANDOM % (hosts - 1)))
    echo "$(clock) start $kind host h$host" >>"$work/faults.log"
    case "$kind" in
      link_flap) link down "$host"; sleep 4; link up "$host" ;;
      link_down) link down "$host"; sleep $((timeout + 15)); link up "$host" ;;
      slow) set_rate "$host" 2000kbit; sleep 10; set_rate "$host" 200mbit ;;
      stop_ranks)
        pids=$(a2d_pids_of_host "$host" | tr '\n' ' ')
        # shellcheck disable=SC2086
        [ -z "$pids" ] || kill -STOP $pids 2>/dev/null || true
        sleep $((timeout + 5))
        # shellcheck disable=SC2086
        [ -z "$pids" ] || kill -CONT $pids 2>/dev/null || true
        ;;
      kill_rank)
        for file in /run/a2d-cluster/"$name"/job.*/"$host"; do
          [ -f "$file" ] && pid=$(cat "$file") && kill -KILL "$pid" 2>/dev/null || true
        done
        ;;
      disk_full)
        dd if=/dev/zero of="$out_root/filler" bs=64k 2>/dev/null || true
        sleep 10
        rm -f "$out_root/filler"
        ;;
      freeze_host)
        pids=$(ip netns pids "$name-h$host" | tr '\n' ' ')
        # shellcheck disable=SC2086
        [ -z "$pids" ] || kill -STOP $pids 2>/dev/null || true
        sleep $((timeout + 15))
        # shellcheck disable=SC2086
        [ -z "$pids" ] || kill -CONT $pids 2>/dev/null || true
        ;;
    esac
    echo "$(clock) end $kind host h$host" >>"$work/faults.log"
  done
}
touch "$work/faults.log"
if [ "$faults" = 1 ]; then
  inject_faults &
  background+=($!)
fi

kill_cluster_processes() {  # SIGKILL what runs in this cluster's namespaces (ours only)
  local ns pid
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$name-"); do
    for pid in $(ip netns pids "$ns"); do kill -KILL "$pid" 2>/dev/null || true; done
  done
}

# Whether a fault was in progress, or started, between times $1 and $2 (soak clock).
fault_during() {
  awk -v a="$1" -v b="$2" '
    $2 == "start" { s = $1; open = 1 }
    $2 == "end"   { if (s <= b && $1 >= a) hit = 1; open = 0 }
    END { if (open && s <= b) hit = 1; exit !hit }' "$work/faults.log"
}

# ---- the command-line jobs ---------------------------------------------------------------------
RANDOM=$seed
algos=(attention2d attention2d-overlap ring allgather-kv ulysses hybrid)
jobs=0 wrong=0 lost=0 hung=0 failed_clean=0 failed_fault=0 job=0
while [ "$(date +%s)" -lt "$deadline" ]; do
  algo=${algos[$((job % ${#algos[@]}))]}
  batch=$((1 + RANDOM % 2))
  seq=$((hosts + RANDOM % 300))
  heads=$((3 * (1 + RANDOM % 2)))                 # 3 or 6: Ulysses and the hybrid split heads by P
  kv_choices=(1 3 "$heads")
  kv=${kv_choices[$((RANDOM % 3))]}
  case "$algo" in ulysses | hybrid) kv=$heads ;; esac
  dims=(16 32 64)
  head_dim=${dims[$((RANDOM % 3))]}
  mask=() causal=0 window=0
  case $((RANDOM % 3)) in
    1) mask=(--causal); causal=1 ;;
    2) window=$((1 + RANDOM % 64)); mask=(--window "$window"); causal=1 ;;
  esac
  in="$work/in"
  rm -f "$in"/*.npy
  "$python" "$repo/scripts/cluster/soak_check.py" gen "$in" $((seed * 100000 + job)) "$batch" "$seq" "$heads" "$kv" "$head_dim"
  out="$out_root/job$job"
  describe="job $job: $algo B=$batch N=$seq H=$heads Hkv=$kv D=$head_dim ${mask[*]:-no mask}"
  t0=$(clock)
  code=0
  timeout -s KILL $((start_timeout + timeout + 60)) "$cluster" run --name "$name" \
    --start-timeout "$start_timeout" "$a2d" run \
    --algo "$algo" --q "$in/q.npy" --k "$in/k.npy" --v "$in/v.npy" --do "$in/do.npy" "${mask[@]}" \
    --backward --warmup 0 --iters 1 --timeout "$timeout" --check --out "$out" \
    >"$work/job.log" 2>&1 || code=$?
  t1=$(clock)
  jobs=$((jobs + 1))
  under_fault=no
  fault_during "$t0" "$t1" && under_fault=yes
  # Hung: killed by the outer bound above (timeout's SIGKILL, also exit 137). A job that ends
  # with 137 sooner is one whose rank was killed (kill_rank: mpirun passes on 128 + 9) and is
  # checked like any other failed job.
  if [ "$code" -eq 137 ] && awk -v a="$t0" -v b="$t1" -v bound=$((start_timeout + timeout + 60)) \
    'BEGIN{exit !(b - a >= bound - 1)}'; then
    hung=$((hung + 1))
    verdict="HUNG (killed $((start_timeout + timeout + 60)) s after its start)"
    kill_cluster_processes  # what the kill left
  else
    verdict=$("$python" "$repo/scripts/cluster/soak_check.py" check "$in" "$out" "$causal" "$window" \
      "$([ "$code" -eq 0 ] && echo 1 || echo 0)") && check=0 || check=$?
    case "$check" in
      1) wrong=$((wrong + 1)) ;;
      2) lost=$((lost + 1)) ;;
    esac
    if [ "$code" -ne 0 ]; then
      if [ "$under_fault" = yes ]; then failed_fault=$((failed_fault + 1)); else failed_clean=$((failed_clean + 1)); fi
    fi
  fi
  echo "$t0 $describe: exit $code in $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b - a}') s, fault during: $under_fault; $verdict" >>"$work/soak.log"
  if [ "$code" -ne 0 ] && { [ "$under_fault" = no ] || [[ "$verdict" == HUNG* ]]; }; then
    say "$describe failed (exit $code) with no fault during it, or hung; its log:"
    sed 's/^/    /' "$work/job.log" | tail -30 | tee -a "$work/soak.log" >&2
  fi
  case "$verdict" in wrong* | lost*) say "$describe: $verdict" ;; esac
  rm -rf "$out"
  job=$((job + 1))
done

# ---- the end: stop Python, measure its growth --------------------------------------------------
touch "$work/py.stop"
python_code=0
for _ in $(seq 120); do kill -0 "$python_launcher" 2>/dev/null || break; sleep 1; done
if kill -0 "$python_launcher" 2>/dev/null; then
  say "the Python job did not stop within 120 s of being asked: hung"
  hung=$((hung + 1))
  kill -TERM "$python_launcher" 2>/dev/null || true
fi
wait "$python_launcher" || python_code=$?
python_launcher=""
read -r calls py_wrong py_failed decode_steps < <(awk '{print $2, $4, $6, $8}' "$work/py.status" 2>/dev/null || echo "0 0 0 0")
growth=$("$python" - "$work/py.samples" "$calls" "$((minutes * 60))" <<'PY'
import os, sys
lines = open(sys.argv[1]).readlines() if os.path.exists(sys.argv[1]) else []
rows = [list(map(float, line.split())) for line in lines if len(line.split()) == 6]
calls, soak_s = int(sys.argv[2]), float(sys.argv[3])
# Warm-up, in time: the first 5 minutes, or 40 % of a shorter soak; and at least the first 16
# calls (the RSS at rest jumps by about 40 MB over the first calls, torch's and the engines' first
# use, and then stays within 0.1 MiB: docs/reliability.md, "A soak"). Not every combination of
# soak_python.py's list (48 calls): on a loaded machine a 2-minute soak makes only about 56 calls.
warm_calls = 16
warm_s = min(300.0, 0.4 * soak_s)
before = [r for r in rows if r[0] <= warm_s or r[1] <= warm_calls]
after = [r for r in rows if not (r[0] <= warm_s or r[1] <= warm_calls)]
warm = int(max([r[1] for r in before], default=0))
if not before or len(after) < 3:
    print(f"nan nan 0 {warm}")
    sys.exit()
# Growth: the median RSS at rest (each rank's own, after its call's gc.collect() and
# malloc_trim(0): live memory) of the last third of the samples after the warm-up less that of
# the first third; open files: the median of the last third less the median during the warm-up
# (a file open during one call, sampled mid-call, is no leak: the 60-minute soak saw two such
# single samples).
third = len(after) // 3
median = lambda values: sorted(values)[len(values) // 2]
rss = max(median([r[i] for r in after[-third:]]) - median([r[i] for r in after[:third]])
          for i in (2, 4)) / 1024
fds = max(median([r[i] for r in after[-third:]]) - median([r[i] for r in before])
          for i in (3, 5))
print(f"{max(rss, 0):.2f} {int(fds)} {calls - warm} {warm}")
PY
)
read -r rss fds after_calls warm_calls <<<"$growth"
runs=$((jobs + calls))
wrong=$((wrong + py_wrong))
say "command-line jobs: $jobs ($failed_fault failed under a fault, $failed_clean failed without one);" \
  "Python: $calls calls ($py_failed failed, $py_wrong wrong, $decode_steps decode steps), exit $python_code;" \
  "growth after the warm-up ($warm_calls calls) over $after_calls calls; faults: $(grep -c ' start ' "$work/faults.log" || true) ($work/faults.log)"
status=0
[ "$wrong" -eq 0 ] && [ "$lost" -eq 0 ] && [ "$hung" -eq 0 ] && [ "$failed_clean" -eq 0 ] &&
  [ "$py_failed" -eq 0 ] && [ "$python_code" -eq 0 ] || status=1
if [ "$rss" = nan ]; then
  say "too few Python calls after the warm-up to measure growth"
  status=1
else
  awk -v r="$rss" -v n="$after_calls" 'BEGIN{b = n / 1000; if (b < 0.25) b = 0.25; exit !(r <= b)}' ||
    { say "the Python ranks grew by $rss MiB over $after_calls calls (at most 1 MiB per 1000, 0.25 MiB at least)"; status=1; }
  [ "$fds" -le 0 ] || { say "the Python ranks' open files grew by $fds"; status=1; }
fi
summary="$runs runs, $wrong wrong, $lost lost, $hung hung, rss +$rss MiB, fds +$fds"
echo "$summary" >>"$work/soak.log"
echo "$summary"
exit "$status"
