"""A training step of a tiny transformer block whose attention is attention2d, sequence-sharded
over the ranks, against the same block in one process with a plain torch attention: the loss and
every parameter's gradient agree within fp32 bounds. And finite differences of a scalar of the
output against autograd through the engine."""

import pytest
import torch

import attention2d
from conftest import COMM, TORCH_LAUNCH, assert_all_ranks, full_inputs

VOCAB, DIM, HEADS, KV_HEADS, HEAD_DIM, SEQ, BATCH = 50, 32, 4, 2, 8, 45, 2

# The loss is a mean of 90 cross-entropies in fp32 summed in another order: 1e-6 relative
# (measured up to 1.4e-7 at P = 1, 3, 4). Every gradient passes through the attention's backward
# (fp32, bound 1e-5 there) and the layers around it: 1e-5 (measured up to 1.2e-6).
LOSS_BOUND = 1e-6
GRADIENT_BOUND = 1e-5


def torch_attention(q, k, v):
    """Plain causal attention [B, N, H, D] in the precision of the inputs (GQA by repetition)."""
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    n = q.shape[1]
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.position = torch.nn.Embedding(SEQ, DIM)
        self.norm1 = torch.nn.LayerNorm(DIM)
        self.wq = torch.nn.Linear(DIM, HEADS * HEAD_DIM)
        self.wk = torch.nn.Linear(DIM, KV_HEADS * HEAD_DIM)
        self.wv = torch.nn.Linear(DIM, KV_HEADS * HEAD_DIM)
        self.wo = torch.nn.Linear(HEADS * HEAD_DIM, DIM)
        self.norm2 = torch.nn.LayerNorm(DIM)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(),
                                       torch.nn.Linear(4 * DIM, DIM))
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens, positions, attend):
        b, n = tokens.shape
        x = self.embed(tokens) + self.position(positions)
        h = self.norm1(x)
        q = self.wq(h).view(b, n, HEADS, HEAD_DIM)
        k = self.wk(h).view(b, n, KV_HEADS, HEAD_DIM)
        v = self.wv(h).view(b, n, KV_HEADS, HEAD_DIM)
        x = x + self.wo(attend(q, k, v).reshape(b, n, HEADS * HEAD_DIM))
        x = x + self.mlp(self.norm2(x))
        return self.head(x)


def loss_of(logits, targets, total_tokens):
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1),
                                           reduction="sum")
    return ce / total_tokens


def reference_step():
    """The inputs, a model, and the same model trained one step in one process with torch's
    attention over the whole sequence (its loss and gradients)."""
    gen = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    torch.manual_seed(99)
    model = Block()
    reference = Block()
    reference.load_state_dict(model.state_dict())
    positions = torch.arange(SEQ)
    ref_loss = loss_of(reference(inputs, positions.expand(BATCH, -1), torch_attention), targets,
                       BATCH * SEQ)
    ref_loss.backward()
    return inputs, targets, model, reference, ref_loss


def check_gradients(named_gradients, reference):
    """Every parameter gradient against the one-process reference. The gradient of the K
    projection's bias is zero in exact arithmetic (adding one vector to every key shifts a row's
    scores by a constant, which softmax ignores): each error is taken relative to the larger of
    the gradient's norm and 1 % of the mean gradient norm."""
    norms = [float(r.grad.norm()) for r in reference.parameters()]
    floor = 1e-2 * sum(norms) / len(norms)
    worst = 0.0
    for (name, grad), (_, r) in zip(named_gradients, reference.named_parameters()):
        error = float((grad - r.grad).norm()) / max(float(r.grad.norm()), floor)
        assert_all_ranks(error <= GRADIENT_BOUND, "gradient of %s: error %.3g" % (name, error))
        worst = max(worst, error)
    return worst


def test_training_step_matches_one_process():
    inputs, targets, model, reference, ref_loss = reference_step()
    # Every rank: its tokens (the layout's), attention2d across the ranks; the loss and the
    # parameter gradients are sums over the ranks.
    lay = attention2d.layout(seq=SEQ, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                             causal=True, algo="attention2d")
    mine = torch.from_numpy(lay.tokens())
    attend = lambda q, k, v: attention2d.attention(q, k, v, causal=True, layout=lay)
    logits = model(inputs[:, mine], mine.expand(BATCH, -1), attend)
    loss = loss_of(logits, targets[:, mine], BATCH * SEQ)
    loss.backward()
    total_loss = COMM.allreduce(float(loss))
    loss_error = abs(total_loss - float(ref_loss)) / abs(float(ref_loss))
    assert_all_ranks(loss_error <= LOSS_BOUND, "loss %.8g vs %.8g" % (total_loss, float(ref_loss)))
    worst = check_gradients([(name, COMM.allreduce(p.grad)) for name, p in
                             model.named_parameters()], reference)
    print("training step: loss error %.3g, worst gradient error %.3g" % (loss_error, worst))


@pytest.mark.skipif(not TORCH_LAUNCH, reason="DistributedDataParallel needs torch.distributed")
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_ddp_training_step_is_exact(layout):
    """DDP over the same group, with register_ddp_hook: after backward() every rank holds the
    one-process gradients (DDP alone would hold 1/P of them), with contiguous or zigzag shards."""
    inputs, targets, model, reference, ref_loss = reference_step()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    attention2d.register_ddp_hook(ddp)
    mine = attention2d.shard(torch.arange(SEQ).view(1, SEQ), layout)[0]
    attend = lambda q, k, v: attention2d.attention(q, k, v, causal=True, layout=layout)
    logits = ddp(inputs[:, mine], mine.expand(BATCH, -1), attend)
    loss_of(logits, targets[:, mine], BATCH * SEQ).backward()
    worst = check_gradients([(name, p.grad) for name, p in model.named_parameters()], reference)
    print("DDP training step (%s): worst gradient error %.3g" % (layout, worst))


@pytest.mark.parametrize("algo", ["attention2d", "ring"])
def test_finite_differences(algo):
    """d f / d x for f = sum(out * W) against central differences, at a few global elements of
    q, k and v (every rank perturbs the same element; its owner's shard changes)."""
    seq, heads, kv_heads, d = 13, 2, 1, 8
    q, k, v, weight = full_inputs(21, 1, seq, heads, kv_heads, d)
    lay = attention2d.layout(seq=seq, heads=heads, kv_heads=kv_heads, head_dim=d, causal=True,
                             algo=algo)
    mine = torch.from_numpy(lay.tokens())
    w_local = weight.float().index_select(1, mine)

    def f(full):
        local = [x.float().index_select(1, mine) for x in full]
        out = attention2d.attention(*local, causal=True, layout=lay)
        return COMM.allreduce(float((out.double() * w_local.double()).sum()))

    local = [x.float().index_select(1, mine).requires_grad_() for x in (q, k, v)]
    out = attention2d.attention(*local, causal=True, layout=lay)
    (out * w_local).sum().backward()
    gen = torch.Generator().manual_seed(5)
    h = 1e-2
    worst = 0.0
    for which, full in enumerate((q, k, v)):
        grad_full = attention2d.unshard(local[which].grad, lay).double()
        scale = float(grad_full.abs().max())
        for _ in range(6):
            index = tuple(int(torch.randint(0, s, (1,), generator=gen)) for s in full.shape)
            plus = [x.clone() for x in (q, k, v)]
            minus = [x.clone() for x in (q, k, v)]
            plus[which][index] += h
            minus[which][index] -= h
            numeric = (f(plus) - f(minus)) / (2 * h)
            worst = max(worst, abs(numeric - float(grad_full[index])) / scale)
    # fp32 forward: f carries ~1e-7 relative rounding, divided by 2h, and the O(h^2) truncation
    # is of the same order: 3e-4 of the largest gradient entry (measured up to 2.9e-5).
    print("%s: finite differences within %.3g of the largest gradient entry" % (algo, worst))
    assert_all_ranks(worst <= 3e-4, "%s: finite differences differ by %.3g" % (algo, worst))
