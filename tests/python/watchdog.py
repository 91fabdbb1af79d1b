"""Run by tests/python/watchdog.sh under mpiexec: a forward with the watchdog on, while
A2D_FAULT_STALL stalls one rank in a phase; the watchdog must end the job."""
import sys

import torch

import attention2d

attention2d.watchdog(float(sys.argv[1]))
lay = attention2d.layout(seq=256, heads=2, head_dim=16, causal=True, algo="ring")
x = torch.randn(1, len(lay.tokens()), 2, 16)
attention2d.attention(x, x, x, causal=True, layout=lay)
print("attention finished")
