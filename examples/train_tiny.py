"""A tiny causal language model trained with its sequence sharded over MPI ranks, the attention
computed by attention2d across them (exact: the same numbers as one process would get).

    PYTHONPATH=build/python mpirun -np 4 .venv/bin/python examples/train_tiny.py [--steps 20]

Each rank holds the tokens attention2d.layout() gives it; everything but the attention is local
to those tokens; the loss and the parameter gradients are summed over the ranks (as data
parallelism would average them) before each optimiser step, so every rank keeps the same model."""

import argparse

import torch
from mpi4py import MPI

import attention2d

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--seq", type=int, default=256)
parser.add_argument("--algo", default="auto")
parser.add_argument("--check", action="store_true", help="exit 1 unless the loss fell by 20 %%")
args = parser.parse_args()
comm = MPI.COMM_WORLD
VOCAB, DIM, HEADS, KV_HEADS, HEAD_DIM, BATCH = 64, 64, 4, 2, 16, 4


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.position = torch.nn.Embedding(args.seq, DIM)
        self.norm1, self.norm2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.wq = torch.nn.Linear(DIM, HEADS * HEAD_DIM)
        self.wkv = torch.nn.Linear(DIM, 2 * KV_HEADS * HEAD_DIM)
        self.wo = torch.nn.Linear(HEADS * HEAD_DIM, DIM)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(),
                                       torch.nn.Linear(4 * DIM, DIM))
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens, positions, layout):
        b, n = tokens.shape
        x = self.embed(tokens) + self.position(positions)
        h = self.norm1(x)
        q = self.wq(h).view(b, n, HEADS, HEAD_DIM)
        k, v = self.wkv(h).view(b, n, 2, KV_HEADS, HEAD_DIM).unbind(2)
        a = attention2d.attention(q, k, v, causal=True, layout=layout)  # across the ranks
        x = x + self.wo(a.reshape(b, n, HEADS * HEAD_DIM))
        return self.head(x + self.mlp(self.norm2(x)))


# Data: a periodic sequence with noise, the same on every rank (seeded).
gen = torch.Generator().manual_seed(0)
base = torch.randint(0, VOCAB, (BATCH, 17), generator=gen)
data = base.repeat(1, args.seq // 17 + 2)[:, : args.seq + 1]

layout = attention2d.layout(seq=args.seq, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                            causal=True, algo=args.algo, batch=BATCH)
mine = torch.from_numpy(layout.tokens())  # this rank's global token positions
inputs, targets = data[:, :-1][:, mine], data[:, 1:][:, mine]

torch.manual_seed(1)  # the same initial model everywhere
model = Block()
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
if comm.rank == 0:
    print("attention2d %s, %d ranks, %s" % (attention2d.__version__, comm.size, layout.plan))
losses = []
for step in range(args.steps):
    optimizer.zero_grad()
    logits = model(inputs, mine.expand(BATCH, -1), layout)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1),
                                             reduction="sum") / (BATCH * args.seq)
    loss.backward()
    for p in model.parameters():
        comm.Allreduce(MPI.IN_PLACE, p.grad.numpy(), op=MPI.SUM)
    optimizer.step()
    total = comm.allreduce(float(loss))
    losses.append(total)
    if comm.rank == 0 and (step % 5 == 0 or step == args.steps - 1):
        print("step %3d  loss %.4f" % (step, total))
if args.check and not losses[-1] < 0.8 * losses[0]:
    print("train_tiny: the loss went from %.4f to %.4f" % (losses[0], losses[-1]))
    raise SystemExit(1)
