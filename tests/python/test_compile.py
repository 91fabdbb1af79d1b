"""attention() and flash-attn's entries under torch.compile (issue 57): a block calling them
compiles with fullgraph=True into one graph, without a warning, and computes what the eager call
computes (O, LSE and every gradient), under scripts/launch/launch.py (torch.distributed's gloo
group). The op's own arguments changed between calls (the layout object, the group, causal) give
the eager results again: nothing of an earlier trace is reused wrongly."""

import warnings

import pytest
import torch
import torch.distributed as dist

import attention2d
from conftest import COMM, TORCH_LAUNCH, assert_all_ranks, full_inputs, relative_error

P, RANK = COMM.Get_size(), COMM.Get_rank()
pytestmark = pytest.mark.skipif(not TORCH_LAUNCH, reason="needs the torch.distributed launch")
SAME = 1e-6  # the op's path and the eager autograd function run the same kernels


class Block(torch.nn.Module):
    """A transformer block's attention: projections, attention2d, the output projection."""

    def __init__(self, call, width=32, heads=4, kv_heads=2, sdpa=False):
        super().__init__()
        torch.manual_seed(3)
        self.heads, self.kv_heads, self.d = heads, kv_heads, width // heads
        self.q = torch.nn.Linear(width, heads * self.d)
        self.kv = torch.nn.Linear(width, 2 * kv_heads * self.d)
        self.o = torch.nn.Linear(heads * self.d, width)
        self.call, self.sdpa = call, sdpa

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.heads, self.d)
        k, v = self.kv(x).view(b, n, 2, self.kv_heads, self.d).unbind(2)
        if self.sdpa:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        out, lse = self.call(q, k, v)
        if self.sdpa:
            out = out.transpose(1, 2)
        return self.o(out.reshape(b, n, -1)), lse


class Graphs:
    """A torch.compile backend (aot_eager: forward and backward traced through the ops' fake
    implementations, as inductor traces them) that counts the graphs it is given."""

    def __init__(self):
        self.count = 0

    def __call__(self, gm, example_inputs):
        self.count += 1
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)


def run(block, x, compiled, lse_loss=True):
    """Output, LSE and the gradients of x and of every parameter (the LSE in the loss too)."""
    block.zero_grad()
    x = x.clone().requires_grad_()
    out, lse = (block if compiled is None else compiled)(x)
    loss = (out * out).sum()
    if lse_loss:
        loss = loss + (lse * torch.linspace(0, 1, lse.numel()).view(lse.shape)).sum()
    loss.backward()
    return [out.detach(), lse.detach(), x.grad] + [p.grad.clone() for p in block.parameters()]


def compare(call, x, sdpa=False, label="", lse_loss=True):
    """The block compiled (fullgraph, one graph, no warning) against the eager block."""
    torch._dynamo.reset()
    block = Block(call, sdpa=sdpa)
    expected = run(block, x, None, lse_loss)
    graphs = Graphs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = torch.compile(block, backend=graphs, fullgraph=True)
        got = run(block, x, compiled, lse_loss)
        again = run(block, x, compiled, lse_loss)
    errors = [relative_error(a, b) for a, b in zip(got + again, expected + expected)]
    messages = ["%s: %s" % (w.category.__name__, w.message) for w in caught]
    assert_all_ranks(graphs.count == 1, "%s: %d graphs" % (label, graphs.count))
    assert_all_ranks(not messages, "%s: warnings %s" % (label, messages))
    assert_all_ranks(max(errors) <= SAME, "%s: compiled vs eager %s" % (label, errors))


def local_input(seq, layout="contiguous", seed=4):
    """This rank's shard (in `layout`: a name or a Layout) of a [1, seq, 32] input."""
    x = full_inputs(seed, 1, seq, 32, 1, 1)[0][..., 0].float()
    return attention2d.shard(x, layout)


def test_attention_compiles_in_one_graph():
    """Contiguous shards (exchanged into the plan's layout and back), the plan's own layout (a
    Layout object), SDPA's order, the LSE in the loss (its gradient), GQA 4:2, N odd."""
    seq = 12 * P + 5
    call = lambda q, k, v: attention2d.attention(q, k, v, causal=True, layout="contiguous",
                                                 return_lse=True)
    compare(call, local_input(seq), label="contiguous")
    lay = attention2d.layout(seq=seq, heads=4, kv_heads=2, head_dim=8, causal=True)
    call = lambda q, k, v: attention2d.attention(q, k, v, causal=True, layout=lay,
                                                 return_lse=True)
    compare(call, local_input(seq, lay), label="plan layout")
    call = lambda q, k, v: attention2d.attention(q, k, v, causal=True, layout="zigzag",
                                                 return_lse=True, qkv_format="bhsd")
    compare(call, local_input(seq, "zigzag"), sdpa=True, label="bhsd")


def test_flash_entries_compile_in_one_graph():
    """flash_attn_func (a window, softcap: the LSE returned, not in the loss, whose gradient
    softcap does not have) and flash_attn_varlen_func (packed documents, cu_seqlens as a tensor)
    as flash-attn's users call them."""
    seq = 10 * P + 3
    call = lambda q, k, v: attention2d.flash_attn_func(q, k, v, causal=True, window_size=(5, 0),
                                                       softcap=3.0, return_attn_probs=True)[:2]
    compare(call, local_input(seq), label="flash_attn_func", lse_loss=False)
    bounds = torch.tensor([0, 7, seq - 4, seq], dtype=torch.int32)

    def varlen(q, k, v):
        out, lse, _ = attention2d.flash_attn_varlen_func(
            q[0], k[0], v[0], bounds, bounds, seq, seq, causal=True, return_attn_probs=True)
        return out[None], lse[None]
    compare(varlen, local_input(seq), label="flash_attn_varlen_func")


def test_arguments_changed_between_calls():
    """The same compiled function called with another layout object, another group and another
    causal flag: each result equals its eager call (guards recompile; handles are not reused
    for other objects)."""
    seq = 9 * P + 2
    x = full_inputs(6, 1, seq, 4, 4, 8)
    groups = [dist.group.WORLD, dist.new_group(list(range(P)))]

    def call(q, k, v, layout, group, causal):
        return attention2d.attention(q, k, v, causal=causal, layout=layout, group=group)

    compiled = torch.compile(call, backend="aot_eager", fullgraph=True)
    layouts = [attention2d.layout(seq=seq, heads=4, head_dim=8, causal=c, algo=a)
               for c, a in ((True, "ring"), (False, "attention2d"))]
    for layout in layouts + ["contiguous"]:
        for group in groups:
            for causal in (True, False):
                if not isinstance(layout, str) and layout.problem.causal != causal:
                    continue
                q, k, v = (attention2d.shard(t.float(), layout) for t in x[:3])
                want = call(q, k, v, layout, group, causal)
                got = compiled(q, k, v, layout, group, causal)
                error = relative_error(got, want)
                assert_all_ranks(error <= SAME, "layout %s, group %s, causal %s: %.3g"
                                 % (layout, groups.index(group), causal, error))


def test_grid_mesh_compiles():
    """grid= a DeviceMesh (P x 1) in a compiled function: one graph, the eager result."""
    if P == 1:
        pytest.skip("a mesh of several ranks")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (P, 1), mesh_dim_names=("r", "c"))
    seq = 7 * P + 3
    x = full_inputs(8, 1, seq, 4, 2, 8)
    q, k, v = (attention2d.shard(t.float(), "contiguous", grid=mesh) for t in x[:3])

    def call(q, k, v):
        return attention2d.attention(q, k, v, causal=True, layout="contiguous", grid=mesh)

    graphs = Graphs()
    got = torch.compile(call, backend=graphs, fullgraph=True)(q, k, v)
    error = relative_error(got, call(q, k, v))
    assert_all_ranks(graphs.count == 1 and error <= SAME, "grid=mesh compiled: %d graphs, %.3g"
                     % (graphs.count, error))


def test_masks_changed_between_calls():
    """Range masks (Ranges objects, a specification string) changed between calls of one
    compiled function: each the eager result."""
    seq = 9 * P + 2
    x = full_inputs(7, 1, seq, 4, 4, 8)
    q, k, v = (attention2d.shard(t.float(), "contiguous") for t in x[:3])

    def call(q, k, v, mask):
        return attention2d.attention(q, k, v, layout="contiguous", mask=mask)

    compiled = torch.compile(call, backend="aot_eager", fullgraph=True)
    masks = [attention2d.ranges("prefix-lm:5"), attention2d.ranges("block-causal:4"),
             attention2d.ranges([[0, seq]], [[0, 3]]), "chunked-causal:6"]
    for mask in masks:
        error = relative_error(compiled(q, k, v, mask), call(q, k, v, mask))
        assert_all_ranks(error <= SAME, "mask %r: %.3g" % (mask, error))


def test_refusals_under_compile():
    """A refusal raised inside the compiled op is the eager call's, on every rank."""
    q = torch.randn(1, 6, 2, 8)

    def call(q):
        return attention2d.attention(q, q, q, layout="contiguous", softmax_scale=-1.0)

    with pytest.raises(Exception, match="softmax_scale=-1.0"):
        torch.compile(call, backend="aot_eager", fullgraph=True)(q)
