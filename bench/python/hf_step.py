"""One training step (forward, backward, AdamW) of a tiny Hugging Face Llama (from a config,
random weights) with attn_implementation="attention2d" over the launched ranks, and at one rank
also with "sdpa" (torch's CPU flash attention), the two alternating in one run; the attention's
share of the attention2d step (time inside the attention op's forward and backward) and the
arguments' exchange's (attention()'s all-gathers of its arguments and positions, the waits for
the other ranks included). Prints the median over --iters steps after --warmup, the slowest
rank's, and the load average. With --profile (P = 1), one more step of each under torch.profiler:
the self CPU time of every op outside the attention (ops whose name or an ancestor's names
attention), summed per op name, attention2d's step against sdpa's: torch's own work must run at
the same speed beside either attention.

    PYTHONPATH=build/python .venv/bin/python scripts/launch/launch.py --nproc 1 -- \\
        .venv/bin/python bench/python/hf_step.py --seq 2048
    ... --nproc 4 -- ... (attention2d only: sdpa cannot shard the sequence)"""

import argparse
import copy
import os
import statistics
import time

import torch
import torch.distributed as dist
import transformers

import attention2d
import attention2d.transformers as hf
from attention2d import _api

parser = argparse.ArgumentParser()
parser.add_argument("--seq", type=int, default=2048)
parser.add_argument("--iters", type=int, default=5)
parser.add_argument("--warmup", type=int, default=1)
parser.add_argument("--threads", type=int, default=0, help="torch's threads (default: torch's)")
parser.add_argument("--profile", action="store_true")
args = parser.parse_args()
if args.threads:
    torch.set_num_threads(args.threads)
dist.init_process_group("gloo")
P, rank = dist.get_world_size(), dist.get_rank()
hf.register()

inside = [0.0]


def timed(fn):
    def wrapper(*a, **k):
        start = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            inside[0] += time.perf_counter() - start
    return wrapper


hf._call = timed(hf._call)  # the op's forward (and the backward's engine lookup)
_api._backward_in_user_layout = timed(_api._backward_in_user_layout)

# The arguments' exchange: the channel's all-gathers of attention()'s arguments and positions,
# each timed on every rank. What one costs the step is its time on the rank that came last to
# it (the others' longer times are waits for that rank, which the engine's first message would
# wait out without it): the minimum over the ranks, summed over the step's all-gathers.
exchange = []
_allgather = attention2d._channel.Channel.allgather


def timed_allgather(self, value, phase):
    start = time.perf_counter()
    try:
        return _allgather(self, value, phase)
    finally:
        if phase.startswith("attention()"):
            exchange.append(time.perf_counter() - start)


attention2d._channel.Channel.allgather = timed_allgather

config = transformers.LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512,
                                  num_hidden_layers=2, num_attention_heads=8,
                                  num_key_value_heads=2, max_position_embeddings=args.seq,
                                  use_cache=False)
implementations = ["attention2d", "sdpa"] if P == 1 else ["attention2d"]
models = {}
for name in implementations:
    torch.manual_seed(0)
    models[name] = transformers.AutoModelForCausalLM.from_config(  # a config of its own: from_config
        copy.deepcopy(config), attn_implementation=name)           # sets _attn_implementation on it
    assert models[name].config._attn_implementation == name
optimizers = {n: torch.optim.AdamW(m.parameters(), lr=1e-4) for n, m in models.items()}
ids = torch.randint(0, 1024, (1, args.seq), generator=torch.Generator().manual_seed(1))
labels = torch.full_like(ids, -100)
labels[:, :-1] = ids[:, 1:]
mine = attention2d.shard(torch.arange(args.seq)[None], "contiguous")[0]
times = {n: [] for n in implementations}
shares, exchanges = [], []


def step(name):
    model = models[name]
    kwargs = dict(labels=labels[:, mine], shift_labels=labels[:, mine],
                  num_items_in_batch=int((labels != -100).sum()))
    if name == "sdpa":
        out = model(input_ids=ids, position_ids=torch.arange(args.seq)[None], **kwargs)
    else:
        out = model(input_ids=ids[:, mine], position_ids=mine[None], **kwargs)
    out.loss.backward()
    for p in model.parameters():
        if P > 1:
            dist.all_reduce(p.grad)
    optimizers[name].step()
    optimizers[name].zero_grad()


for it in range(args.warmup + args.iters):
    for name in implementations:
        dist.barrier()
        inside[0] = 0.0
        exchange.clear()
        start = time.perf_counter()
        step(name)
        step_s = time.perf_counter() - start
        if P > 1:
            per_rank = [None] * P
            dist.all_gather_object(per_rank, list(exchange))
            exchange_s = sum(min(times) for times in zip(*per_rank))
        else:
            exchange_s = sum(exchange)
        elapsed = torch.tensor([step_s, inside[0], exchange_s], dtype=torch.float64)
        if P > 1:
            gathered = [torch.zeros(3, dtype=torch.float64) for _ in range(P)]
            dist.all_gather(gathered, elapsed)
            elapsed = max(gathered, key=lambda t: float(t[0]))  # the slowest rank's
        if it >= args.warmup:
            times[name].append(float(elapsed[0]))
            if name == "attention2d":
                shares.append(float(elapsed[1]) / float(elapsed[0]))
                exchanges.append(float(elapsed[2]) / float(elapsed[0]))
if rank == 0:
    load = os.getloadavg()[0]
    for name in implementations:
        print("P=%d N=%d %-11s step median %.1f ms (min %.1f, max %.1f)"
              % (P, args.seq, name, 1e3 * statistics.median(times[name]),
                 1e3 * min(times[name]), 1e3 * max(times[name])))
    print("attention2d: the attention's share of the step %.0f %%, the arguments' exchange's "
          "%.2f %% (medians)" % (100 * statistics.median(shares),
                                 100 * statistics.median(exchanges)))
    if P == 1:
        print("attention2d / sdpa: %.2f" % (statistics.median(times["attention2d"])
                                            / statistics.median(times["sdpa"])))
    print("load average %.1f" % load)


def outside_attention(name):
    """Self CPU microseconds per op name over one profiled step, ops under an attention excluded."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(name)
    totals = {}
    for event in prof.events():
        node, inside_attention = event, False
        while node is not None:
            if "attention" in node.name.lower():
                inside_attention = True
                break
            node = node.cpu_parent
        if not inside_attention:
            totals[event.name] = totals.get(event.name, 0.0) + event.self_cpu_time_total
    return totals


if args.profile and P == 1:
    ours, theirs = outside_attention("attention2d"), outside_attention("sdpa")
    common = sorted(set(ours) & set(theirs), key=lambda n: -theirs[n])
    print("\nOps outside the attention, self CPU ms in one step (torch %d threads):"
          % torch.get_num_threads())
    print("| op | beside attention2d | beside sdpa | ratio |")
    print("|---|---|---|---|")
    for op in common[:12]:
        print("| %s | %.2f | %.2f | %.2f |" % (op, ours[op] / 1e3, theirs[op] / 1e3,
                                             ours[op] / max(theirs[op], 1e-9)))
    only = {n: v for n, v in ours.items() if n not in theirs}
    total_ours, total_theirs = sum(ours[n] for n in common), sum(theirs[n] for n in common)
    print("all %d common ops: %.2f ms beside attention2d, %.2f beside sdpa (%.2fx); ops only "
          "beside attention2d: %.2f ms (%s)" % (
              len(common), total_ours / 1e3, total_theirs / 1e3, total_ours / total_theirs,
              sum(only.values()) / 1e3, ", ".join(sorted(only)[:6]) or "none"))
dist.destroy_process_group()
