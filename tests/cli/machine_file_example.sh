#!/usr/bin/env bash
# The example machine file of docs/cost-model.md ("Machine files") is the one in the repository,
# and a2d plans with it: memory per rank, the tie at N = 2^20 won by Ring Attention's smaller
# memory, the reasons and both run lines.
#   machine_file_example.sh A2D_BINARY
set -euo pipefail
a2d=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
file=examples/machines/a100-8x8.machine
cd "$root"
doc=$(awk -v name="\`$file\`" '
  index($0, name) { found = 1 }
  found && /^```$/ { if (inside) exit; inside = 1; next }
  inside { print }' docs/cost-model.md)
if [ "$doc" != "$(cat "$file")" ]; then
  echo "machine_file_example.sh: docs/cost-model.md's copy of $file differs from the file" >&2
  diff <(printf '%s\n' "$doc") "$file" >&2 || true
  exit 1
fi
out=$("$a2d" plan --machine-file "$file" --gpus 64 --seq 1048576 --heads 32 --kv-heads 8 \
  --head-dim 128 --causal)
printf '%s\n' "$out"
for want in "dtype=bf16 (bf16: the default on GPUs)" "memory per rank: at most 80 GiB" \
  "plan: ring grid=1x64 layout=zigzag" "exposed comm" "x Ring" \
  "run it: mpirun -np 64 --npernode 8 a2d run --algo ring --layout zigzag --batch 1 --seq 1048576" \
  "or: srun --mpi=pmix_v4 -n 64 -N 8 --ntasks-per-node=8 --distribution=block a2d run"; do
  grep -qF -- "$want" <<<"$out" || { echo "machine_file_example.sh: no '$want'" >&2; exit 1; }
done
echo "machine_file_example.sh: ok"
