"""The tuned GEMM the bf16 kernel paths are compared with: torch's bf16 matmul (oneDNN's brgemm
on this CPU's bf16 instructions: AMX tiles or AVX512-BF16; ONEDNN_VERBOSE=1 names the one it
picked) on one thread, beside attention2d's own peak probe of those instructions.

  .venv/bin/python bench/python/bf16_gemm.py [--sizes 1024 2048 4096] [--iters 5]

Prints one line per product, the median GFLOP/s of ITERS timed runs after a warm-up: square
n x n x n products, and the attention-shaped 4096 x 128 x 4096 (S = Q K^T at D = 128) and
4096 x 4096 x 128 (O = P V).
"""

import argparse
import statistics
import subprocess
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--sizes", type=int, nargs="*", default=[1024, 2048, 4096])
parser.add_argument("--iters", type=int, default=5)
parser.add_argument("--threads", type=int, default=1)
args = parser.parse_args()
torch.set_num_threads(args.threads)


def rate(m, k, n):
    a = torch.randn(m, k).to(torch.bfloat16)
    b = torch.randn(k, n).to(torch.bfloat16)
    a @ b
    times = []
    for _ in range(args.iters):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2.0 * m * k * n / statistics.median(times) / 1e9


cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines()
              if line.startswith("Model name")), "unknown CPU")
print(f"CPU: {model}; torch {torch.__version__}, {args.threads} thread(s); bf16 a @ b")
for n in args.sizes:
    print(f"{n} x {n} x {n}: {rate(n, n, n):.0f} GFLOP/s")
print(f"4096 x 128 x 4096 (Q K^T, D 128): {rate(4096, 128, 4096):.0f} GFLOP/s")
print(f"4096 x 4096 x 128 (P V, D 128): {rate(4096, 4096, 128):.0f} GFLOP/s")
