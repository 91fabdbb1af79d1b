#!/usr/bin/env bash
# Trust the simulator (docs/simulation.md, "The simulator against a measurement"): the same
# problems measured on an emulated cluster (scripts/cluster/cluster.sh: hosts in network namespaces, one
# rank each, links shaped to 100 Mbit/s) and simulated in SimGrid on a platform that describes
# that cluster (sim/make_platforms.py --cluster: its machine file's link rate and measured
# message latency) with the kernels' measured rates (the same machine file: a2d calibrate across
# the cluster), phase by phase. Both run the engine's schedule with the sleep wait policy the
# cluster uses (its rings of sends for the blocking collectives).
#
#   scripts/sim/sim_trust.sh [--out docs/sim/trust.jsonl]      (about 10 minutes here; root)
#   sim/report.py trust docs/sim/trust.jsonl
#
# Configurations: P = 4 hosts, N = 4096 and P = 16 hosts, N = 8192; H = Hkv = 4, D = 64, causal,
# fp32; ATTENTION2D-NO and -O on the square grid, Ring Attention (zigzag), all-gather K/V, and
# Ulysses where P divides the heads. Measured: a2d bench, 1 warm-up and 2 timed rounds, the
# slowest rank's median per phase. The cluster's platform and machine file are kept beside OUT
# (docs/sim/trust/), the load average before and after each side in every line.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=docs/sim/trust.jsonl a2d=build/a2d
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

one() {  # inside `cluster.sh with`: measure, then simulate, one configuration
  local p=$1 n=$2 side=$3 out=$4 keep machine rows sims load_measure load_sim name
  machine=$A2D_CLUSTER_DIR/machine.txt
  keep=$(dirname "$out")/trust
  name=cluster-${p}x1
  mkdir -p "$keep"
  cp "$machine" "$keep/$name.machine"
  local problem=(--seq "$n" --heads 4 --kv-heads 4 --head-dim 64 --causal --dtype fp32)
  local algos=attention2d,attention2d-overlap,ring,allgather-kv plans
  plans="attention2d:${side}x$side,attention2d-overlap:${side}x$side,ring,allgather-kv"
  if [ $((4 % p)) -eq 0 ]; then algos=$algos,ulysses plans=$plans,ulysses; fi
  rows=$(mktemp) sims=$(mktemp)
  load_measure=$(cut -d' ' -f1-3 /proc/loadavg)
  scripts/cluster/cluster.sh run --name "$A2D_CLUSTER" "$a2d" bench --json --backward \
    --machine-file "$machine" --warmup 1 --iters 2 "${problem[@]}" --timeout 600 \
    --algo "$algos" --grid "${side}x$side" >"$rows"
  load_sim=$(cut -d' ' -f1-3 /proc/loadavg)
  # The platform of this cluster, from its machine file (sim/platforms/cluster-Px1.xml).
  python3 sim/make_platforms.py --cluster "$machine" --hosts "$p" --name "$name"
  cp "sim/platforms/$name.xml" "$keep/"
  local permute sum
  permute=$(sed -n 's/^permute_gbs = //p' "$machine")
  sum=$(sed -n 's/^sum_gbs = //p' "$machine")
  # Copies at the measured reordering rate (bytes read + written), sums at the measured rate.
  A2D_MPI_WAIT=sleep sim/run.sh --platform "$name" -np "$p" -- --machine-file "$machine" \
    --memory-gbs "$(python3 -c "print(2 * ${permute:-0})")" --host-reduction-gbs "${sum:-0}" \
    "${problem[@]}" --backward --plans "$plans" --json >"$sims"
  local after
  after=$(cut -d' ' -f1-3 /proc/loadavg)
  local command=scripts/sim/sim_trust.sh
  scripts/report.py --json \
    --rows "$rows" --set source=measured --set "load_before=$load_measure" \
    --set "load_after=$load_sim" --set "command=$command" \
    --rows "$sims" --set source=simulated --set "load_before=$load_sim" \
    --set "load_after=$after" --set "command=$command" >>"$out"
  rm -f "$rows" "$sims"
}

if [ "${1:-}" = __one ]; then
  shift
  one "$@"
  exit
fi
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --a2d) a2d=$2; shift 2 ;;
    *) echo "sim_trust: unknown option '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$(dirname "$out")"
out=$(realpath -m "$out")
: >"$out"
start=$(date +%s)
for config in "4 4096 2" "16 8192 4"; do
  read -r p n side <<<"$config"
  echo "sim_trust: P=$p N=$n ($(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  scripts/cluster/cluster.sh with --hosts "$p" --rate 100mbit --link host --a2d "$a2d" -- \
    "$0" __one "$p" "$n" "$side" "$out"
done
echo "sim_trust: $(wc -l <"$out") rows in $(( $(date +%s) - start )) s; $out" >&2
