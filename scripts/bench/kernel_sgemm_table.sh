#!/usr/bin/env bash
# The table of issue 38 (docs/performance.md): the CPU kernels beside OpenBLAS cblas_sgemm on the
# same core in the same run, as ratios to a square sgemm, for every fast kernel path the CPU has.
#   scripts/bench/kernel_sgemm_table.sh [BUILD_DIR] [INVOCATIONS] [PATHS] [CLOCK]
# BUILD_DIR defaults to build/, INVOCATIONS to 3, PATHS to the fast paths this CPU supports
# (a space-separated list of avx2, avx512, portable), CLOCK to wall: the rates are FLOPs over
# wall-clock time. CLOCK=cpu divides by the CPU time the process was given instead (per thread),
# for a machine so busy with other work that wall-clock rates measure the load (the table then
# says so; the load average is printed either way). One thread on CPU 1 (taskset) unless a row
# says 2 threads (CPUs 0-1). Rows:
#   sgemm            build/bench/a2d_tile_gemm --shapes: 2048^3, and attention's two products at
#                    N = 4096, D = 128: S = Q K^T (4096 x 4096 x 128, B transposed) and O = P V
#                    (4096 x 128 x 4096); best of 5 tries per invocation; OpenBLAS's own choice
#                    of kernels and, on an AVX-512 CPU, also its Haswell (AVX2) kernels
#   kernels          a2d kernel --seq 4096 --heads 8 --backward --warmup 1 --repeats 3 --json
#                    (forward and backward, each the median of 3 runs): fp32 D = 128 without
#                    mask and causal, D = 64, bf16 and fp16 inputs at D = 128, 2 threads (wall
#                    clock only); the environment variable HEADS changes --heads
# Every row is the best of INVOCATIONS invocations (other work on a shared machine only ever
# slows a run down); every invocation is printed to stderr as JSON. Needs the a2d_tile_gemm
# benchmark, which CMake builds where it finds OpenBLAS (scripts/setup.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
invocations=${2:-3}
paths=${3:-}
clock=${4:-wall}
[ "$clock" = wall ] || [ "$clock" = cpu ] || { echo "kernel_sgemm_table: CLOCK is wall or cpu" >&2; exit 2; }
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
heads=${HEADS:-8}  # HEADS=2 shortens a run 4x (the kernels work head by head)
configs=("128 fp32 none 1" "128 fp32 causal 1" "64 fp32 none 1" "128 bf16 none 1" "128 fp16 none 1")
# Two threads only on the wall clock: under CPU time, OpenMP's spinning threads would count too.
[ "$clock" = wall ] && configs+=("128 fp32 none 2")
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

# OpenBLAS picks its kernels by CPU model (0.3.21: Cooperlake, AVX-512, on Zen 5) unless
# OPENBLAS_CORETYPE says otherwise; the script times its own choice and, on an AVX-512 CPU, also
# its Haswell (AVX2) kernels, the sgemm of the AVX2 path's vector width. The faster square sgemm
# is the reference of the ratios.
coretypes=auto
grep -qw avx512f /proc/cpuinfo && coretypes="auto Haswell"

rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
# Rounds: each times every row once, so that interference from other work spreads over all rows.
for ((i = 0; i < invocations; ++i)); do
  for coretype in $coretypes; do
    if [ "$coretype" = auto ]; then unset OPENBLAS_CORETYPE; else export OPENBLAS_CORETYPE=$coretype; fi
    taskset -c 1 "$gemm" --seconds 2 --shapes 2048x2048x2048,4096x4096x128t,4096x128x4096 |
      tee -a "$rows" >&2
  done
  unset OPENBLAS_CORETYPE
  for path in $paths; do
    # dim dtype mask threads
    for config in "${configs[@]}"; do
      read -r dim dtype mask threads <<<"$config"
      cpus=$([ "$threads" = 1 ] && echo 1 || echo 0-1)
      taskset -c "$cpus" "$a2d" kernel --path "$path" --seq 4096 --heads "$heads" --head-dim "$dim" \
        --dtype "$dtype" $([ "$mask" = causal ] && echo --causal) --backward \
        --threads "$threads" --warmup 1 --repeats 3 --json | tee -a "$rows" >&2
    done
  done
done

model=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
family=$(lscpu | sed -n 's/^CPU family: *//p' | head -1)
cpu_model=$(lscpu | sed -n 's/^Model: *//p' | head -1)
l2="$(($(getconf LEVEL2_CACHE_SIZE 2>/dev/null || echo 0) / 1024)) KiB"  # per core (CPUID)
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512bw|avx512dq|avx512vl|avx512_bf16)$' | tr '\n' ' ')
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
python3 - "$rows" "$model (family $family, model $cpu_model), L2 $l2" "$flags" "$invocations" \
  "$clock" "$load_before" "$load_after" "$(nproc)" <<'PYEOF'
import json
import sys

rows_file, cpu, flags, invocations, clock, load_before, load_after, cpus = sys.argv[1:9]
rate = "gflops" if clock == "wall" else "cpu_gflops"
gemm, kern = {}, {}
for line in open(rows_file):
    row = json.loads(line)
    if "product" in row:
        key = (row["blas"], row["product"])
        row["gflops"] = row[rate]
        if key not in gemm or row["gflops"] > gemm[key]["gflops"]:
            gemm[key] = row
        continue
    key = (row["path"], row["mode"], row["head_dim"], row["dtype"], row["causal"], row["threads"])
    row["gflops"] = row[rate]
    if key not in kern or row["gflops"] > kern[key]["gflops"]:
        kern[key] = row

blases = sorted({k[0] for k in gemm})
square_blas = max(blases, key=lambda b: gemm[(b, "2048x2048x2048")]["gflops"])
square = gemm[(square_blas, "2048x2048x2048")]["gflops"]
paths = sorted({k[0] for k in kern}, key=lambda p: ["portable", "avx2", "avx512"].index(p))
print(f"CPU: {cpu}; flags: {flags.strip()}")
heads = {r["heads"] for r in kern.values()}
print(f"a2d kernel: N = 4096, H = {', '.join(map(str, sorted(heads)))}, B = 1")
print(f"BLAS: {', '.join(blases)} kernels, 1 thread; best of {invocations} invocations per row; "
      f"ratios to the square sgemm of {square_blas} ({square:.1f} GFLOP/s)")
print(f"Clock: {'wall-clock time' if clock == 'wall' else 'CPU time given to the process (per thread)'}"
      f"; load average {load_before} before, {load_after} after, on {cpus} CPUs")
print()
print("| | GFLOP/s | ratio |")
print("|---|---|---|")
for product, name in (("2048x2048x2048", "2048³ (ratio: × square sgemm)"),
                      ("4096x4096x128t", "4096×4096×128, Bᵀ (S = Q Kᵀ)"),
                      ("4096x128x4096", "4096×128×4096 (O = P V)")):
    for blas in blases:
        g = gemm[(blas, product)]["gflops"]
        print(f"| {blas} sgemm {name} | {g:.1f} | {g / square:.2f} |")

def get(path, mode, dim=128, dtype="fp32", causal=False, threads=1):
    return kern.get((path, mode, dim, dtype, causal, threads))

for path in paths:
    for mode in ("forward", "backward"):
        base = get(path, mode)
        rows = [(f"{mode}, D = 128 (ratio: × square sgemm)", base, square),
                (f"{mode}, causal, D = 128 (ratio: × non-causal)", get(path, mode, causal=True),
                 base and base["gflops"]),
                (f"{mode}, D = 64 (ratio: × square sgemm)", get(path, mode, dim=64), square)]
        for dtype in ("bf16", "fp16"):
            rows.append((f"{mode}, {dtype} inputs, D = 128 (ratio: × fp32)",
                         get(path, mode, dtype=dtype), base and base["gflops"]))
        rows.append((f"{mode}, 2 threads, D = 128 (ratio: × 1 thread)",
                     get(path, mode, threads=2), base and base["gflops"]))
        # Beside the ratio to the fastest square sgemm, the ratio to the square sgemm of the
        # kernel's own vector width where both widths were timed (avx2: OpenBLAS's AVX2 kernels).
        avx512_cores = ("SkylakeX", "Cooperlake", "SapphireRapids")
        wide_blas = [b for b in blases if b.split()[-1] in avx512_cores]
        narrow_blas = [b for b in blases if b.split()[-1] not in avx512_cores]
        width = ((wide_blas if path == "avx512" else narrow_blas) or [None])[0]
        own = gemm.get((width, "2048x2048x2048")) if len(blases) > 1 else None
        for name, row, over in rows:
            if row and over:
                extra = ""
                if own and over is square:
                    extra = f" ({row['gflops'] / own['gflops']:.2f} × {width} square)"
                print(f"| a2d {path} {name} | {row['gflops']:.1f} | "
                      f"{row['gflops'] / over:.2f}{extra} |")
if "avx2" in paths and "avx512" in paths:
    for mode in ("forward", "backward"):
        for dim in (128, 64):
            wide, narrow = get("avx512", mode, dim=dim), get("avx2", mode, dim=dim)
            if wide and narrow:
                print(f"| a2d avx512 {mode}, D = {dim} (ratio: × avx2) | {wide['gflops']:.1f} | "
                      f"{wide['gflops'] / narrow['gflops']:.2f} |")
PYEOF
