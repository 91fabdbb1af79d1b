"""What a torch 2 user met (issue 47), under scripts/launch/launch.py (torch.distributed's gloo group):
the LSE's gradient, softmax_scale values, the optional check of global positions, and the two
transports of a torch group (the group's own operations, "group"; a Gloo mesh of the engine's
own, "mesh") giving the same results. fp64 references of the whole sequence, every verdict
reduced over the ranks."""

import math

import pytest
import torch

import attention2d
from conftest import COMM, TORCH_LAUNCH, assert_all_ranks, full_inputs, masked_reference

P, RANK = COMM.Get_size(), COMM.Get_rank()
FP32 = 1e-5
pytestmark = pytest.mark.skipif(not TORCH_LAUNCH, reason="needs the torch.distributed launch")


def lse_reference(q, k, v, causal, w_lse, w_out):
    """fp64 autograd: gradients of sum(lse * w_lse) + sum(out * w_out) by q, k, v."""
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(group, 2)) * q.shape[-1] ** -0.5
    if causal:
        n = q.shape[1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v.repeat_interleave(group, 2))
    ((lse * w_lse).sum() + (out * w_out).sum()).backward()
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("only_lse", [False, True])
def test_lse_is_differentiable(layout, only_lse):
    """The LSE of return_lse carries its gradient into dQ and dK (GQA 4:2, causal, N = 37), with
    the output's (or alone: only the LSE used)."""
    seq = 37
    q, k, v, _ = full_inputs(11, 1, seq, 4, 2, 16)
    gen = torch.Generator().manual_seed(12)
    w_lse = torch.randn(1, 4, seq, generator=gen, dtype=torch.float64)
    w_out = torch.zeros(q.shape, dtype=torch.float64) if only_lse else torch.randn(
        q.shape, generator=gen, dtype=torch.float64)
    expected = lse_reference(q, k, v, True, w_lse, w_out)
    shards = [attention2d.shard(x.float(), layout).requires_grad_() for x in (q, k, v)]
    out, lse = attention2d.attention(*shards, causal=True, layout=layout, return_lse=True)
    loss = (lse * attention2d.shard(w_lse.float(), layout, dim=2)).sum()
    if not only_lse:
        loss = loss + (out * attention2d.shard(w_out.float(), layout)).sum()
    loss.backward()
    errors = []
    for shard, ref in zip(shards, expected):
        full = attention2d.unshard(shard.grad, layout)
        errors.append(float((full.double() - ref).norm() / ref.norm()))
    assert_all_ranks(max(errors) <= FP32, "%s: dQ, dK, dV errors %s" % (layout, errors))


def test_lse_gradient_with_sinks_is_refused():
    q = torch.randn(1, 5, 2, 8, requires_grad=True)
    out, lse = attention2d.attention(q, q, q, causal=True, layout="contiguous", return_lse=True,
                                     sinks=torch.zeros(2))
    with pytest.raises(attention2d.Error, match="gradient through the returned LSE"):
        lse.sum().backward()


@pytest.mark.parametrize("scale", [0.0, -0.5, math.inf, math.nan])
def test_softmax_scale_is_honoured_or_refused(scale):
    """0 (uniform attention), negative and non-finite scales are refused on every rank; a
    positive one is honoured."""
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(attention2d.Error, match="softmax_scale="):
        attention2d.attention(q, q, q, layout="contiguous", softmax_scale=scale)
    seq = 4 * P
    q, k, v, _ = full_inputs(13, 1, seq, 2, 2, 8)
    ref, _ = masked_reference(q, k, v, False, 0, None, None, 0.0, scale=0.3)
    local = [attention2d.shard(x.float(), "contiguous") for x in (q, k, v)]
    out = attention2d.unshard(attention2d.attention(*local, layout="contiguous",
                                                    softmax_scale=0.3), "contiguous")
    error = float((out.double() - ref).norm() / ref.norm())
    assert_all_ranks(error <= FP32, "softmax_scale=0.3: error %.3g" % error)


def test_positions_check_the_layout():
    """positions= (this rank's global indices) against layout=: zigzag shards called contiguous
    are refused on every rank (their counts alone agree); true positions pass."""
    seq = 4 * P + 2
    q, k, v, _ = full_inputs(14, 1, seq, 2, 2, 8)
    zig = attention2d.layout(kind="zigzag", seq=seq)
    local = [attention2d.shard(x.float(), zig) for x in (q, k, v)]
    out = attention2d.attention(*local, causal=True, layout="zigzag", positions=zig.tokens())
    ref, _ = masked_reference(q, k, v, True, 0, None, None, 0.0)
    error = float((attention2d.unshard(out, zig).double() - ref).norm() / ref.norm())
    assert_all_ranks(error <= FP32, "positions= with the right layout: error %.3g" % error)
    # A plan's Layout (ATTENTION2D's cyclic, its tokens read as runs once): its own tokens
    # pass, another order is refused.
    plan = attention2d.layout(seq=seq, heads=2, head_dim=8, causal=True, algo="attention2d")
    shards = [attention2d.shard(x.float(), plan) for x in (q, k, v)]
    out = attention2d.attention(*shards, causal=True, layout=plan, positions=plan.tokens())
    error = float((attention2d.unshard(out, plan).double() - ref).norm() / ref.norm())
    assert_all_ranks(error <= FP32, "positions= with a plan's Layout: error %.3g" % error)
    if len(plan.tokens()) > 1:
        with pytest.raises(attention2d.Error, match=r"rank \d+ holds global positions"):
            attention2d.attention(*shards, causal=True, layout=plan,
                                  positions=plan.tokens()[::-1].copy())
    if P > 1 and zig.counts() == attention2d.layout(kind="contiguous", seq=seq).counts():
        with pytest.raises(attention2d.Error, match=r"rank \d+ holds global positions"):
            attention2d.attention(*local, causal=True, layout="contiguous",
                                  positions=zig.tokens())


def test_transports_agree():
    """The group's own operations and the engine's own Gloo mesh give the same O and gradients
    (within fp32 rounding: reductions may run in another order), for Ring and ATTENTION2D."""
    if not attention2d._core.gloo_built():
        pytest.skip("a build without Gloo has the group transport only")
    seq = 5 * P + 1
    q, k, v, d_out = full_inputs(15, 1, seq, 4, 2, 16)
    results = {}
    for transport in attention2d.TRANSPORTS:
        previous = attention2d.set_transport(transport)
        try:
            for algo in ("ring", "attention2d"):
                shards = [attention2d.shard(x.float(), "zigzag").requires_grad_()
                          for x in (q, k, v)]
                out = attention2d.attention(*shards, causal=True, layout="zigzag", algo=algo)
                (out * attention2d.shard(d_out.float(), "zigzag")).sum().backward()
                results[transport, algo] = [out.detach()] + [x.grad for x in shards]
        finally:
            attention2d.set_transport(previous)
    for algo in ("ring", "attention2d"):
        for a, b in zip(results["group", algo], results["mesh", algo]):
            error = float((a - b).norm() / max(float(b.norm()), 1e-30))
            assert_all_ranks(error <= 1e-6, "%s: group vs mesh differ by %.3g" % (algo, error))
    with pytest.raises(attention2d.Error, match="transport 'tcp'"):
        attention2d.set_transport("tcp")


def test_no_copy_on_the_way_in():
    """Contiguous CPU tensors, and views whose last dimension is dense, reach the engine as they
    are (their memory, no copy); other strides are copied once; outputs are torch's tensors that
    the engine wrote (torch.empty, then filled in place)."""
    x = torch.randn(1, 6, 4, 8)
    ready = attention2d._tensors._engine_ready
    assert ready(x) is x
    heads_view = x[:, :, 1:3]  # a slice of heads: strided, last dimension dense
    assert ready(heads_view) is heads_view
    transposed = x.transpose(2, 3)  # last dimension not dense: one contiguous copy
    assert ready(transposed) is not transposed and ready(transposed).is_contiguous()
    view = attention2d._tensors._view(heads_view)
    assert view[0] == heads_view.data_ptr() and view[3] == list(heads_view.stride())


# ---------------------------------------------------------------------------------------------
# Tensors in SDPA's order (issue 57)


def test_sdpa_order_is_refused_or_taken():
    """Tensors in torch SDPA's order [batch, heads, tokens, head_dim] passed as flash-attn's
    [batch, tokens, heads, head_dim] (issue 57: output error 1.89, no message) are refused on
    every rank (MHA: shapes alone agree; GQA: the shape check names the order); with
    qkv_format='bhsd' they are exact against fp64 (O in SDPA's order, LSE, dQ, dK, dV), and
    qkv_format='bshd' takes tiny shards (fewer tokens than heads) as they are."""
    seq, heads, d = 16 * P, 4, 8
    q, k, v, d_out = full_inputs(21, 2, seq, heads, heads, d)
    sdpa = [attention2d.shard(x.float(), "contiguous").transpose(1, 2).contiguous()
            .requires_grad_() for x in (q, k, v)]
    with pytest.raises(attention2d.Error, match="qkv_format='bhsd'"):
        attention2d.attention(*sdpa, causal=True, layout="contiguous")
    gqa = [sdpa[0]] + [x[:, :2] for x in sdpa[1:]]
    with pytest.raises(attention2d.Error, match="SDPA's order"):
        attention2d.attention(*gqa, causal=True, layout="contiguous")
    with pytest.raises(attention2d.Error, match="qkv_format='sbhd'"):
        attention2d.attention(*sdpa, causal=True, layout="contiguous", qkv_format="sbhd")
    out, lse = attention2d.attention(*sdpa, causal=True, layout="contiguous", qkv_format="bhsd",
                                     return_lse=True)
    assert tuple(out.shape) == tuple(sdpa[0].shape)
    out.backward(attention2d.shard(d_out.float(), "contiguous").transpose(1, 2))
    ref_out, ref_lse = masked_reference(q, k, v, True, 0, None, None, 0.0)
    got = {"O": (attention2d.unshard(out.transpose(1, 2), "contiguous"), ref_out),
           "LSE": (attention2d.unshard(lse, "contiguous", dim=2), ref_lse)}
    full = [x.clone().requires_grad_() for x in (q, k, v)]
    (masked_reference(*full, True, 0, None, None, 0.0)[0] * d_out).sum().backward()
    for name, shard, ref in zip(("dQ", "dK", "dV"), sdpa, full):
        got[name] = (attention2d.unshard(shard.grad.transpose(1, 2), "contiguous"), ref.grad)
    errors = {name: float((a.double() - b).norm() / b.norm()) for name, (a, b) in got.items()}
    assert_all_ranks(max(errors.values()) <= FP32, "qkv_format='bhsd': errors %s" % errors)
    tiny = torch.randn(1, 2, 4, 8)
    out = attention2d.attention(tiny, tiny, tiny, layout="contiguous", qkv_format="bshd")
    assert tuple(out.shape) == (1, 2, 4, 8)
    # As many tokens on every rank as heads: either order; refused unless said.
    square = torch.randn(1, 4, 4, 8)
    with pytest.raises(attention2d.Error, match="no more tokens than heads"):
        attention2d.attention(square, square, square, layout="contiguous")


# ---------------------------------------------------------------------------------------------
# Positions read once (issue 57)


class _Counted:
    """Counts the channel's exchanges by phase while it is in place."""

    def __init__(self, chan):
        self.chan, self.phases = chan, []
        self._original = chan.allgather

    def __enter__(self):
        def counted(value, phase):
            self.phases.append(phase)
            return self._original(value, phase)

        self.chan.allgather = counted
        return self

    def __exit__(self, *exc):
        del self.chan.allgather  # the class's method again


def test_positions_are_read_once_and_changes_seen():
    """positions= costs one exchange of a summary the first time and nothing the next times with
    the same tensor (forward, backward, the next call); a tensor written in place, or another
    tensor, is read again: wrong positions are refused however they arrive."""
    seq = 6 * P + 1
    q, k, v, _ = full_inputs(22, 1, seq, 2, 2, 8)
    zig = attention2d.layout(kind="zigzag", seq=seq)
    local = [attention2d.shard(x.float(), zig).requires_grad_() for x in (q, k, v)]
    positions = torch.from_numpy(zig.tokens()).clone()
    chan = attention2d._channel.channel()
    chan.positions_memo.clear()
    with _Counted(chan) as counted:
        out = attention2d.attention(*local, causal=True, layout="zigzag", positions=positions)
        first = list(counted.phases)
        attention2d.attention(*local, causal=True, layout="zigzag", positions=positions)
        second = counted.phases[len(first):]
    assert first == ["attention() arguments", "attention() positions"], first
    assert second == ["attention() arguments"], second
    out.sum().backward()
    if P > 1:
        # The same tensor written in place: its values changed, so it is read again.
        saved = positions.clone()
        positions[0], positions[-1] = positions[-1].item(), positions[0].item()
        with pytest.raises(attention2d.Error, match=r"rank \d+ holds global positions"):
            attention2d.attention(*local, causal=True, layout="zigzag", positions=positions)
        positions.copy_(saved)
        attention2d.attention(*local, causal=True, layout="zigzag", positions=positions)
        # Another tensor with other values: read (and refused).
        shifted = positions + 1
        with pytest.raises(attention2d.Error, match=r"rank \d+ holds global positions"):
            attention2d.attention(*local, causal=True, layout="zigzag", positions=shifted)
        # A write torch's version counter does not see (through .numpy()): seen all the same.
        attention2d.attention(*local, causal=True, layout="zigzag", positions=positions)
        positions.numpy()[0] += 1
        with pytest.raises(attention2d.Error, match=r"rank \d+ holds global positions \[\d"):
            attention2d.attention(*local, causal=True, layout="zigzag", positions=positions)
    # Positions that are not integers: refused, not truncated.
    with pytest.raises(attention2d.Error, match=r"\(integers\)"):
        attention2d.attention(*local, causal=True, layout="zigzag",
                              positions=torch.from_numpy(zig.tokens()) + 0.5)
