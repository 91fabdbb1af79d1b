"""One set of threads with torch: torch's own work (an MLP's forward and backward, the
non-attention part of a transformer layer) timed right after an attention call, attention2d's or
torch's SDPA, with nothing set in the environment. Per step the three variants alternate: the MLP
alone, after attention2d.attention (forward + backward), after SDPA (forward + backward). Prints
the median MLP time of each over --iters steps after one warm-up, their ratios and which OpenMP
runtimes the process has loaded (torch and attention2d share one libgomp: whichever loads first).

    PYTHONPATH=build/python .venv/bin/python bench/python/threads.py [--threads 2]
"""

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

import attention2d

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--seq", type=int, default=2048)
parser.add_argument("--heads", type=int, default=4)
parser.add_argument("--dim", type=int, default=64)
parser.add_argument("--iters", type=int, default=15)
args = parser.parse_args()

torch.set_num_threads(args.threads)
torch.manual_seed(0)
hidden = args.heads * args.dim
mlp = torch.nn.Sequential(torch.nn.Linear(hidden, 4 * hidden), torch.nn.GELU(),
                          torch.nn.Linear(4 * hidden, hidden))
x = torch.randn(args.seq, hidden, requires_grad=True)
q, k, v, d_out = (torch.randn(1, args.seq, args.heads, args.dim) for _ in range(4))


def torch_work():
    start = time.perf_counter()
    mlp(x).sum().backward()
    return time.perf_counter() - start


def ours():
    a = [t.clone().requires_grad_() for t in (q, k, v)]
    attention2d.attention(*a, causal=True, threads=args.threads).backward(d_out)


def sdpa():
    a = [t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*a, is_causal=True).backward(d_out.transpose(1, 2))


variants = {"alone": None, "after attention2d": ours, "after sdpa": sdpa}
times = {name: [] for name in variants}
for step in range(args.iters + 1):
    for name, attention in variants.items():
        if attention:
            attention()
        elapsed = torch_work()
        if step > 0:
            times[name].append(elapsed)

runtimes = sorted({line.split()[-1] for line in open("/proc/self/maps") if "gomp" in line})
print("torch %s, attention2d %s, %d threads, OMP_WAIT_POLICY=%s, GOMP_SPINCOUNT=%s; OpenMP "
      "runtimes loaded: %s; load %.2f" % (
          torch.__version__, attention2d.__version__, args.threads,
          os.environ.get("OMP_WAIT_POLICY", "(unset)"), os.environ.get("GOMP_SPINCOUNT", "(unset)"),
          ", ".join(runtimes), os.getloadavg()[0]))
print("\n| torch's MLP forward + backward | median ms | vs alone |")
print("|---|---|---|")
alone = statistics.median(times["alone"])
for name, values in times.items():
    median = statistics.median(values)
    print("| %s | %.2f | %.2fx |" % (name, median * 1e3, median / alone))
ratio = statistics.median(times["after attention2d"]) / statistics.median(times["after sdpa"])
print("\nafter attention2d / after sdpa: %.2fx" % ratio)
