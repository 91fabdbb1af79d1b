"""A tiny causal language model trained with torch.distributed: every rank holds a contiguous
slice of each sequence, attention2d computes the attention across the ranks (exact), and DDP,
with attention2d's hook, sums the ranks' gradients as sequence parallelism needs.

    .venv/bin/torchrun --nproc_per_node 4 examples/train_torchrun.py [--steps 20]
    .venv/bin/python scripts/launch/launch.py --nproc 4 -- .venv/bin/python examples/train_torchrun.py

(With PYTHONPATH=build/python for the build tree's package; .venv is scripts/venv.sh's, the
interpreter the build tree was built for.)"""

import argparse

import torch
import torch.distributed as dist

import attention2d

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--seq", type=int, default=256)
parser.add_argument("--layout", default="contiguous", choices=["contiguous", "zigzag"])
parser.add_argument("--check", action="store_true", help="exit 1 unless the loss fell by 20 %%")
args = parser.parse_args()
VOCAB, DIM, HEADS, KV_HEADS, HEAD_DIM, BATCH = 64, 64, 4, 2, 16, 4

dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher


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

    def forward(self, tokens, positions):
        b, n = tokens.shape
        x = self.embed(tokens) + self.position(positions)
        h = self.norm1(x)
        q = self.wq(h).view(b, n, HEADS, HEAD_DIM)
        k, v = self.wkv(h).view(b, n, 2, KV_HEADS, HEAD_DIM).unbind(2)
        a = attention2d.attention(q, k, v, causal=True, layout=args.layout)  # across the ranks
        x = x + self.wo(a.reshape(b, n, HEADS * HEAD_DIM))
        return self.head(x + self.mlp(self.norm2(x)))


# Data: a periodic sequence with noise, the same on every rank (seeded); each rank keeps its slice.
gen = torch.Generator().manual_seed(0)
base = torch.randint(0, VOCAB, (BATCH, 17), generator=gen)
data = base.repeat(1, args.seq // 17 + 2)[:, : args.seq + 1]
mine = attention2d.shard(torch.arange(args.seq)[None], args.layout)[0]  # this rank's positions
inputs, targets = data[:, :-1][:, mine], data[:, 1:][:, mine]

torch.manual_seed(1)
model = torch.nn.parallel.DistributedDataParallel(Block())
attention2d.register_ddp_hook(model)  # sum over the sequence's ranks, not DDP's average
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
losses = []
for step in range(args.steps):
    optimizer.zero_grad()
    logits = model(inputs, mine.expand(BATCH, -1))
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1),
                                             reduction="sum") / (BATCH * args.seq)
    loss.backward()
    optimizer.step()
    total = loss.detach().clone()
    dist.all_reduce(total)  # the sequence's loss: the sum of the ranks' shares
    losses.append(float(total))
    if dist.get_rank() == 0 and (step % 5 == 0 or step == args.steps - 1):
        print("step %3d  loss %.4f" % (step, float(total)))
dist.destroy_process_group()  # before the process exits, as torch.distributed asks
if args.check and not losses[-1] < 0.8 * losses[0]:
    print("train_torchrun: the loss went from %.4f to %.4f" % (losses[0], losses[-1]))
    raise SystemExit(1)
