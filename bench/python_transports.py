"""The Python package's two transports side by side in one job: the same processes, the same
problem, forward + backward timed alternately over MPI (comm=MPI.COMM_WORLD) and over the Gloo
mesh a torch.distributed group brings (group=dist.group.WORLD).

    mpirun -np 4 --bind-to core python3 bench/python_transports.py [--seq 4096] [--rounds 7]

Run under mpirun (it starts torch.distributed's gloo group itself, from Open MPI's rank
variables). Each round times one call of each transport (after a warm-up of both), the time of
a call being the slowest rank's; prints the medians, min/avg/max over the ranks of the median
round, and the ratio gloo / mpi."""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from mpi4py import MPI

import attention2d

parser = argparse.ArgumentParser()
parser.add_argument("--seq", type=int, default=4096)
parser.add_argument("--heads", type=int, default=8)
parser.add_argument("--kv-heads", type=int, default=8)
parser.add_argument("--head-dim", type=int, default=64)
parser.add_argument("--algo", default="attention2d")
parser.add_argument("--layout", default=None,
                    help="the shards' layout (default: the plan's own, no exchange)")
parser.add_argument("--rounds", type=int, default=7)
parser.add_argument("--warmup", type=int, default=2)
args = parser.parse_args()

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
port = comm.bcast(29500 + os.getpid() % 1000 if rank == 0 else None)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                  WORLD_SIZE=str(size))
dist.init_process_group("gloo")

lay = attention2d.layout(seq=args.seq, heads=args.heads, kv_heads=args.kv_heads,
                         head_dim=args.head_dim, causal=True, algo=args.algo, comm=comm)
layout = lay if args.layout is None else args.layout
if args.layout is None:
    tokens = torch.from_numpy(lay.tokens())
else:
    tokens = attention2d.shard(torch.arange(args.seq)[None], args.layout, comm=comm)[0]
gen = torch.Generator().manual_seed(1)
n = len(tokens)
q = torch.randn(1, n, args.heads, args.head_dim, generator=gen, requires_grad=True)
k = torch.randn(1, n, args.kv_heads, args.head_dim, generator=gen, requires_grad=True)
v = torch.randn(1, n, args.kv_heads, args.head_dim, generator=gen, requires_grad=True)
d_out = torch.randn(1, n, args.heads, args.head_dim, generator=gen)
transports = {"mpi": dict(comm=comm), "gloo": dict(group=dist.group.WORLD)}


def one_call(where):
    comm.Barrier()
    start = time.perf_counter()
    out = attention2d.attention(q, k, v, causal=True, algo=args.algo, layout=layout, **where)
    out.backward(d_out)
    mine = time.perf_counter() - start
    return comm.allgather(mine)


times = {name: [] for name in transports}
for round_ in range(args.warmup + args.rounds):
    for name, where in transports.items():
        per_rank = one_call(where)
        if round_ >= args.warmup:
            times[name].append(per_rank)
if rank == 0:
    print("forward + backward, %s, N = %d, H = %d:%d, D = %d, causal, %d ranks, layout %s, "
          "%d rounds (slowest rank per call)" % (args.algo, args.seq, args.heads, args.kv_heads,
                                                 args.head_dim, size, args.layout or "plan's",
                                                 args.rounds))
    medians = {}
    for name, rounds in times.items():
        slowest = [max(r) for r in rounds]
        medians[name] = statistics.median(slowest)
        middle = rounds[slowest.index(sorted(slowest)[len(slowest) // 2])]
        print("  %-5s median %.4f s  (min %.4f)  ranks of the median round: min %.4f avg %.4f "
              "max %.4f" % (name, medians[name], min(slowest), min(middle),
                            sum(middle) / len(middle), max(middle)))
    print("  gloo / mpi = %.3f" % (medians["gloo"] / medians["mpi"]))
dist.destroy_process_group()
