#!/usr/bin/env bash
# Two builds of a2d side by side on the same problems: every algorithm, run in turn with the old
# and the new binary (old, new, then new, old, ...), each run `a2d run --json` (median of its timed
# calls, slowest rank); per algorithm the median over rounds of the pairwise ratio new / old,
# forward and backward, and their spread. For checking that a change costs no speed.
#   scripts/bench/compare_binaries.sh OLD_A2D NEW_A2D [ROUNDS] [RANKS] [a2d run options...]
# Defaults: 7 rounds, 2 ranks bound to cores, N = 4096, H = 8, D = 64, causal, backward; the
# environment variable VARIANTS (';'-separated --algo arguments) picks the algorithms. Options
# the old binary does not know (--dtype, --device) must not be given.
set -euo pipefail
cd "$(dirname "$0")/../.."
old=${1:?usage: compare_binaries.sh OLD_A2D NEW_A2D [ROUNDS] [RANKS] [options...]}
new=${2:?usage: compare_binaries.sh OLD_A2D NEW_A2D [ROUNDS] [RANKS] [options...]}
rounds=${3:-7}
ranks=${4:-2}
shift $(($# < 4 ? $# : 4))
problem=("$@")
if [ ${#problem[@]} -eq 0 ]; then
  problem=(--seq 4096 --heads 8 --kv-heads 8 --head-dim 64 --causal)
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bind=(--bind-to core)
[ "$ranks" -gt "$(nproc)" ] && bind=(--oversubscribe --bind-to none)
variants=("attention2d" "attention2d-overlap" "ring --layout zigzag" "allgather-kv" "ulysses")
# VARIANTS="allgather-kv;ring --layout striped" runs only those.
if [ -n "${VARIANTS:-}" ]; then IFS=';' read -r -a variants <<<"$VARIANTS"; fi
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for ((round = 0; round < rounds; ++round)); do
  for variant in "${variants[@]}"; do
    # Which binary runs first alternates between rounds, so that a bias of the first or the second
    # run of a pair cancels.
    order=(old new)
    [ $((round % 2)) -eq 1 ] && order=(new old)
    for which in "${order[@]}"; do
      binary=$old
      [ "$which" = new ] && binary=$new
      # shellcheck disable=SC2086
      line=$(mpiexec -np "$ranks" "${bind[@]}" "$binary" run --algo $variant "${problem[@]}" \
        --backward --json --warmup 1 --iters 5)
      echo "$which $round $line" >>"$results"
    done
  done
done
python3 - "$results" "$ranks" "$rounds" "${problem[*]}" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    which, round_, text = line.split(" ", 2)
    r = json.loads(text)
    key = r["algo"] + (" " + r["grid"] if r["algo"].startswith("attention2d") else " " + r["layout"])
    runs.setdefault(key, {}).setdefault(int(round_), {})[which] = r
print(f"# {sys.argv[2]} ranks, {sys.argv[4]}, {sys.argv[3]} rounds old/new in turn")
print(f"{'algorithm':28} {'old fwd ms':>10} {'new fwd ms':>10} {'fwd new/old':>12} {'(min-max)':>13}"
      f" {'old bwd ms':>10} {'new bwd ms':>10} {'bwd new/old':>12} {'(min-max)':>13}")
for key, by_round in runs.items():
    cells = []
    for phase in ("fwd_ms", "bwd_ms"):
        old = [by_round[i]["old"][phase] for i in sorted(by_round)]
        new = [by_round[i]["new"][phase] for i in sorted(by_round)]
        ratios = [n / o for n, o in zip(new, old)]
        cells.append(f"{statistics.median(old):10.2f} {statistics.median(new):10.2f} "
                     f"{statistics.median(ratios):12.3f} {min(ratios):6.3f}-{max(ratios):6.3f}")
    print(f"{key:28} {cells[0]} {cells[1]}")
PY
