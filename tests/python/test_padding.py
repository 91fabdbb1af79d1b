"""Padded batches: attention(..., key_padding=mask), the mask sharded like q (transformers'
attention_mask: 1 a real token, 0 padding), each row padded at its end or at its start with a
length of its own. Against a plain fp64 attention of each row's real tokens: the real queries'
outputs and every gradient on real tokens; padded queries' outputs and all gradients on padded
tokens are 0, and LSE is -inf there. And the refusals, on every rank."""

import pytest
import torch

import attention2d
from conftest import COMM, assert_all_ranks

SEQ, HEADS, KV_HEADS, HEAD_DIM = 37, 4, 2, 16
# Rows: (real tokens, padded at the start?): right padding of two lengths, left padding, a row
# without padding, and one of padding only.
ROWS = [(30, False), (11, True), (37, False), (30, False), (1, False), (0, False)]
BOUND = 1e-5  # fp32 against fp64 (the engine's kernels: kFp32RelativeBound = 1e-5)


def padding_mask():
    mask = torch.zeros(len(ROWS), SEQ, dtype=torch.bool)
    for b, (real, left) in enumerate(ROWS):
        if left:
            mask[b, SEQ - real:] = True
        else:
            mask[b, :real] = True
    return mask


def reference(q, k, v, d_out, mask, causal, window):
    """fp64: each row's real tokens alone (their positions kept), padded rows' outputs 0."""
    q, k, v, d_out = (x.double().detach().requires_grad_() for x in (q, k, v, d_out))
    group = HEADS // KV_HEADS
    outs = []
    for b in range(q.shape[0]):
        keep = mask[b]
        kk = k[b].repeat_interleave(group, dim=1)
        vv = v[b].repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[b], kk) * HEAD_DIM ** -0.5
        i = torch.arange(SEQ)
        hidden = ~keep[None, :].expand(SEQ, SEQ)
        if causal:
            hidden = hidden | (i[None, :] > i[:, None])
        if window:
            hidden = hidden | ((i[:, None] - i[None, :]).abs() > window)
        s = s.masked_fill(hidden[None], float("-inf"))
        p = torch.nan_to_num(s.softmax(-1), nan=0.0)  # rows without keys (padded queries): 0
        o = torch.einsum("hqk,khd->qhd", p, vv) * keep[:, None, None]
        outs.append(o)
    out = torch.stack(outs)
    out.backward(d_out.double())
    return out.detach(), q.grad, k.grad, v.grad


def full_inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(len(ROWS), SEQ, HEADS, HEAD_DIM), (len(ROWS), SEQ, KV_HEADS, HEAD_DIM),
              (len(ROWS), SEQ, KV_HEADS, HEAD_DIM), (len(ROWS), SEQ, HEADS, HEAD_DIM)]
    return [torch.randn(*s, generator=gen) for s in shapes]


def relative(a, b):
    return float((a.double() - b).norm() / max(float(b.norm()), 1e-30))


@pytest.mark.parametrize("causal,window,layout", [(True, None, "contiguous"),
                                                  (False, None, "zigzag"),
                                                  (False, 4, "contiguous"),
                                                  (True, None, "planned")])
def test_padded_batch_equals_each_rows_real_tokens(causal, window, layout):
    q, k, v, d_out = full_inputs(11)
    mask = padding_mask()
    ref = reference(q, k, v, d_out, mask, causal, window)
    if layout == "planned":  # the plan's own layout (a Layout: no exchange)
        layout = attention2d.layout(seq=SEQ, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                                    batch=len(ROWS), causal=causal)
        mine = torch.from_numpy(layout.tokens())
    else:
        mine = attention2d.shard(torch.arange(SEQ).view(1, SEQ), layout)[0]
    local = [x[:, mine].clone().requires_grad_() for x in (q, k, v)]
    options = dict(window_size=(window, window)) if window else dict(causal=causal)
    out, lse = attention2d.attention(*local, layout=layout, return_lse=True,
                                     key_padding=mask[:, mine], **options)
    out.backward(d_out[:, mine])
    errors = [relative(out.detach(), ref[0][:, mine])] + [
        relative(x.grad, g[:, mine]) for x, g in zip(local, ref[1:])]
    worst = COMM.allreduce(max(errors), op=max)
    assert_all_ranks(worst <= BOUND, "out/dq/dk/dv errors %s" % errors)
    padded = ~mask[:, mine]
    zero = bool((out.detach()[padded] == 0).all()) and bool(
        torch.isneginf(lse.detach().transpose(1, 2)[padded]).all())
    assert_all_ranks(zero, "padded queries: out 0 and LSE -inf")
    print("padded batch (%s, %s): worst error %.3g" % (
        layout if isinstance(layout, str) else "planned", options, worst))


def test_padding_between_tokens_is_refused_on_every_rank():
    q, k, v, _ = full_inputs(12)
    mask = padding_mask()
    mask[2, 5] = False  # a hole inside row 2
    mine = attention2d.shard(torch.arange(SEQ).view(1, SEQ), "contiguous")[0]
    with pytest.raises(attention2d.Error, match="row 2 of the batch has padding between"):
        attention2d.attention(q[:, mine], k[:, mine], v[:, mine], causal=True,
                              layout="contiguous", key_padding=mask[:, mine])


def test_a_wrong_shape_is_refused_on_every_rank():
    q, k, v, _ = full_inputs(13)
    mine = attention2d.shard(torch.arange(SEQ).view(1, SEQ), "contiguous")[0]
    # Only rank 0 passes a wrong shape; every rank gets the error.
    bad = torch.ones(len(ROWS), len(mine) + (1 if COMM.Get_rank() == 0 else 0), dtype=torch.bool)
    with pytest.raises(attention2d.Error, match="key_padding has shape"):
        attention2d.attention(q[:, mine], k[:, mine], v[:, mine], causal=True,
                              layout="contiguous", key_padding=bad)


def test_padding_on_one_rank_only_is_refused_on_every_rank():
    q, k, v, _ = full_inputs(14)
    mine = attention2d.shard(torch.arange(SEQ).view(1, SEQ), "contiguous")[0]
    mask = padding_mask()[:, mine] if COMM.Get_rank() == 0 else None
    if COMM.Get_size() == 1:
        pytest.skip("one rank: nothing to disagree with")
    with pytest.raises(attention2d.Error, match="key_padding"):
        attention2d.attention(q[:, mine], k[:, mine], v[:, mine], causal=True,
                              layout="contiguous", key_padding=mask)


def test_padding_changed_between_calls():
    """The engines are cached by each group's padding: a call with other lengths right after
    gets its own, and each call equals its reference."""
    q, k, v, d_out = full_inputs(15)
    mine = attention2d.shard(torch.arange(SEQ).view(1, SEQ), "contiguous")[0]
    for flip in (False, True, False):
        mask = padding_mask()
        if flip:
            mask = mask.flip(0).flip(1)  # other rows, and right padding become left and back
        ref = reference(q, k, v, d_out, mask, True, None)
        out = attention2d.attention(q[:, mine], k[:, mine], v[:, mine], causal=True,
                                    layout="contiguous", key_padding=mask[:, mine])
        error = relative(out, ref[0][:, mine])
        assert_all_ranks(error <= BOUND, "flip=%s: error %.3g" % (flip, error))


@pytest.mark.parametrize("options", [dict(causal=True, window=5),
                                     dict(causal=True, window_size=(4, 0)),
                                     dict(causal=True, qkv_format="bhsd")])
def test_padded_batch_the_ordinary_torch_ways(options):
    """A causal window in both spellings (q - 5 < k <= q: the reference's causal band of 4), and
    q, k, v in SDPA's [batch, heads, tokens, head_dim] order (the output in it too)."""
    q, k, v, d_out = full_inputs(16)
    mask = padding_mask()
    ref = reference(q, k, v, d_out, mask, True, None if "qkv_format" in options else 4)
    mine = attention2d.shard(torch.arange(SEQ).view(1, SEQ), "contiguous")[0]
    sdpa = options.get("qkv_format") == "bhsd"
    local = [x[:, mine].transpose(1, 2) if sdpa else x[:, mine] for x in (q, k, v)]
    out = attention2d.attention(*local, layout="contiguous", key_padding=mask[:, mine], **options)
    error = relative(out.transpose(1, 2) if sdpa else out, ref[0][:, mine])
    assert_all_ranks(error <= BOUND, "%s: error %.3g" % (options, error))
