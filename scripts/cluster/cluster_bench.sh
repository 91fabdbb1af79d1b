#!/usr/bin/env bash
# The benchmark across emulated clusters (docs/benchmarks.md, "Across a network"): for every
# configuration (P ranks, S ranks per host, link rate), scripts/cluster/cluster.sh brings up P/S hosts
# with one shaped link each (or one per rank with LINK=rank), calibrates (kernel rates for the
# machine file), asks `a2d plan` for its first plan, runs `a2d bench` (every algorithm and every
# grid, forward + backward) across the hosts with the predictions of the machine file, records
# the load average before and after and the machine's CPU shares (user, system, softirq, idle)
# over the benches, and tears down. One JSON line per row is appended to OUT.
#
#   scripts/cluster/cluster_bench.sh [--ps "4 8 16"] [--slots "1 4"] [--rates "50 100 200 1000"]
#                            [--seq 4096] [--heads 4] [--head-dim 64] [--iters 2] [--link host]
#                            [--hybrid U] [--out cluster-bench.jsonl] [--a2d build/a2d]
#
# --hybrid U: one more row per configuration, the heads x ATTENTION2D hybrid with U head groups
# (U must divide P and --heads), each group on the squarest grid of P / U ranks.
#   scripts/cluster/cluster_report.py cluster-bench.jsonl     (tables and plots)
set -euo pipefail
cd "$(dirname "$0")/../.."
ps="4 8 16" slots_list="1 4" rates="50 100 200 1000" seq=4096 heads=4 head_dim=64 iters=2
link=host out=cluster-bench.jsonl a2d=build/a2d hybrid=0
while [ $# -gt 0 ]; do
  case "$1" in
    --ps) ps=$2; shift 2 ;;
    --slots) slots_list=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --heads) heads=$2; shift 2 ;;
    --head-dim) head_dim=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --link) link=$2; shift 2 ;;
    --hybrid) hybrid=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --a2d) a2d=$2; shift 2 ;;
    __one) break ;;
    *) echo "cluster_bench: unknown option '$1'" >&2; exit 2 ;;
  esac
done
a2d=$(realpath "$a2d")
out=$(realpath -m "$out")
problem=(--seq "$seq" --heads "$heads" --kv-heads "$heads" --head-dim "$head_dim" --causal)
command_line=${A2D_BENCH_COMMAND:-"scripts/cluster/cluster_bench.sh --ps \"$ps\" --slots \"$slots_list\" --rates \"$rates\" --seq $seq --heads $heads --head-dim $head_dim --iters $iters --link $link$([ "$hybrid" -le 1 ] || echo " --hybrid $hybrid")"}
export A2D_BENCH_COMMAND=$command_line

# One configuration, inside `cluster.sh with` (A2D_CLUSTER, A2D_CLUSTER_DIR set).
one() {
  local p=$1 s=$2 rate=$3 machine="$A2D_CLUSTER_DIR/machine.txt" load_before load_after plan
  local rows
  rows=$(mktemp)
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  cpu_before=$(head -1 /proc/stat)
  plan=$("$a2d" plan --json --machine-file "$machine" --gpus "$p" "${problem[@]}" --dtype fp32)
  # Every algorithm of a2d's table (its bench's default) but the hybrid, whose rows this script
  # chooses itself (--hybrid U below): a2d bench --help names them.
  local algos
  algos=$("$a2d" bench --help | tr -s ' \n' ' ' | grep -o 'every one, [a-z0-9,-]*' | sed 's/every one, //; s/,hybrid//; s/hybrid,//')
  scripts/cluster/cluster.sh run --name "$A2D_CLUSTER" "$a2d" bench --json --backward --algo "$algos" \
    --machine-file "$machine" --warmup 1 --iters "$iters" "${problem[@]}" --timeout 600 |
    sed 's/^{/{"placement": "block", /' >"$rows"
  local plan_algo plan_grid plan_cyclic plan_nt
  read -r plan_algo plan_grid plan_cyclic plan_nt < <(python3 -c 'import json, sys
p = json.loads(sys.argv[1])
print(p["algo"], p["grid"], "round-robin" if p["placement"] in ("round-robin", "cyclic") else "-",
      "-" if p["kv_transpose"] else "nt")' "$plan")
  if [ "$plan_nt" != - ]; then
    # a2d bench's rows take the K/V transpose; the planner's first does not: time it as well.
    local cyclic_flag=() machine_used=$machine placement=block
    if [ "$plan_cyclic" != - ]; then
      cyclic_flag=(--cyclic) placement=round-robin
      sed 's/^cyclic_placement = .*//' "$machine" >"$machine.cyclic"
      echo "cyclic_placement = 1" >>"$machine.cyclic"
      machine_used=$machine.cyclic
    fi
    scripts/cluster/cluster.sh run --name "$A2D_CLUSTER" "${cyclic_flag[@]}" "$a2d" bench --json --backward \
      --machine-file "$machine_used" --warmup 1 --iters "$iters" "${problem[@]}" --timeout 600 \
      --algo "$plan_algo" --grid "$plan_grid" --no-kv-transpose |
      sed "s/^{/{\"placement\": \"$placement\", /" >>"$rows"
  fi
  if [ "$hybrid" -gt 1 ] && [ $((p % hybrid)) -eq 0 ] && [ $((heads % hybrid)) -eq 0 ]; then
    # The hybrid: U head groups of P / U ranks, each on its squarest grid R x C (R <= C).
    local group=$((p / hybrid)) r=1 c
    for ((c = 1; c * c <= group; c++)); do [ $((group % c)) -ne 0 ] || r=$c; done
    c=$((group / r))
    scripts/cluster/cluster.sh run --name "$A2D_CLUSTER" "$a2d" bench --json --backward \
      --machine-file "$machine" --warmup 1 --iters "$iters" "${problem[@]}" --timeout 600 \
      --algo hybrid --heads-parallel "$hybrid" --grid "${r}x$c" |
      sed 's/^{/{"placement": "block", /' >>"$rows"
  fi
  if [ "$s" -gt 1 ]; then
    # The other placement of ranks on hosts (round-robin: rank q on host q mod H), predicted
    # with it.
    sed 's/^cyclic_placement = .*//' "$machine" >"$machine.cyclic"
    echo "cyclic_placement = 1" >>"$machine.cyclic"
    scripts/cluster/cluster.sh run --name "$A2D_CLUSTER" --cyclic "$a2d" bench --json --backward \
      --algo "$algos" --machine-file "$machine.cyclic" --warmup 1 --iters "$iters" \
      "${problem[@]}" --timeout 600 |
      sed 's/^{/{"placement": "round-robin", /' >>"$rows"
  fi
  load_after=$(cut -d' ' -f1-3 /proc/loadavg)
  cpu_after=$(head -1 /proc/stat)
  python3 - "$p" "$s" "$rate" "$link" "$load_before" "$load_after" "$plan" "$machine" \
    "$command_line" "$rows" "$cpu_before" "$cpu_after" >>"$out" <<'PY'
import json, sys
p, s, rate, link, before, after, plan, machine, command, rows = sys.argv[1:11]
# The machine's CPU time over the configuration's benches (every process, ours and others'):
# shares of user, system, softirq (the emulated network's stack runs there) and idle.
ticks = [[int(x) for x in line.split()[1:8]] for line in sys.argv[11:13]]
delta = [b - a for a, b in zip(*ticks)]
spent = sum(delta) or 1
cpu = {"user": (delta[0] + delta[1]) / spent, "system": delta[2] / spent,
       "softirq": (delta[5] + delta[6]) / spent, "idle": (delta[3] + delta[4]) / spent}
plan = json.loads(plan)
config = {"P": int(p), "slots": int(s), "rate_mbit": int(rate), "link": link,
          "load_before": before, "load_after": after, "command": command,
          "plan_algo": plan["algo"], "plan_grid": plan["grid"],
          "plan_kv_transpose": plan["kv_transpose"], "plan_placement": plan["placement"],
          "machine_file": open(machine).read(), "cpu_shares": cpu}
for line in open(rows):
    if line.startswith("{"):
        row = json.loads(line)
        row.update(config)
        print(json.dumps(row))
PY
  rm -f "$rows"
}
if [ "${1:-}" = __one ]; then
  shift
  one "$@"
  exit
fi

for p in $ps; do
  for s in $slots_list; do
    hosts=$((p / s))
    if [ $((hosts * s)) -ne "$p" ] || [ "$hosts" -lt 2 ]; then
      echo "cluster_bench: skip P=$p with $s per host (needs at least two hosts)" >&2
      continue
    fi
    for rate in $rates; do
      echo "cluster_bench: P=$p, $hosts hosts x $s, ${rate} Mbit/s per $link ($(date -u +%T), load $(cut -d' ' -f1 /proc/loadavg))" >&2
      scripts/cluster/cluster.sh with --hosts "$hosts" --slots "$s" --rate "${rate}mbit" --link "$link" \
        --a2d "$a2d" -- "$0" --ps "$p" --seq "$seq" --heads "$heads" --head-dim "$head_dim" \
        --iters "$iters" --link "$link" --hybrid "$hybrid" --out "$out" --a2d "$a2d" \
        __one "$p" "$s" "$rate" ||
        echo "cluster_bench: P=$p S=$s rate=$rate FAILED" >&2
    done
  done
done
