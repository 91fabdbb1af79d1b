"""A tiny Hugging Face Llama trained with its sequence sharded over the ranks: the model is built
with attn_implementation="attention2d" (attention2d.transformers.register()), every rank passes its
contiguous slice of each sequence with the global position_ids of its tokens, attention2d computes
each layer's attention across the ranks (exact), and DDP with attention2d's hook sums the ranks'
gradients as sequence parallelism needs. Random weights from a config, nothing from a hub.

    .venv/bin/torchrun --nproc_per_node 4 examples/hf_train.py [--steps 20] [--compile]
    .venv/bin/python scripts/launch/launch.py --nproc 4 -- .venv/bin/python examples/hf_train.py

(With PYTHONPATH=build/python for the build tree's package; .venv is scripts/venv.sh's.)
--compile wraps the model in torch.compile(fullgraph=True) (inside DDP); --packed packs documents of random
lengths into each sequence (position_ids restarting at 0, as DataCollatorWithFlattening does)."""

import argparse
import time

import torch
import torch.distributed as dist
import transformers

import attention2d
import attention2d.transformers

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--seq", type=int, default=256)
parser.add_argument("--batch", type=int, default=2)
parser.add_argument("--packed", action="store_true")
parser.add_argument("--compile", action="store_true", help="torch.compile(model, fullgraph=True)")
parser.add_argument("--backend", default="inductor", help="torch.compile's backend")
parser.add_argument("--check", action="store_true", help="exit 1 unless the loss fell by 20 %%")
args = parser.parse_args()

dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher
rank = dist.get_rank()
attention2d.transformers.register()  # attn_implementation="attention2d": contiguous shards

config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=args.seq,
                                  use_cache=False)
torch.manual_seed(0)  # the same initial weights on every rank
model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="attention2d")
if args.compile:  # the model in one graph; DDP outside it (DDP's own hooks do not trace)
    model = torch.compile(model, backend=args.backend, fullgraph=True)
forward = torch.nn.parallel.DistributedDataParallel(model)
attention2d.register_ddp_hook(forward)  # DDP sums over the sequence's ranks
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
mine = attention2d.shard(torch.arange(args.seq)[None], "contiguous")[0]  # this rank's tokens

data = torch.Generator().manual_seed(1)  # the same batches on every rank
PATTERNS = torch.randint(0, 128, (4, 8), generator=data)
losses = []
for step in range(args.steps):
    # A learnable task: each sequence repeats a pattern of 8 tokens, one of 4.
    pattern = PATTERNS[torch.randint(0, 4, (args.batch,), generator=data)]
    ids = pattern.repeat(1, args.seq // 8 + 1)[:, :args.seq]
    if args.packed:
        cuts = sorted(torch.randperm(args.seq - 1, generator=data)[:3].add(1).tolist())
        lengths = [b - a for a, b in zip([0] + cuts, cuts + [args.seq])]
    else:
        lengths = [args.seq]
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = ids[:, 1:]
    labels[:, torch.tensor(lengths).cumsum(0) - 1] = -100  # no target across a document's end
    start = time.perf_counter()
    out = forward(input_ids=ids[:, mine], position_ids=positions[:, mine],
                  labels=labels[:, mine], shift_labels=labels[:, mine],
                  num_items_in_batch=int((labels != -100).sum()))
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    loss = out.loss.detach().clone()
    dist.all_reduce(loss)  # each rank's loss is its share of the sequence's
    losses.append(float(loss))
    if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
        print("step %3d  loss %.4f  %.0f ms" % (step, losses[-1],
                                                1e3 * (time.perf_counter() - start)), flush=True)

ok = losses[-1] < 0.8 * losses[0]
if rank == 0:
    print("loss %.4f -> %.4f on %d ranks%s" % (losses[0], losses[-1], dist.get_world_size(),
                                               "" if ok else ": it did not fall by 20 %"))
dist.destroy_process_group()
if args.check and not ok:
    raise SystemExit(1)
