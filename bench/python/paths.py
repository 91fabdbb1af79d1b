"""Times attention2d's Python path, forward + backward, as `a2d run --backward` times the engine:
warm-up, then ITERS iterations; each phase's time is the slowest rank's, the median over the
iterations is reported (and min/avg/max over the ranks of that iteration), one JSON line per
configuration on rank 0. Runs under mpiexec (the MPI transport) or scripts/launch/launch.py (a torch gloo
group: --transport group or mesh, several in one run, alternating).

  python bench/python/paths.py --seq 8192 --heads 8 --kv-heads 2 --head-dim 64 --causal \
      --algo attention2d --shards plan|contiguous [--transport group mesh] [--rounds 3]

--shards plan: the plan's own layout (attention2d.layout(), no exchange: what a2d run times by
default); contiguous: each rank's slice (the engine exchanges into the plan's layout and back)."""

import argparse
import json
import os
import statistics
import time

import torch

import attention2d
from attention2d import _channel

parser = argparse.ArgumentParser()
parser.add_argument("--seq", type=int, default=8192)
parser.add_argument("--heads", type=int, default=8)
parser.add_argument("--kv-heads", type=int, default=2)
parser.add_argument("--head-dim", type=int, default=64)
parser.add_argument("--causal", action="store_true")
parser.add_argument("--algo", default="attention2d")
parser.add_argument("--grid", default=None)
parser.add_argument("--dtype", default="float32")
parser.add_argument("--shards", default="plan", choices=["plan", "contiguous", "zigzag"])
parser.add_argument("--transport", nargs="*", default=[None])
parser.add_argument("--warmup", type=int, default=1)
parser.add_argument("--iters", type=int, default=3)
parser.add_argument("--rounds", type=int, default=1)
parser.add_argument("--direct", action="store_true",
                    help="also time the engine called directly (attention2d._core.Engine's "
                    "forward and backward on preallocated tensors, no Python layer), alternating "
                    "with the Python path iteration by iteration (--shards plan)")
args = parser.parse_args()

torch_launch = "RANK" in os.environ and "OMPI_COMM_WORLD_SIZE" not in os.environ
if torch_launch:
    import torch.distributed as dist

    dist.init_process_group("gloo")
torch.set_num_threads(1)
dtype = getattr(torch, args.dtype)


def run(transport):
    if transport is not None:
        attention2d.set_transport(transport)
        attention2d.clear_cache()
    chan = _channel.channel()
    if args.shards == "plan":
        lay = attention2d.layout(seq=args.seq, heads=args.heads, head_dim=args.head_dim,
                                 kv_heads=args.kv_heads, causal=args.causal, dtype=args.dtype,
                                 algo=args.algo, grid=args.grid)
    else:
        lay = attention2d.layout(kind=args.shards, seq=args.seq)
    n = len(lay.tokens())
    gen = torch.Generator().manual_seed(chan.rank)
    q = torch.randn(1, n, args.heads, args.head_dim, generator=gen).to(dtype).requires_grad_()
    k, v = (torch.randn(1, n, args.kv_heads, args.head_dim, generator=gen).to(dtype)
            .requires_grad_() for _ in range(2))
    d_out = torch.randn(1, n, args.heads, args.head_dim, generator=gen).to(dtype)
    pinned = {} if args.shards == "plan" else {"algo": args.algo, "grid": args.grid}
    times, direct_times = [], []
    engine = None
    for it in range(args.warmup + args.iters):
        chan.allgather(None, "bench barrier")
        start = time.perf_counter()
        out = attention2d.attention(q, k, v, causal=args.causal, layout=lay if args.shards ==
                                    "plan" else args.shards, **pinned)
        middle = time.perf_counter()
        out.backward(d_out)
        end = time.perf_counter()
        q.grad = k.grad = v.grad = None
        if it >= args.warmup:
            times.append((middle - start, end - middle))
        if args.direct:
            if engine is None:  # the engine the call above made (the cache's newest)
                engine = list(attention2d._engine_cache._engines._engines.values())[-1]
                assert not engine.exchanges, "--direct needs --shards plan"
                view = attention2d._tensors._view
                qd, kd, vd = (x.detach() for x in (q, k, v))
                o, lse = torch.empty_like(qd), torch.empty(1, args.heads, n)
                grads = [torch.empty_like(x) for x in (qd, kd, vd)]
            chan.allgather(None, "bench barrier")
            start = time.perf_counter()
            engine.forward(view(qd), view(kd), view(vd), view(o), view(lse), 0)
            middle = time.perf_counter()
            engine.backward(view(qd), view(kd), view(vd), view(o), view(d_out), view(lse),
                            *(view(g) for g in grads), 0, 0)
            end = time.perf_counter()
            if it >= args.warmup:
                direct_times.append((middle - start, end - middle))
    report(chan, lay, transport, "python", times)
    if args.direct:
        report(chan, lay, transport, "engine", direct_times)


def report(chan, lay, transport, path, times):
    every = chan.allgather(times, "bench times")  # [rank][iteration] = (fwd, bwd)
    if chan.rank != 0:
        return
    row = {"path": path, "transport": transport or chan.transport.kind, "ranks": chan.size,
           "algo": args.algo, "shards": args.shards, "seq": args.seq, "heads": args.heads,
           "kv_heads": args.kv_heads, "head_dim": args.head_dim, "causal": args.causal,
           "dtype": args.dtype, "plan": lay.plan.describe() if lay.plan else args.shards}
    for phase, index in (("fwd", 0), ("bwd", 1)):
        slowest = [max(every[r][i][index] for r in range(chan.size)) for i in range(args.iters)]
        median = statistics.median(slowest)
        at = slowest.index(median) if median in slowest else 0
        ranks = [every[r][at][index] for r in range(chan.size)]
        row[phase + "_ms"] = round(median * 1e3, 3)
        row[phase + "_ms_rank_min"] = round(min(ranks) * 1e3, 3)
        row[phase + "_ms_rank_avg"] = round(sum(ranks) / len(ranks) * 1e3, 3)
        row[phase + "_ms_rank_max"] = round(max(ranks) * 1e3, 3)
    print(json.dumps(row), flush=True)


for _ in range(args.rounds):
    for transport in args.transport:
        run(transport)
if torch_launch:
    attention2d.clear_cache()
    dist.destroy_process_group()
