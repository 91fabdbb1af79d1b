#!/usr/bin/env bash
# Non-finite inputs: NaN and Inf reach exactly the output rows that single-device attention
# poisons (the fp64 reference's pattern; --check compares it), nothing hangs, and --check-finite
# refuses the inputs naming the first bad element and its rank.
#   run_nonfinite.sh A2D_BINARY MPIEXEC
set -euo pipefail
a2d=$1
mpiexec=$2
here=$(cd "$(dirname "$0")" && pwd)
tool="python3 $here/npy_tool.py"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "run_nonfinite.sh: $*" >&2; exit 1; }

# B=1, N=40, H=2, Hkv=1 (MQA), D=8.
$tool make "$work/q.npy" f4 1 1 40 2 8
$tool make "$work/k.npy" f4 2 1 40 1 8
$tool make "$work/v.npy" f4 3 1 40 1 8
$tool make "$work/do.npy" f4 4 1 40 2 8
$tool set "$work/q.npy" $(( ((5 * 2) + 1) * 8 + 3 )) nan   # Q (0, 5, 1, 3)
$tool set "$work/k.npy" $(( 20 * 8 + 2 )) inf              # K (0, 20, 0, 2)
$tool set "$work/v.npy" $(( 33 * 8 )) nan                  # V (0, 33, 0, 0)
inputs=(--q "$work/q.npy" --k "$work/k.npy" --v "$work/v.npy" --do "$work/do.npy" --backward)

for algo in attention2d attention2d-overlap; do
  timeout 300 "$mpiexec" --oversubscribe -np 3 "$a2d" run "${inputs[@]}" --algo "$algo" --causal \
    --check --timeout 60 --out "$work/$algo" || fail "$algo: the poisoned rows differ from the reference"
  # --check compared the poisoned pattern of every output with the reference. Spelled out for O
  # (causal): row 5 (its Q has a NaN) and every row from 33 (they see V 33) are poisoned, rows
  # 0-19 other than 5 are not (they see neither K 20 nor V 33). Rows 20-32 are poisoned where
  # q . k_20 = +inf; where it is -inf that key just gets probability 0, as in IEEE softmax.
  rows=$($tool nonfinite-rows "$work/$algo/o.npy")
  case ",$rows," in
    ,5,2[0-9]*33,34,35,36,37,38,39,) ;;
    *) fail "$algo: poisoned rows of O are $rows" ;;
  esac
done

# ATTENTION2D's cyclic shards: token 5 on rank 5 mod 3 = 2 (named, not left to the planner).
if out=$(timeout 300 "$mpiexec" --oversubscribe -np 3 "$a2d" run "${inputs[@]}" --algo attention2d \
  --check-finite 2>&1); then
  fail "--check-finite accepted NaN inputs"
fi
[ "$(echo "$out" | grep -c 'non-finite value nan in Q at (batch 0, token 5, head 1, dim 3), held by rank 2')" -eq 1 ] ||
  fail "--check-finite did not name the element and its rank, once: $out"
echo "run_nonfinite.sh: all checks passed"
