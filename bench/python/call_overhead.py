"""The package's own time per Hugging Face attention call, by sequence length: everything a call of
attention2d.transformers' op does besides the engine's computation and messages (the arguments'
checks and exchange, reading position_ids, planning, the engine cache), as a model's layers call
it: each step hands every layer the same position_ids, forward and backward, and each step packs
other documents (lengths drawn per step, 1/8 to 2x --doc tokens, as a data loader with
DataCollatorWithFlattening gives them), so that the first call of every step reads new
positions and makes an engine for the new documents; --doc 0: one document, the same positions
every step (a new tensor of the same values: read, found unchanged, nothing sent). The engine's own work is left out by running the op's backward path up to its engine
(_engine_only): what both directions do before the engine runs.

Per N (tokens of the whole sequence, over the launched ranks): the first call of a step (a new
position_ids tensor: each rank reads its own and sends a summary), a repeated call (the same
tensor: nothing read, nothing sent beyond the argument exchange), and the mean over a step of a
32-layer model (64 calls). Medians over --steps after a warm-up, of the slowest rank.

    PYTHONPATH=build/python .venv/bin/python scripts/launch/launch.py --nproc 2 -- \\
        .venv/bin/python bench/python/call_overhead.py [--doc 0]"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import attention2d
import attention2d.transformers as hf

parser = argparse.ArgumentParser()
parser.add_argument("--seqs", default="4096,16384,65536,262144,1048576")
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--layers", type=int, default=32)
parser.add_argument("--heads", type=int, default=8)
parser.add_argument("--kv-heads", type=int, default=2)
parser.add_argument("--head-dim", type=int, default=8)
parser.add_argument("--doc", type=int, default=4096,
                    help="mean document length in tokens; 0: one document, positions 0..N-1 "
                         "(each step a new tensor of the same values)")
args = parser.parse_args()
dist.init_process_group("gloo")
P, rank = dist.get_world_size(), dist.get_rank()
handle = len(hf._configs)
hf.register()


def slowest(seconds):
    gathered = [None] * P
    dist.all_gather_object(gathered, seconds)
    return max(gathered)


def call(q, k, v, positions):
    start = time.perf_counter()
    hf._call(q, k, v, None, positions, None, handle, None, 0, 0, 0.0, "", True)
    return time.perf_counter() - start


rows = []
for seq in (int(x) for x in args.seqs.split(",")):
    mine = attention2d.shard(torch.arange(seq), "contiguous", dim=0)
    n = len(mine)
    q = torch.zeros(1, n, args.heads, args.head_dim)
    k = torch.zeros(1, n, args.kv_heads, args.head_dim)
    firsts, repeats, means = [], [], []
    for step in range(args.steps + 1):
        gen = torch.Generator().manual_seed(step)  # the same documents on every rank
        lengths, total = ([seq], seq) if args.doc == 0 else ([], 0)
        while total < seq:
            lengths.append(min(seq - total, int(torch.randint(
                max(1, args.doc // 8), 2 * args.doc + 1, (1,), generator=gen))))
            total += lengths[-1]
        packed = torch.cat([torch.arange(n) for n in lengths])
        positions = packed[mine][None]  # this rank's, restarting at each document
        times = [call(q, k, k, positions) for _ in range(2 * args.layers)]
        if step == 0:
            continue  # warm-up: the engine is made (once per problem)
        firsts.append(slowest(times[0]))
        repeats.append(slowest(statistics.median(times[1:])))
        means.append(slowest(sum(times) / len(times)))
    rows.append((seq, statistics.median(firsts), statistics.median(repeats),
                 statistics.median(means)))

if rank == 0:
    print("P = %d, heads %d:%d, head_dim %d, %d layers (forward + backward: %d calls a step), "
          "documents of %d tokens on average (0: one); load average %.1f"
          % (P, args.heads, args.kv_heads, args.head_dim, args.layers, 2 * args.layers,
             args.doc, os.getloadavg()[0]))
    print("| N | first call of a step, ms | repeated call, ms | mean per call, ms |")
    print("|---:|---:|---:|---:|")
    for seq, first, repeat, mean in rows:
        print("| %d | %.3f | %.3f | %.3f |" % (seq, first * 1e3, repeat * 1e3, mean * 1e3))
dist.destroy_process_group()
