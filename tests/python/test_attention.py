"""attention2d.attention against an fp64 torch reference of the full sequence: O, LSE, dQ, dK, dV
for every algorithm that supports the rank count, without a mask, causal and with a causal
window, MHA and GQA 12:4 at head dim 80, an odd N that no rank count here divides, N < P, 16-bit
dtypes, numpy inputs, strided inputs and the plan cache. Bounds: harness.hpp's output_bounds
(fp32: relative Frobenius 1e-5 for every output)."""

import numpy as np
import pytest
import torch

import attention2d
from attention2d import _core
from conftest import (COMM, assert_all_ranks, full_inputs, global_max, masked_reference, reference,
                      relative_error, visible)

ALGOS = ["attention2d", "attention2d-overlap", "ring", "allgather-kv", "ulysses"]
MASKS = [(False, 0), (True, 0), (True, 5)]
HEADS = [(12, 12, 16), (12, 4, 80)]  # (heads, kv_heads, head_dim): MHA and GQA 12:4, D = 80
NAMES = ("out", "lse", "dq", "dk", "dv")


def plan_or_skip(seq, heads, kv_heads, head_dim, causal, window, algo, dtype="float32",
                 heads_parallel=None):
    try:
        return attention2d.layout(seq=seq, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                                  causal=causal, window=window, algo=algo, dtype=dtype,
                                  heads_parallel=heads_parallel)
    except attention2d.Error as e:  # the same on every rank: they all skip
        pytest.skip("%s cannot run this on %d ranks: %s" % (algo, COMM.Get_size(), e))


def run_case(seq, heads, kv_heads, head_dim, causal, window, algo, dtype=torch.float32, batch=2,
             seed=7, heads_parallel=None):
    lay = plan_or_skip(seq, heads, kv_heads, head_dim, causal, window, algo,
                       str(dtype).replace("torch.", ""), heads_parallel)
    q, k, v, d_out = full_inputs(seed, batch, seq, heads, kv_heads, head_dim, dtype)
    local = [attention2d.shard(x.to(dtype), lay).requires_grad_() for x in (q, k, v)]
    # qkv_format: said, as some cases hold fewer tokens per rank than heads (which without it
    # is refused as tensors in SDPA's order: test_torch_api.py).
    out, lse = attention2d.attention(*local, causal=causal, window=window, algo=algo,
                                     return_lse=True, layout=lay, heads_parallel=heads_parallel,
                                     qkv_format="bshd")
    out.backward(attention2d.shard(d_out.to(dtype), lay))
    expected = reference(q, k, v, d_out, causal, window,
                         out_dtype=None if dtype == torch.float32 else dtype)
    tokens = torch.from_numpy(lay.tokens())
    got = [out, lse] + [x.grad for x in local]
    errors = {}
    for name, g, e in zip(NAMES, got, expected):
        e_local = e.index_select(2 if name == "lse" else 1, tokens)
        # Relative Frobenius error of the whole tensor from every rank's squared parts.
        diff = float((g.double() - e_local).pow(2).sum())
        norm = float(e_local.pow(2).sum())
        diff, norm = COMM.allreduce(diff), COMM.allreduce(norm)
        errors[name] = (diff / max(norm, 1e-300)) ** 0.5
    bounds = _core.output_bounds(str(dtype).replace("torch.", ""))
    for name in NAMES:
        assert_all_ranks(errors[name] <= bounds[name],
                         "%s %s error %.3g above %.3g (%s)" % (algo, name, errors[name],
                                                               bounds[name], lay))
    return errors


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("causal,window", MASKS)
@pytest.mark.parametrize("heads,kv_heads,head_dim", HEADS)
def test_every_algorithm(algo, causal, window, heads, kv_heads, head_dim):
    run_case(29, heads, kv_heads, head_dim, causal, window, algo)


@pytest.mark.parametrize("heads_parallel", [1, 2, 4])
def test_hybrid_heads_parallel(heads_parallel):
    """The hybrid (U x R x C = P, the planner's grid of P / U) on causal GQA 12:4; U = 4 > Hkv = 2
    replicates the K/V heads."""
    if COMM.Get_size() % heads_parallel:
        pytest.skip("U = %d does not divide %d ranks" % (heads_parallel, COMM.Get_size()))
    lay = plan_or_skip(37, 12, 4 if heads_parallel < 4 else 2, 16, True, 0, "hybrid",
                       heads_parallel=heads_parallel)
    assert lay.plan.algorithm == "hybrid" and lay.plan.heads_parallel == heads_parallel
    run_case(37, 12, 4 if heads_parallel < 4 else 2, 16, True, 0, "hybrid",
             heads_parallel=heads_parallel)


@pytest.mark.parametrize("algo", ALGOS)
def test_fewer_tokens_than_ranks(algo):
    run_case(3, 4, 4, 8, True, 0, algo, batch=1)


@pytest.mark.parametrize("algo", ["attention2d", "ring"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit(algo, dtype):
    run_case(29, 4, 2, 32, True, 0, algo, dtype=dtype)


def test_auto_plan_and_default_layout():
    # No algo: the planner's choice, whose layout() the shards are cut by.
    seq, heads, d = 40, 4, 16
    q, k, v, _ = full_inputs(3, 1, seq, heads, heads, d)
    lay = attention2d.layout(seq=seq, heads=heads, head_dim=d, causal=True)
    out = attention2d.attention(*[attention2d.shard(x.float(), lay) for x in (q, k, v)],
                                causal=True, layout=lay)
    error = relative_error(attention2d.unshard(out, lay), reference(q, k, v, q, True)[0])
    assert_all_ranks(global_max(error) <= 1e-5, "auto plan error %.3g" % error)


def test_numpy_forward():
    seq, heads, d = 31, 2, 16
    q, k, v, _ = full_inputs(5, 1, seq, heads, heads, d)
    expected = reference(q, k, v, q, True)
    for dtype, bound in ((np.float32, 1e-5), (np.float16, _core.output_bounds("fp16")["out"])):
        lay = attention2d.layout(seq=seq, heads=heads, head_dim=d, causal=True, algo="ring",
                                 dtype=np.dtype(dtype).name)
        shards = [attention2d.shard(x.numpy().astype(dtype), lay) for x in (q, k, v)]
        out, lse = attention2d.attention(*shards, causal=True, layout=lay, return_lse=True)
        assert_all_ranks(isinstance(out, np.ndarray) and out.dtype == dtype, "numpy out dtype")
        assert_all_ranks(lse.dtype == np.float32, "numpy lse dtype")
        full = attention2d.unshard(out, lay)
        rounded = reference(*[torch.from_numpy(x.numpy().astype(dtype)).double()
                              for x in (q, k, v)], q, True)[0]
        error = relative_error(torch.from_numpy(full.astype(np.float64)), rounded)
        assert_all_ranks(global_max(error) <= bound, "numpy %s error %.3g" % (dtype, error))
    del expected


def test_numpy_in_sdpa_order():
    """numpy arrays in SDPA's order [batch, heads, tokens, head_dim] with qkv_format='bhsd': the
    output in that order, bit for bit the bshd call's, swapped."""
    seq, heads, d = 19, 2, 8
    q, k, v, _ = full_inputs(5, 1, seq, heads, heads, d)
    lay = attention2d.layout(seq=seq, heads=heads, head_dim=d, causal=True, algo="ring")
    shards = [attention2d.shard(x.numpy().astype(np.float32), lay) for x in (q, k, v)]
    bshd = attention2d.attention(*shards, causal=True, layout=lay, qkv_format="bshd")
    bhsd = attention2d.attention(*[np.swapaxes(x, 1, 2) for x in shards], causal=True, layout=lay,
                                 qkv_format="bhsd")
    assert_all_ranks(bhsd.shape == np.swapaxes(bshd, 1, 2).shape
                     and np.array_equal(bhsd, np.swapaxes(bshd, 1, 2)), "numpy bhsd")


def test_strided_inputs_match_contiguous():
    seq, heads, d = 23, 4, 16
    q, k, v, d_out = full_inputs(11, 2, seq, heads, heads, d)
    lay = attention2d.layout(seq=seq, heads=heads, head_dim=d, causal=True, algo="attention2d")
    local = [attention2d.shard(x.float(), lay) for x in (q, k, v)]
    # [B, H, n, D] storage seen as [B, n, H, D]: no copy (last dimension dense) ...
    views = [x.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for x in local]
    # ... and a last dimension with stride 2: copied before the engine sees it.
    wide = torch.zeros(local[0].shape[:3] + (2 * d,))
    wide[..., ::2] = local[0]
    strided_q = wide[..., ::2].requires_grad_()
    plain = [x.clone().requires_grad_() for x in local]
    a = attention2d.attention(*plain, causal=True, layout=lay)
    b = attention2d.attention(*views, causal=True, layout=lay)
    c = attention2d.attention(strided_q, local[1], local[2], causal=True, layout=lay)
    g = attention2d.shard(d_out.float(), lay)
    a.backward(g)
    b.backward(g)
    same = torch.equal(a, b) and torch.equal(a, c)
    same = same and all(torch.equal(x.grad, y.grad) for x, y in zip(plain, views))
    assert_all_ranks(same, "strided inputs gave other results than contiguous ones")


def test_engine_is_built_once_and_reused():
    seq, heads, d = 17, 2, 8
    q, k, v, _ = full_inputs(1, 1, seq, heads, heads, d)
    lay = attention2d.layout(seq=seq, heads=heads, head_dim=d, algo="allgather-kv")
    local = [attention2d.shard(x.float(), lay) for x in (q, k, v)]
    attention2d.attention(*local, layout=lay)
    before = len(attention2d._engine_cache._engines)
    for _ in range(3):
        attention2d.attention(*local, layout=lay)
    assert_all_ranks(len(attention2d._engine_cache._engines) == before, "a new engine per call")


def test_plan_and_model_are_plain_values():
    ranks = COMM.Get_size()
    p = attention2d.plan(seq=4096, heads=8, head_dim=64, causal=True)
    assert_all_ranks(p.algorithm in ALGOS, "plan algorithm %s" % p.algorithm)
    assert_all_ranks(p.grid[0] * p.grid[1] == ranks or p.algorithm not in ALGOS[:2], "plan grid")
    rows = attention2d.model(seq=65536, heads=32, head_dim=128, causal=True, ranks=16,
                             machine="h100-ndr")
    totals = [r["forward_s"] + r["backward_s"] for r in rows]
    # Fastest first, except that times within 1 % are a tie the planner gives to the plan with
    # less memory (kPlanTieTolerance): never slower than the next by more than that.
    assert_all_ranks(len(rows) > 3 and all(a <= b * 1.01 for a, b in zip(totals, totals[1:])),
                     "model rows not ranked")
    assert_all_ranks(all(isinstance(r["words_forward"], float) for r in rows), "words")
    best_a2d = min(r["words_forward"] for r in rows if r["algorithm"] == "attention2d")
    ring = min(r["words_forward"] for r in rows if r["algorithm"] == "ring")
    assert_all_ranks(best_a2d < ring, "ATTENTION2D sends fewer words than Ring at P = 16")


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("sinks_on,softcap", [(False, 0.0), (True, 0.0), (True, 2.5)])
def test_documents_sinks_softcap(algo, sinks_on, softcap):
    seq, heads, kv_heads, d = 37, 4, 4, 16
    cu_seqlens = [0, 1, 21, 22, 31, 37]  # one-token documents, one over half of N
    lay = None
    try:
        lay = attention2d.layout(seq=seq, heads=heads, kv_heads=kv_heads, head_dim=d, causal=True,
                                 algo=algo, cu_seqlens=cu_seqlens, sinks=sinks_on,
                                 softcap=softcap)
    except attention2d.Error as e:
        pytest.skip("%s cannot run this on %d ranks: %s" % (algo, COMM.Get_size(), e))
    q, k, v, d_out = full_inputs(17, 2, seq, heads, kv_heads, d)
    sinks = torch.linspace(-1.0, 1.5, heads, dtype=torch.float64) if sinks_on else None
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    sink_leaf = sinks.clone().requires_grad_() if sinks_on else None
    out_ref, lse_ref = masked_reference(*leaves, True, 0, cu_seqlens, sink_leaf, softcap)
    out_ref.backward(d_out)
    local = [attention2d.shard(x.float(), lay).requires_grad_() for x in (q, k, v)]
    sink_local = sinks.float().requires_grad_() if sinks_on else None
    out, lse = attention2d.attention(*local, causal=True, layout=lay, cu_seqlens=cu_seqlens,
                                     sinks=sink_local, softcap=softcap, return_lse=True)
    out.backward(attention2d.shard(d_out.float(), lay))
    tokens = torch.from_numpy(lay.tokens())
    pairs = [(out, out_ref.detach(), 1), (lse, lse_ref.detach(), 2)]
    pairs += [(x.grad, y.grad, 1) for x, y in zip(local, leaves)]
    for index, (got, expected, dim) in enumerate(pairs):
        e_local = expected.index_select(dim, tokens)
        diff = COMM.allreduce(float((got.double() - e_local).pow(2).sum()))
        norm = COMM.allreduce(float(e_local.pow(2).sum()))
        error = (diff / norm) ** 0.5
        assert_all_ranks(error <= 1e-5, "%s output %d error %.3g" % (algo, index, error))
    if sinks_on:
        total = COMM.allreduce(sink_local.grad.double())  # each rank's 1/P of the sum
        error = float((total - sink_leaf.grad).norm() / sink_leaf.grad.norm())
        assert_all_ranks(error <= 1e-5, "%s dsink error %.3g" % (algo, error))
