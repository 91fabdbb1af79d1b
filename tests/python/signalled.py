"""A training loop that runs until it is told to stop, for tests/python/signals.sh: every rank
writes its pid to DIR/pid.RANK after the first step, then loops (forward and backward over
attention2d, torch.distributed's env:// variables, gloo; or MPI.COMM_WORLD under mpirun) until
a signal ends it.

    signalled.py DIR [STEPS]"""

import os
import sys

import torch
import torch.distributed as dist

import attention2d

directory = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1000000
mpi = "OMPI_COMM_WORLD_RANK" in os.environ  # under mpirun: attention2d over MPI.COMM_WORLD
if not mpi:
    dist.init_process_group("gloo")
rank = int(os.environ["OMPI_COMM_WORLD_RANK"]) if mpi else dist.get_rank()
torch.manual_seed(rank)
q = torch.randn(1, 256, 2, 16, requires_grad=True)
for step in range(steps):
    out = attention2d.attention(q, q, q, causal=True, layout="contiguous")
    out.sum().backward()
    if step == 0:
        with open(os.path.join(directory, "pid.%d" % rank), "w") as f:
            f.write("%d\n" % os.getpid())
if not mpi:
    dist.destroy_process_group()
