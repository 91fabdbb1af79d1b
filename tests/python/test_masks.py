"""flash-attn's two-sided windows (window_size=(left, right)) and MagiAttention's range masks
(mask=attention2d.ranges(q_ranges, k_ranges, attn_type_map)) through attention() and the
flash-attn entries, against an fp64 reference with the same visibility matrix: O, LSE, dQ, dK, dV
for every algorithm the rank count allows; rows that see no key; the engine cache keyed by the
mask; and the refusals, on every rank."""

import operator

import numpy as np
import pytest
import torch

import attention2d
from attention2d import _core
from conftest import COMM, assert_all_ranks, full_inputs

ALGOS = list(_core.algorithm_names())  # every algorithm of the table (src/table/)
NAMES = ("out", "lse", "dq", "dk", "dv")


def window_matrix(seq, left, right):
    q = torch.arange(seq).view(-1, 1)
    k = torch.arange(seq).view(1, -1)
    mask = torch.ones(seq, seq, dtype=torch.bool)
    if left >= 0:
        mask &= k >= q - left
    if right >= 0:
        mask &= k <= q + right
    return mask


def slices_matrix(seq, slices):
    """MagiAttention's definitions: causal bottom-right, inv-causal top-left, bi-causal both."""
    mask = torch.zeros(seq, seq, dtype=torch.bool)
    for q0, q1, k0, k1, kind in slices:
        i = torch.arange(q1 - q0).view(-1, 1)
        j = torch.arange(k1 - k0).view(1, -1)
        shows = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool)
        if kind in (1, 3):
            shows &= j <= i + (k1 - k0) - (q1 - q0)
        if kind in (2, 3):
            shows &= j >= i
        mask[q0:q1, k0:k1] |= shows
    return mask


def reference(q, k, v, d_out, mask, out_dtype=torch.float32):
    """fp64 attention under a visibility matrix: out, lse [B, H, N], dq, dk, dv; a row that sees
    no key has O = 0, LSE = -inf and no gradient. The backward's delta = rowsum(dO * O) takes O
    rounded to out_dtype, as a 16-bit backward receives it (conftest.reference does the same)."""
    b, n, h, d = q.shape
    group = h // k.shape[2]
    kk, vv = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * d ** -0.5
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    empty = ~mask.any(-1)
    p = torch.exp(s - lse.masked_fill(empty, 0.0).unsqueeze(-1)).masked_fill(~mask, 0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    delta = (d_out * out.to(out_dtype).double()).sum(-1).transpose(1, 2)
    dv = torch.einsum("bhqk,bqhd->bkhd", p, d_out)
    ds = p * (torch.einsum("bqhd,bkhd->bhqk", d_out, vv) - delta.unsqueeze(-1))
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, kk) * d ** -0.5
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q) * d ** -0.5
    fold = lambda x: x.view(b, n, k.shape[2], group, d).sum(3)
    return out, lse, dq, fold(dk), fold(dv)


def run(seq, heads, kv_heads, head_dim, algo, expected_mask, dtype=torch.float32, **mask_args):
    """attention() with the mask arguments, in the plan's own layout, on inputs rounded to dtype;
    O, LSE, dQ, dK, dV against the fp64 reference on the rounded inputs, within the library's
    bounds for dtype."""
    try:
        lay = attention2d.layout(seq=seq, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                                 algo=algo, dtype=dtype, **mask_args)
    except attention2d.Error as e:  # the same on every rank: they all skip
        pytest.skip("%s cannot run this on %d ranks: %s" % (algo, COMM.Get_size(), e))
    q, k, v, d_out = full_inputs(11, 2, seq, heads, kv_heads, head_dim, dtype)
    local = [attention2d.shard(x.to(dtype), lay).requires_grad_() for x in (q, k, v)]
    # qkv_format: said, as 12:12 heads on 3 ranks hold fewer tokens per rank than heads (which
    # without it is refused as tensors in SDPA's order: test_torch_api.py).
    out, lse = attention2d.attention(*local, algo=algo, return_lse=True, layout=lay,
                                     qkv_format="bshd", **mask_args)
    out.backward(attention2d.shard(d_out.to(dtype), lay))
    expected = reference(q, k, v, d_out, expected_mask, dtype)
    tokens = torch.from_numpy(lay.tokens())
    errors = {}
    for name, got, e in zip(NAMES, [out, lse] + [x.grad for x in local], expected):
        e_local = e.index_select(2 if name == "lse" else 1, tokens)
        finite = torch.isfinite(e_local)
        same_inf = bool((got.double()[~finite] == e_local[~finite]).all())
        diff = float((got.double()[finite] - e_local[finite]).pow(2).sum())
        norm = float(e_local[finite].pow(2).sum())
        diff, norm = COMM.allreduce(diff), COMM.allreduce(norm)
        errors[name] = (diff / max(norm, 1e-300)) ** 0.5 if COMM.allreduce(same_inf, min) else 1.0
    bound = _core.output_bounds(str(dtype).replace("torch.", ""))
    for name in NAMES:
        assert_all_ranks(errors[name] <= bound[name],
                         "%s %s %s error %.3g above %.3g" % (algo, mask_args, name, errors[name],
                                                             bound[name]))
    return out, lse, local, lay


def heads_for(algo):
    """GQA 12:4, or 12:12 where Ulysses and the hybrid shard heads over a rank count that does
    not divide 4 (P = 3): every algorithm runs at every registered rank count."""
    size = COMM.Get_size()
    return (12, 4) if algo not in ("ulysses", "hybrid") or 4 % size == 0 else (12, 12)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("left,right", [(3, 2), (-1, 4), (5, -1)])
def test_two_sided_windows(algo, left, right):
    run(31, *heads_for(algo), 16, algo, window_matrix(31, left, right), window_size=(left, right))


@pytest.mark.parametrize("algo", ["attention2d", "ring"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit(algo, dtype):
    """A two-sided window and a range mask in bf16 and fp16 (head dim 80)."""
    run(29, 6, 2, 80, algo, window_matrix(29, 4, 3), dtype, window_size=(4, 3))
    run(29, 6, 2, 80, algo, slices_matrix(29, SLICES_29), dtype,
        mask=attention2d.ranges([s[:2] for s in SLICES_29], [s[2:4] for s in SLICES_29],
                                [s[4] for s in SLICES_29]))


SLICES = [(0, 12, 0, 5, 0), (0, 12, 20, 33, 2), (12, 30, 5, 9, 3), (12, 30, 12, 30, 1),
          (30, 33, 0, 33, 1)]
SLICES_29 = [(0, 7, 0, 7, 0), (7, 29, 0, 7, 0), (7, 29, 7, 29, 1), (3, 7, 20, 29, 3)]


@pytest.mark.parametrize("algo", ALGOS)
def test_range_masks(algo):
    """Slices of every type, from lists, tensors and names; and a generator."""
    as_lists = attention2d.ranges([s[:2] for s in SLICES], [s[2:4] for s in SLICES],
                                  [s[4] for s in SLICES])
    as_tensors = attention2d.ranges(torch.tensor([s[:2] for s in SLICES], dtype=torch.int32),
                                    torch.tensor([s[2:4] for s in SLICES], dtype=torch.int32),
                                    torch.tensor([s[4] for s in SLICES], dtype=torch.int32))
    names = ["full", "inv-causal", "bi-causal", "causal", "causal"]
    as_names = attention2d.ranges([s[:2] for s in SLICES], [s[2:4] for s in SLICES], names)
    assert as_lists == as_tensors == as_names
    run(33, *heads_for(algo), 16, algo, slices_matrix(33, SLICES), mask=as_tensors)
    run(33, *heads_for(algo), 16, algo, slices_matrix(33, [(0, 33, 0, 9, 0), (9, 33, 9, 33, 1)]),
        mask="prefix-lm:9")


def test_rows_without_keys_give_zero_and_minus_infinity():
    """Rows 0-2 no slice covers, rows 12-29 meet only a bi-causal slice of 18 queries and 4 keys,
    which shows nothing, and keys 9-11 no query sees."""
    slices = [(3, 12, 0, 9, 0), (12, 30, 5, 9, 3), (30, 33, 12, 33, 2)]
    out, lse, local, lay = run(33, 2, 2, 8, "ring", slices_matrix(33, slices),
                               mask=attention2d.ranges([s[:2] for s in slices],
                                                       [s[2:4] for s in slices],
                                                       [s[4] for s in slices]))
    tokens = lay.tokens()
    empty = [i for i, t in enumerate(tokens) if t < 3 or 12 <= t < 30]
    ok = all(bool((out[:, i] == 0).all()) and bool((lse[:, :, i] == float("-inf")).all())
             and bool((local[0].grad[:, i] == 0).all()) for i in empty)
    unseen = [i for i, t in enumerate(tokens) if 9 <= t < 12]
    ok = ok and all(bool((local[1].grad[:, i] == 0).all()) and bool((local[2].grad[:, i] == 0).all())
                    for i in unseen)
    assert_all_ranks(ok, "a row without keys is not O = 0, LSE = -inf, zero gradients")


def test_flash_attn_entries_take_two_sided_windows():
    seq = 29
    q, k, v, _ = full_inputs(3, 1, seq, 4, 2, 16)
    lay = attention2d.layout(kind="contiguous", seq=seq)
    local = [attention2d.shard(x.float(), lay) for x in (q, k, v)]
    out = attention2d.flash_attn_func(*local, window_size=(3, 2))
    same = attention2d.attention(*local, window_size=(3, 2), layout="contiguous")
    assert_all_ranks(torch.equal(out, same), "flash_attn_func's window_size is not attention()'s")
    # causal=True makes the right side 0, as in flash-attn.
    causal = attention2d.flash_attn_func(*local, causal=True, window_size=(3, 2))
    window = attention2d.attention(*local, causal=True, window=4, layout="contiguous")
    assert_all_ranks(torch.equal(causal, window), "causal window_size=(3, 2) is not window 4")


def test_the_engine_cache_is_keyed_by_the_mask():
    """The same shapes with another mask between calls: another result, never a stale engine."""
    seq = 25
    q, k, v, _ = full_inputs(5, 1, seq, 2, 2, 8)
    lay = attention2d.layout(kind="contiguous", seq=seq)
    local = [attention2d.shard(x.float(), lay) for x in (q, k, v)]
    results = [attention2d.attention(*local, layout="contiguous", **args)
               for args in (dict(window_size=(2, 2)), dict(window_size=(2, 3)),
                            dict(mask="prefix-lm:5"), dict(mask="prefix-lm:6"),
                            dict(mask="block-causal:5"), dict(window_size=(2, 2)))]
    # Two masks may agree on this rank's rows (prefix-lm:5 and :6 differ only in rows 0-4):
    # a pair is distinct when it differs on some rank.
    distinct = all(COMM.allreduce(not torch.equal(results[i], results[j]), op=operator.or_)
                   for i in range(5) for j in range(i + 1, 5))
    assert_all_ranks(distinct and torch.equal(results[0], results[5]),
                     "a change of mask between calls did not change the result")


def refusal(**args):
    seq = 20
    q, k, v, _ = full_inputs(2, 1, seq, 2, 2, 8)
    lay = attention2d.layout(kind="contiguous", seq=seq)
    local = [attention2d.shard(x.float(), lay) for x in (q, k, v)]
    try:
        attention2d.attention(*local, layout="contiguous", **args)
    except attention2d.Error as e:
        return str(e)
    return None


@pytest.mark.parametrize("args,expected", [
    (dict(mask=attention2d.ranges([[0, 10], [5, 20]], [[0, 10], [5, 15]])), "overlap"),
    (dict(mask=attention2d.ranges([[0, 21]], [[0, 5]])), "outside the sequence of 20 tokens"),
    (dict(mask="prefix-lm:5", causal=True), "drop causal=True"),
    (dict(mask="prefix-lm:5", cu_seqlens=[0, 10, 20]), "mask and cu_seqlens are two masks"),
    (dict(mask="prefix-lm:5", window_size=(2, 2)), "drop window_size"),
    (dict(window=3, window_size=(2, 0)), "pass window= or window_size=, not both"),
    (dict(window_size=(-2, 3)), "-1 (unbounded) or >= 0"),
    (dict(mask=42), "pass attention2d.ranges"),
])
def test_refusals(args, expected):
    message = refusal(**args)
    assert_all_ranks(message is not None and expected in message, "%s: %r" % (args, message))


def test_ranks_that_pass_different_masks_are_told():
    if COMM.Get_size() < 2:
        pytest.skip("needs two ranks")
    message = refusal(mask="prefix-lm:%d" % (5 + (COMM.Get_rank() == 1)))
    assert_all_ranks(message is not None and "mask is" in message, repr(message))
    message = refusal(window_size=(2, 2 + (COMM.Get_rank() == 1)))
    assert_all_ranks(message is not None and "window_size is" in message, repr(message))


def test_ranges_takes_magiattentions_arguments():
    r = attention2d.ranges(np.array([[0, 4], [4, 8]]), np.array([[0, 4], [0, 8]]))
    assert r.slices(8) == [(0, 4, 0, 4, 0), (4, 8, 0, 8, 0)]
    assert attention2d.ranges("block-causal:4").slices(8) == [(0, 4, 0, 4, 0), (4, 8, 0, 8, 0)]
    for bad, text in ((lambda: attention2d.ranges([[0, 4]], [[0, 4], [4, 8]]), "one of each"),
                      (lambda: attention2d.ranges([[0, 4]], [[0, 4]], ["diagonal"]),
                       "unknown slice type 'diagonal'"),
                      (lambda: attention2d.ranges([[0, 10]], [[0, 5]], [7]),
                       "unknown slice type 7"),
                      (lambda: attention2d.ranges([0, 4], [0, 4]), "list of pairs")):
        with pytest.raises(attention2d.Error, match=text):
            bad()
