"""attention2d at P = 1 against torch's own fused CPU attention (scaled_dot_product_attention,
whose CPU flash kernel torch 2 picks for these inputs: the backend is printed), side by side in one
process: kernel threads 1 and 2, fp32 and bf16, head_dim 64 and 128, N = 4096 and 16384, causal and
not, forward and backward. Each pass: one warm-up, then ITERS timed runs, the median reported; the
two implementations alternate within every configuration. Prints a markdown table (the speedup
is SDPA's time over attention2d's) and the load before and after.

  .venv/bin/python bench/python/sdpa.py [--heads 1] [--iters 2] [--seqs 4096 16384]
"""

import argparse
import os
import statistics
import time

# Nothing is set in the environment: torch and attention2d share one OpenMP runtime (the libgomp
# loaded first) and its threads, as a user's process does (bench/python/threads.py measures that
# neither slows the other; OMP_WAIT_POLICY=PASSIVE would only slow torch's many short regions).

import torch
import torch.nn.functional as F

import attention2d

parser = argparse.ArgumentParser()
parser.add_argument("--heads", type=int, default=1)
parser.add_argument("--iters", type=int, default=2)
parser.add_argument("--seqs", type=int, nargs="*", default=[4096, 16384])
parser.add_argument("--threads", type=int, nargs="*", default=[1, 2])
parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
parser.add_argument("--dims", type=int, nargs="*", default=[64, 128])
args = parser.parse_args()


def load():
    return "%.2f %.2f %.2f" % os.getloadavg()


def timed(fn, iters):
    fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def backend(q, k, v, causal):
    try:
        from torch.nn.attention import SDPBackend
        return SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=causal)).name
    except Exception as e:  # pragma: no cover - private API
        return "? (%s)" % e


print("torch %s, attention2d %s, OMP_WAIT_POLICY=%s, kernel path %s, %d heads; load before: %s"
      % (torch.__version__, attention2d.__version__, os.environ.get("OMP_WAIT_POLICY", "(unset)"),
         os.environ.get("A2D_KERNEL_PATH", "auto"), args.heads, load()))
print("\n| threads | dtype | D | N | causal | pass | SDPA ms | attention2d ms | speedup |")
print("|---|---|---|---|---|---|---|---|---|")
worst = None
backends = set()
for threads in args.threads:
    torch.set_num_threads(threads)
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for d in args.dims:
            for n in args.seqs:
                for causal in (False, True):
                    gen = torch.Generator().manual_seed(n + d)
                    q, k, v, d_out = (torch.randn(1, n, args.heads, d, generator=gen).to(dtype)
                                      for _ in range(4))
                    # Each in its own layout: SDPA [B, H, N, D], attention2d [B, N, H, D].
                    sq, sk, sv, sd = (x.transpose(1, 2).contiguous() for x in (q, k, v, d_out))
                    backends.add(backend(sq, sk, sv, causal))
                    sq, sk, sv = (x.requires_grad_() for x in (sq, sk, sv))
                    aq, ak, av = (x.clone().requires_grad_() for x in (q, k, v))

                    def sdpa():
                        return F.scaled_dot_product_attention(sq, sk, sv, is_causal=causal)

                    def ours():
                        return attention2d.attention(aq, ak, av, causal=causal, threads=threads)

                    def backward(run, dout, inputs):
                        out = run()

                        def step():
                            for x in inputs:
                                x.grad = None
                            out.backward(dout, retain_graph=True)
                        return step

                    rows = []
                    for name, fwd_sdpa, fwd_ours in (
                            ("fwd", lambda: sdpa(), lambda: ours()),
                            ("bwd", backward(sdpa, sd, (sq, sk, sv)),
                             backward(ours, d_out, (aq, ak, av)))):
                        with torch.no_grad() if name == "fwd" else torch.enable_grad():
                            t_sdpa = timed(fwd_sdpa, args.iters)
                            t_ours = timed(fwd_ours, args.iters)
                        speedup = t_sdpa / t_ours
                        worst = speedup if worst is None else min(worst, speedup)
                        print("| %d | %s | %d | %d | %s | %s | %.1f | %.1f | %.2fx |"
                              % (threads, dtype_name, d, n, causal, name, t_sdpa, t_ours,
                                 speedup), flush=True)
print("\nSDPA backends chosen: %s; smallest speedup %.2fx; load after: %s"
      % (", ".join(sorted(backends)), worst, load()))
