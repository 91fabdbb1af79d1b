"""Helpers of the Python tests, which run under mpiexec (every rank runs the same tests in the
same order; tests/CMakeLists.txt registers them at fixed rank counts).

Each test's inputs are full tensors drawn from a seed (so every rank and every rank count sees
the same data), the reference is a plain fp64 attention of the full sequence, and every verdict
is reduced over the ranks before it is asserted, so all ranks pass or fail a test together and
none is left waiting in a collective."""

import numpy as np
import pytest
import torch
from mpi4py import MPI

import attention2d

COMM = MPI.COMM_WORLD


def full_inputs(seed, batch, seq, heads, kv_heads, head_dim, dtype=torch.float32):
    """q, k, v, d_out of the whole sequence, rounded to `dtype` (returned as float64)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq, heads, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(batch, seq, kv_heads, head_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, seq, kv_heads, head_dim, generator=gen, dtype=torch.float64)
    d_out = torch.randn(batch, seq, heads, head_dim, generator=gen, dtype=torch.float64)
    return [x.to(dtype).double() for x in (q, k, v, d_out)]


def visible(seq, causal, window):
    q = torch.arange(seq).view(-1, 1)
    k = torch.arange(seq).view(1, -1)
    mask = torch.ones(seq, seq, dtype=torch.bool)
    if causal:
        mask &= k <= q
    if window:
        mask &= k > q - window
    return mask


def reference(q, k, v, d_out, causal=False, window=0, scale=None, out_dtype=None):
    """fp64 attention of the full sequence: out, lse [B, H, N], dq, dk, dv. The backward's
    delta = rowsum(dO * O) takes O rounded to out_dtype (the O a 16-bit backward receives, as
    the engine's reference does: attention2d/harness.hpp)."""
    b, n, h, d = q.shape
    group = h // k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    kk = k.repeat_interleave(group, dim=2)
    vv = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    s = s.masked_fill(~visible(n, causal, window), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    out = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    o_for_delta = out if out_dtype is None else out.to(out_dtype).double()
    delta = (d_out * o_for_delta).sum(-1).transpose(1, 2)  # [B, H, N]
    dv = torch.einsum("bhqk,bqhd->bkhd", p, d_out)
    dp = torch.einsum("bqhd,bkhd->bhqk", d_out, vv)
    ds = p * (dp - delta.unsqueeze(-1))
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, kk) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    fold = lambda x: x.view(b, n, k.shape[2], group, d).sum(3)  # GQA: sum over the group
    return out, lse, dq, fold(dk), fold(dv)


def relative_error(got, expected):
    expected = expected.double()
    return float((got.double() - expected).norm() / max(float(expected.norm()), 1e-300))


def global_max(value):
    """The largest value over the ranks (every rank gets it)."""
    return COMM.allreduce(value, op=MPI.MAX)


def assert_all_ranks(condition, message):
    ok = COMM.allreduce(bool(condition), op=MPI.LAND)
    assert ok, message if condition is False else "failed on another rank: " + message


@pytest.fixture
def comm():
    return COMM
