#!/usr/bin/env bash
# The table of issue 38 (docs/performance.md): the CPU kernels beside OpenBLAS cblas_sgemm on the
# same core in the same run, as ratios to a square sgemm, for every fast kernel path the CPU has.
#   scripts/kernel_sgemm_table.sh [BUILD_DIR] [INVOCATIONS] [PATHS]
# BUILD_DIR defaults to build/, INVOCATIONS to 3, PATHS to the fast paths this CPU supports
# (a space-separated list of avx2, avx512, portable). One thread on CPU 1 (taskset) unless a row
# says 2 threads (CPUs 0-1). Rows:
#   sgemm            build/bench/a2d_tile_gemm --shapes: 2048^3, and attention's two products at
#                    N = 4096, D = 128: S = Q K^T (4096 x 4096 x 128, B transposed) and O = P V
#                    (4096 x 128 x 4096); best of 5 tries per invocation
#   kernels          a2d kernel --seq 4096 --heads 8 --backward --warmup 1 --repeats 3 --json
#                    (forward and backward, each the median of 3 runs): fp32 D = 128 without
#                    mask and causal, D = 64, bf16 and fp16 inputs at D = 128, 2 threads
# Every row is the best of INVOCATIONS invocations (other work on a shared machine only ever
# slows a run down); every invocation is printed to stderr as JSON. Needs the a2d_tile_gemm
# benchmark, which CMake builds where it finds OpenBLAS (scripts/setup.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
invocations=${2:-3}
paths=${3:-}
a2d="$build/a2d"
gemm="$build/bench/a2d_tile_gemm"
[ -x "$gemm" ] || { echo "kernel_sgemm_table: $gemm is missing (OpenBLAS not found at configure)" >&2; exit 1; }
if [ -z "$paths" ]; then
  for path in avx2 avx512; do
    if "$a2d" kernel --path "$path" --seq 8 --heads 1 --head-dim 8 --warmup 0 --repeats 1 \
      >/dev/null 2>&1; then
      paths="$paths $path"
    fi
  done
fi
export OMP_PROC_BIND=close OMP_PLACES=cores OPENBLAS_NUM_THREADS=1

rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for ((i = 0; i < invocations; ++i)); do
  taskset -c 1 "$gemm" --seconds 2 --shapes 2048x2048x2048,4096x4096x128t,4096x128x4096 |
    tee -a "$rows" >&2
done
for path in $paths; do
  # dim dtype mask threads
  for config in "128 fp32 none 1" "128 fp32 causal 1" "64 fp32 none 1" "128 bf16 none 1" \
    "128 fp16 none 1" "128 fp32 none 2"; do
    read -r dim dtype mask threads <<<"$config"
    cpus=$([ "$threads" = 1 ] && echo 1 || echo 0-1)
    for ((i = 0; i < invocations; ++i)); do
      taskset -c "$cpus" "$a2d" kernel --path "$path" --seq 4096 --heads 8 --head-dim "$dim" \
        --dtype "$dtype" $([ "$mask" = causal ] && echo --causal) --backward \
        --threads "$threads" --warmup 1 --repeats 3 --json | tee -a "$rows" >&2
    done
  done
done

model=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
family=$(lscpu | sed -n 's/^CPU family: *//p' | head -1)
cpu_model=$(lscpu | sed -n 's/^Model: *//p' | head -1)
l2=$(lscpu | sed -n 's/^L2 cache: *//p' | head -1)
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512bw|avx512dq|avx512vl|avx512_bf16)$' | tr '\n' ' ')
python3 - "$rows" "$model (family $family, model $cpu_model), L2 $l2" "$flags" "$invocations" <<'PYEOF'
import json
import sys

rows_file, cpu, flags, invocations = sys.argv[1:5]
gemm, kern = {}, {}
for line in open(rows_file):
    row = json.loads(line)
    if "product" in row:
        key = row["product"]
        if key not in gemm or row["gflops"] > gemm[key]["gflops"]:
            gemm[key] = row
        continue
    key = (row["path"], row["mode"], row["head_dim"], row["dtype"], row["causal"], row["threads"])
    if key not in kern or row["gflops"] > kern[key]["gflops"]:
        kern[key] = row

square = gemm["2048x2048x2048"]["gflops"]
paths = sorted({k[0] for k in kern}, key=lambda p: ["portable", "avx2", "avx512"].index(p))
print(f"CPU: {cpu}; flags: {flags.strip()}")
print(f"BLAS: {gemm['2048x2048x2048']['blas']} kernels, 1 thread; "
      f"best of {invocations} invocations per row")
print()
header = "| | " + " | ".join(f"{p} GFLOP/s | {p} ratio" for p in paths) + " |"
print(header)
print("|---|" + "---|---|" * len(paths))

def gemm_row(name, key):
    g = gemm[key]["gflops"]
    cells = " | ".join(f"{g:.1f} | {g / square:.2f}" for _ in paths)
    print(f"| {name} | {cells} |")

gemm_row("OpenBLAS sgemm 2048³ (ratio: × square sgemm)", "2048x2048x2048")
gemm_row("OpenBLAS sgemm 4096×4096×128, Bᵀ (S = Q Kᵀ)", "4096x4096x128t")
gemm_row("OpenBLAS sgemm 4096×128×4096 (O = P V)", "4096x128x4096")

def get(path, mode, dim=128, dtype="fp32", causal=False, threads=1):
    return kern.get((path, mode, dim, dtype, causal, threads))

def kernel_row(name, mode, **kw):
    cells = []
    for p in paths:
        r = get(p, mode, **kw)
        cells.append(f"{r['gflops']:.1f} | {r['gflops'] / square:.2f}" if r else " | ")
    print(f"| a2d {name} (ratio: × square sgemm) | " + " | ".join(cells) + " |")

def ratio_row(name, mode, over, **kw):
    cells = []
    for p in paths:
        r, base = get(p, mode, **kw), get(p, mode, **over)
        cells.append(f" | {r['gflops'] / base['gflops']:.2f}" if r and base else " | ")
    print(f"| a2d {name} | " + " | ".join(cells) + " |")

for mode in ("forward", "backward"):
    kernel_row(f"{mode}, D = 128", mode)
    ratio_row(f"{mode}, causal, D = 128 (ratio: × non-causal)", mode, {}, causal=True)
    kernel_row(f"{mode}, D = 64", mode, dim=64)
    for dtype in ("bf16", "fp16"):
        ratio_row(f"{mode}, {dtype} inputs, D = 128 (ratio: × fp32)", mode, {}, dtype=dtype)
    ratio_row(f"{mode}, 2 threads, D = 128 (ratio: × 1 thread)", mode, {}, threads=2)
PYEOF
