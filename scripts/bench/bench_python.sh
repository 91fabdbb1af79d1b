#!/usr/bin/env bash
# The Python path's costs at P = 4, forward + backward, side by side in one run (docs/python.md,
# "Transport" and "Overhead"; numbers in docs/performance.md):
#   1. transports: a torch gloo group's own operations ("group") against the engine's own Gloo
#      mesh ("mesh"), on contiguous shards, alternating in one job (bench/python/paths.py);
#   2. overhead: the Python path against the engine called directly from the same processes
#      (attention2d._core.Engine on preallocated tensors: what the Python layer adds), iteration
#      by iteration, and against `a2d run` on the same problem and plan (the plan's own layout,
#      no exchange): Python under mpiexec against a2d over MPI, and Python over a torch group
#      against a2d --comm gloo (Gloo TCP both), alternating.
#   scripts/bench/bench_python.sh [SEQ] [ROUNDS]        defaults: 8192 3
# Needs the build tree (scripts/build.sh build) built with the venv's interpreter.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
seq=${1:-8192}
rounds=${2:-3}
python=${A2D_PYTHON:-$PWD/.venv/bin/python}
export PYTHONPATH=$PWD/build/python
problem=(--seq "$seq" --heads 8 --kv-heads 2 --head-dim 64 --causal --algo attention2d)
# 4 ranks on 2 cores: waiting MPI ranks yield their core rather than spin (Open MPI's default
# busy polling would take it from the ranks computing, and more from some runs than others).
mpiexec=(mpiexec -np 4 --oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "bench_python.sh: N = $seq, P = 4, heads 8, kv_heads 2, head_dim 64, causal, fp32; load: $(uptime)"
"$python" scripts/launch/launch.py --nproc 4 --timeout 1800 -- "$python" bench/python/paths.py \
  "${problem[@]}" --shards contiguous --transport group mesh --rounds "$rounds" >> "$out/transports"
for round in $(seq 1 "$rounds"); do
  "${mpiexec[@]}" build/a2d run "${problem[@]}" --backward --json --iters 3 \
    --timeout 0 | grep '^{' | sed 's/^{/{"path": "a2d", "transport": "mpi", /' >> "$out/overhead"
  "${mpiexec[@]}" "$python" bench/python/paths.py "${problem[@]}" --shards plan --direct \
    >> "$out/overhead"
  "${mpiexec[@]}" build/a2d run "${problem[@]}" --backward --json --iters 3 \
    --comm gloo --timeout 0 | grep '^{' | sed 's/^{/{"path": "a2d", "transport": "gloo", /' \
    >> "$out/overhead"
  "$python" scripts/launch/launch.py --nproc 4 --timeout 1800 -- "$python" bench/python/paths.py \
    "${problem[@]}" --shards plan --direct --transport group >> "$out/overhead"
done
echo "bench_python.sh: load after: $(uptime)"
"$python" - "$out/transports" "$out/overhead" <<'PY'
import json, statistics, sys
def rows(path):
    return [json.loads(line) for line in open(path) if line.startswith("{")]
def total(r):
    return r["fwd_ms"] + r["bwd_ms"]
def median(rs, **match):
    chosen = [total(r) for r in rs if all(r.get(k) == v for k, v in match.items())]
    return statistics.median(chosen), chosen
print("\n| what | fwd + bwd ms (median over rounds; each round's) | ratio |")
print("|---|---|---|")
t = rows(sys.argv[1])
g, gs = median(t, transport="group")
m, ms = median(t, transport="mesh")
print("| contiguous shards, group transport | %.0f (%s) | group / mesh = %.3f |"
      % (g, ", ".join("%.0f" % x for x in gs), g / m))
print("| contiguous shards, own Gloo mesh | %.0f (%s) | |" % (m, ", ".join("%.0f" % x for x in ms)))
o = rows(sys.argv[2])
for label, a2d_t, py_t in (("MPI", "mpi", "mpi"), ("Gloo TCP", "gloo", "group")):
    a, as_ = median(o, path="a2d", transport=a2d_t)
    p, ps = median(o, path="python", transport=py_t)
    e, es = median(o, path="engine", transport=py_t)
    where = "mpiexec, MPI" if py_t == "mpi" else "torch group"
    print("| a2d run, %s | %.0f (%s) | |" % (label, a, ", ".join("%.0f" % x for x in as_)))
    print("| engine called directly (%s) | %.0f (%s) | |"
          % (where, e, ", ".join("%.0f" % x for x in es)))
    print("| Python (%s), plan layout | %.0f (%s) | Python / engine = %.3f; Python / a2d = %.3f |"
          % (where, p, ", ".join("%.0f" % x for x in ps), p / e, p / a))
PY
