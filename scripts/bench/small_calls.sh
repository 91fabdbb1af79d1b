#!/usr/bin/env bash
# Small calls by transport (docs/benchmarks.md, "Small calls by transport"): what a call that
# moves little costs over MPI and over Gloo, side by side in one run, at 2 ranks:
#   decode  a2d decode --prompt 1000 --steps 50 --heads 4 --head-dim 32: the median over the steps
#           of the slowest rank's step (one 544-byte exchange each);
#   run     a2d run --seq 128 --heads 4 --head-dim 32 --causal --backward, 5 warm-up and 51 timed
#           iterations: the median of the slowest rank's forward and backward;
#   python  attention2d.attention forward + backward at 64 tokens per rank (N = 128, heads 4,
#           head_dim 32, causal, the plan's layout: bench/python/paths.py, 5 warm-up and 51 timed
#           iterations, the slowest rank's): over MPI (mpiexec, mpi4py) and over a torch gloo
#           group (scripts/launch/launch.py) with its two transports, the group's own operations
#           ("group") and the engine's own Gloo mesh ("mesh").
# a2d runs under plain mpirun (Open MPI binds each of the 2 ranks to a core); the torch launcher
# binds nothing. With BEFORE_DIR (another build, of an earlier commit), its Gloo rows run too, in
# the same rounds, for the ratios before and after a change. Every round runs every configuration
# once, in turn; the table gives the median over the rounds and each ratio to MPI (this build's).
#   scripts/bench/small_calls.sh [ROUNDS] [BUILD_DIR] [BEFORE_DIR]     defaults: 5 build (none)
# Build directories are absolute or relative to the repository; each built with the venv's
# interpreter (scripts/venv.sh; scripts/build.sh DIR [-DPython_EXECUTABLE=...]).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rounds=${1:-5}
builds=("$(realpath "${2:-build}")")
names=(after)
if [[ -n ${3:-} ]]; then
  builds+=("$(realpath "$3")")
  names+=(before)
fi
python=${A2D_PYTHON:-$PWD/.venv/bin/python}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
decode=(decode --prompt 1000 --steps 50 --heads 4 --head-dim 32 --json)
run=(run --seq 128 --heads 4 --head-dim 32 --causal --backward --warmup 5 --iters 51 --json)
paths=(bench/python/paths.py --seq 128 --heads 4 --kv-heads 4 --head-dim 32 --causal --shards plan
       --warmup 5 --iters 51)
# One JSON line per measurement: {"what", "transport", "build", ...the command's own fields}
# (paths.py's lines carry their own "transport", mpi, group or mesh, which JSON's last key keeps).
tag() { sed -n "s/^{/{\"what\": \"$1\", \"transport\": \"$2\", \"build\": \"$3\", /p"; }
echo "small_calls.sh: $rounds rounds, builds: ${builds[*]}; $(lscpu | sed -n 's/^Model name: *//p')," \
  "$(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$rounds"); do
  for what in decode run; do
    declare -n args=$what
    timeout 300 mpirun -np 2 "${builds[0]}/a2d" "${args[@]}" --comm mpi | tag "$what" mpi after \
      >> "$out/rows"
    for i in "${!builds[@]}"; do
      timeout 300 mpirun -np 2 "${builds[$i]}/a2d" "${args[@]}" --comm gloo |
        tag "$what" gloo "${names[$i]}" >> "$out/rows"
    done
    unset -n args
  done
  PYTHONPATH=${builds[0]}/python timeout 300 mpiexec -np 2 "$python" "${paths[@]}" |
    tag python mpi after >> "$out/rows"
  for i in "${!builds[@]}"; do
    PYTHONPATH=${builds[$i]}/python timeout 300 "$python" scripts/launch/launch.py --nproc 2 -- \
      "$python" "${paths[@]}" --transport group mesh | tag python gloo "${names[$i]}" >> "$out/rows"
  done
  echo "small_calls.sh: round $round done; load: $(cut -d' ' -f1-3 /proc/loadavg)"
done
"$python" - "$out/rows" "$rounds" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
rounds = int(sys.argv[2])
before = any(r["build"] == "before" for r in rows)


def values(what, transport, build, field):
    return [field(r) if callable(field) else r[field] for r in rows
            if r["what"] == what and r["transport"] == transport and r["build"] == build]


both = lambda r: r["fwd_ms"] + r["bwd_ms"]
measures = [
    ("a2d decode, ms per step", "decode", "step_ms_median", "gloo"),
    ("a2d run N = 128, forward ms", "run", "fwd_ms", "gloo"),
    ("a2d run N = 128, backward ms", "run", "bwd_ms", "gloo"),
    ("Python N = 128, forward + backward ms, torch group's operations", "python", both, "group"),
    ("Python N = 128, forward + backward ms, engine's Gloo mesh", "python", both, "mesh"),
]
head = "| what | MPI | Gloo | Gloo / MPI |" + (" Gloo before | before / MPI |" if before else "")
print("\n" + head)
print("|---|---:|---:|---:|" + ("---:|---:|" if before else ""))
for label, what, field, gloo in measures:
    mpi = statistics.median(values(what, "mpi", "after", field))
    after = statistics.median(values(what, gloo, "after", field))
    line = "| %s | %.3f | %.3f | %.2f |" % (label, mpi, after, after / mpi)
    if before:
        old = statistics.median(values(what, gloo, "before", field))
        line += " %.3f | %.2f |" % (old, old / mpi)
    print(line)
print("\nmedians over %d rounds; each round's values:" % rounds)
for label, what, field, gloo in measures:
    for name, transport, build in (("mpi", "mpi", "after"), (gloo, gloo, "after"),
                                   (gloo + " before", gloo, "before")):
        if build == "before" and not before:
            continue
        print("  %s, %s: %s" % (label, name, ", ".join(
            "%.3f" % v for v in values(what, transport, build, field))))
PY
echo "small_calls.sh: load after: $(cut -d' ' -f1-3 /proc/loadavg)"
