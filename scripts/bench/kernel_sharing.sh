#!/usr/bin/env bash
# How the forward kernel's time depends on a call's shape when ranks share cores: three calls of
# (nearly) equal score entries -- the calibration's block (1024 x 1024), a tall one (4096 queries
# x 256 keys, as ATTENTION2D-NO 1 x 16 runs at N = 4096, P = 16) and a wide one (256 x 4096, as
# all-gather K/V and 16 x 1 run) -- each timed alone and as PROCS concurrent processes bound
# round-robin to the machine's cores (16 on 2 cores: 8 per core, as the bench's P = 16), the
# shapes in turn for ROUNDS rounds. Unmasked, 8 heads, D = 64. Prints the median call time
# (median over the processes) and each shape's time over the block's of the same round.
#   scripts/bench/kernel_sharing.sh [A2D_BINARY]      (PROCS=16 ROUNDS=2 by default)
set -euo pipefail
cd "$(dirname "$0")/../.."
a2d=${1:-build/a2d}
procs=${PROCS:-16}
rounds=${ROUNDS:-2}
cores=$(nproc)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
shapes=("1024 1024" "4096 256" "256 4096")

time_shape() {  # $1 queries, $2 keys, $3 processes -> median ms over the processes
  local i
  for ((i = 0; i < $3; ++i)); do
    taskset -c $((i % cores)) "$a2d" kernel --seq "$1" --kv-seq "$2" --heads 8 --head-dim 64 \
      --repeats 11 --json > "$work/$i.json" &
  done
  wait
  for ((i = 0; i < $3; ++i)); do head -n 1 "$work/$i.json"; done |
    scripts/report.py --rows - --summary '"%.1f" % median([r["ms"] for r in rows])'
}

echo "| round | processes | 1024 x 1024 ms | 4096 x 256 ms | / block | 256 x 4096 ms | / block |"
echo "|---|---|---|---|---|---|---|"
for ((round = 1; round <= rounds; ++round)); do
  for n in 1 "$procs"; do
    t=()
    for shape in "${shapes[@]}"; do
      read -r q k <<< "$shape"
      t+=("$(time_shape "$q" "$k" "$n")")
    done
    python3 -c "
b, tall, wide = ${t[0]}, ${t[1]}, ${t[2]}
print('| $round | $n | %.1f | %.1f | %.2f | %.1f | %.2f |' % (b, tall, tall / b, wide, wide / b))"
  done
done
