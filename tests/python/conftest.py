"""Helpers of the Python tests, which run under mpiexec or under scripts/launch/launch.py (torchrun's
env:// variables; torch.distributed's gloo group is then attention2d's default). Every rank runs
the same tests in the same order; tests/CMakeLists.txt registers them at fixed rank counts.

Each test's inputs are full tensors drawn from a seed (so every rank and every rank count sees
the same data), the reference is a plain fp64 attention of the full sequence, and every verdict
is reduced over the ranks before it is asserted, so all ranks pass or fail a test together and
none is left waiting in a collective."""

import functools
import operator
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist

import attention2d

# Launched by scripts/launch/launch.py (or torchrun) rather than by an MPI launcher.
TORCH_LAUNCH = "RANK" in os.environ and "OMPI_COMM_WORLD_SIZE" not in os.environ


class Ranks:
    """The tests' own collectives (verdicts, sums), over torch.distributed under the env://
    launcher and over MPI under mpiexec: the same calls either way."""

    def __init__(self):
        if TORCH_LAUNCH:
            if not dist.is_initialized():
                dist.init_process_group("gloo")
            self._gather = self._torch_gather
            self._rank, self._size = dist.get_rank(), dist.get_world_size()
        else:
            from mpi4py import MPI

            self._mpi = MPI.COMM_WORLD
            self._gather = self._mpi.allgather
            self._rank, self._size = self._mpi.Get_rank(), self._mpi.Get_size()

    def _torch_gather(self, value):
        gathered = [None] * self._size
        dist.all_gather_object(gathered, value)
        return gathered

    def Get_rank(self):
        return self._rank

    def Get_size(self):
        return self._size

    def allgather(self, value):
        return self._gather(value)

    def allreduce(self, value, op=operator.add):
        """op over every rank's value (numbers, bools or tensors), in rank order."""
        return functools.reduce(op, self._gather(value))


COMM = Ranks()


def pytest_sessionfinish(session, exitstatus):
    """Under the env:// launcher, the process group is destroyed once every rank is done: a
    process that exits with torch's Gloo group alive may end in std::terminate from Gloo's
    threads (torch 1.13; "terminate called without an active exception", exit code 134), which
    torch's documentation avoids the same way (destroy_process_group at the end of the script)."""
    if TORCH_LAUNCH and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


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
    the engine's reference does: attention2d/tools/harness.hpp)."""
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


def masked_reference(q, k, v, causal, window, cu_seqlens, sinks, softcap, scale=None):
    """fp64 autograd reference with packed documents (cu_seqlens None: one), sinks (a logit per
    head joining each row's denominator, its column dropped) and softcapping (cap * tanh(s /
    cap) before the mask); returns out [B, N, H, D] and lse [B, H, N]."""
    n, h = q.shape[1], q.shape[2]
    group = h // k.shape[2]
    kk = k.repeat_interleave(group, dim=2)
    vv = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    doc = torch.zeros(n, dtype=torch.long)
    cu_seqlens = [0, n] if cu_seqlens is None else cu_seqlens
    for d, (a, b) in enumerate(zip(cu_seqlens[:-1], cu_seqlens[1:])):
        doc[a:b] = d
    mask = visible(n, causal, window) & (doc.view(-1, 1) == doc.view(1, -1))
    s = s.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        column = sinks.view(1, h, 1, 1).expand(s.shape[0], h, n, 1)
        s = torch.cat([s, column], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))[..., :n]
    return torch.einsum("bhqk,bkhd->bqhd", p, vv), lse


def relative_error(got, expected):
    expected = expected.double()
    return float((got.double() - expected).norm() / max(float(expected.norm()), 1e-300))


def global_max(value):
    """The largest value over the ranks (every rank gets it)."""
    return COMM.allreduce(value, op=max)


def assert_all_ranks(condition, message):
    ok = COMM.allreduce(bool(condition), op=operator.and_)
    assert ok, message if condition is False else "failed on another rank: " + message


@pytest.fixture
def comm():
    return COMM
