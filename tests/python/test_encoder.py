"""An encoder of the kind vision and diffusion transformers (ViT, DiT) and long-sequence text
encoders (ModernBERT) are built of: continuous tokens (patches) embedded with learned positions,
a block of global bidirectional attention and a block of local attention with a two-sided window,
GQA, pre-norm, an MLP, and a per-token regression head. Its sequence is sharded over the ranks,
its attention is attention2d.attention(..., causal=False) (window_size=(W, W) in the local
block), and one forward + backward is compared with the same model in one process whose
attention is a plain torch attention over the whole sequence: every rank's outputs and every
parameter's gradient."""

import pytest
import torch

import attention2d
from conftest import COMM, assert_all_ranks

CHANNELS, DIM, HEADS, KV_HEADS, HEAD_DIM, SEQ, BATCH, WINDOW = 12, 32, 4, 2, 16, 47, 2, 5

# As in test_training.py: fp32 outputs summed in another order agree to ~1e-7 relative; every
# gradient passes the attention's backward (fp32, bound 1e-5 there) and the layers around it.
OUTPUT_BOUND = 1e-5
GRADIENT_BOUND = 1e-5


def torch_attention(q, k, v, window):
    """Plain bidirectional attention [B, N, H, D] (GQA by repetition); window > 0: a key is seen
    only within `window` positions on either side."""
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    if window:
        n = q.shape[1]
        i = torch.arange(n)
        s = s.masked_fill((i[:, None] - i[None, :]).abs() > window, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(DIM)
        self.wq = torch.nn.Linear(DIM, HEADS * HEAD_DIM)
        self.wk = torch.nn.Linear(DIM, KV_HEADS * HEAD_DIM)
        self.wv = torch.nn.Linear(DIM, KV_HEADS * HEAD_DIM)
        self.wo = torch.nn.Linear(HEADS * HEAD_DIM, DIM)
        self.norm2 = torch.nn.LayerNorm(DIM)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(),
                                       torch.nn.Linear(4 * DIM, DIM))

    def forward(self, x, attend):
        b, n, _ = x.shape
        h = self.norm1(x)
        q = self.wq(h).view(b, n, HEADS, HEAD_DIM)
        k = self.wk(h).view(b, n, KV_HEADS, HEAD_DIM)
        v = self.wv(h).view(b, n, KV_HEADS, HEAD_DIM)
        x = x + self.wo(attend(q, k, v).reshape(b, n, HEADS * HEAD_DIM))
        return x + self.mlp(self.norm2(x))


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(CHANNELS, DIM)
        self.position = torch.nn.Embedding(SEQ, DIM)
        self.global_layer = Layer()
        self.local_layer = Layer()
        self.head = torch.nn.Linear(DIM, CHANNELS)

    def forward(self, patches, positions, attend_global, attend_local):
        x = self.embed(patches) + self.position(positions)
        x = self.global_layer(x, attend_global)
        x = self.local_layer(x, attend_local)
        return self.head(x)


def inputs_and_models():
    gen = torch.Generator().manual_seed(4321)
    patches = torch.randn(BATCH, SEQ, CHANNELS, generator=gen)
    targets = torch.randn(BATCH, SEQ, CHANNELS, generator=gen)
    torch.manual_seed(77)
    model = Encoder()
    reference = Encoder()
    reference.load_state_dict(model.state_dict())
    return patches, targets, model, reference


def loss_of(out, targets):
    return ((out - targets) ** 2).sum() / (BATCH * SEQ)


@pytest.mark.parametrize("layout", [None, "contiguous"])
def test_encoder_matches_one_process(layout):
    patches, targets, model, reference = inputs_and_models()
    positions = torch.arange(SEQ)
    ref_out = reference(patches, positions.expand(BATCH, -1),
                        lambda q, k, v: torch_attention(q, k, v, 0),
                        lambda q, k, v: torch_attention(q, k, v, WINDOW))
    loss_of(ref_out, targets).backward()

    # This rank's tokens: the layout the planner picks for a non-causal problem, or contiguous.
    if layout is None:
        layout = attention2d.layout(seq=SEQ, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                                    causal=False)
        mine = torch.from_numpy(layout.tokens())
    else:
        mine = attention2d.shard(torch.arange(SEQ).view(1, SEQ), layout)[0]
    attend_global = lambda q, k, v: attention2d.attention(q, k, v, causal=False, layout=layout)
    attend_local = lambda q, k, v: attention2d.attention(q, k, v, window_size=(WINDOW, WINDOW),
                                                         layout=layout)
    out = model(patches[:, mine], mine.expand(BATCH, -1), attend_global, attend_local)
    loss_of(out, targets[:, mine]).backward()

    expected = ref_out.detach()[:, mine]
    output_error = float((out.detach() - expected).norm() / expected.norm())
    assert_all_ranks(output_error <= OUTPUT_BOUND, "outputs: error %.3g" % output_error)
    worst = 0.0
    for (name, p), (_, r) in zip(model.named_parameters(), reference.named_parameters()):
        grad = COMM.allreduce(p.grad)
        # The K projections' bias gradients are zero in exact arithmetic (softmax ignores a
        # constant shift of a row's scores): errors relative to at least 1e-3 of the largest norm.
        floor = 1e-3 * max(float(x.grad.norm()) for x in reference.parameters())
        error = float((grad - r.grad).norm()) / max(float(r.grad.norm()), floor)
        assert_all_ranks(error <= GRADIENT_BOUND, "gradient of %s: error %.3g" % (name, error))
        worst = max(worst, error)
    print("encoder (%s): output error %.3g, worst gradient error %.3g"
          % (layout if isinstance(layout, str) else "planned layout", output_error, worst))
