"""The Python side of scripts/cluster/soak.sh: one long-lived process per rank (under mpirun, mpi4py's
COMM_WORLD) making attention2d calls back to back until STOP_FILE exists: forward and backward
with changing shapes, masks, algorithms and dtypes (float32, bfloat16, float16 torch tensors;
float32 numpy arrays, forward only), each checked against an fp64 reference within the dtype's
bound, and every DECODE_EVERY calls a long decode run (a prefill, then DECODE_STEPS steps, each
step's O and LSE checked). Every shape is drawn from a fixed list in an order from SEED, so the
whole list is visited early (the soak's warm-up) and memory may only grow by leaking.

    mpirun -np 2 python3 scripts/cluster/soak_python.py SEED STATUS_FILE STOP_FILE

Rank 0 rewrites STATUS_FILE after every call: "calls N wrong W failed F decode_steps S rss_kib R
pid P"; rank 1 rewrites STATUS_FILE.1: "pid P rss_kib R" (R: the rank's resident memory right
after the call's gc.collect() and malloc_trim(0), at rest). Exits 0 when asked to stop, 1 if any
call was wrong or failed."""

import ctypes
import gc
import os
import random
import sys
import traceback

import numpy as np
import torch
from mpi4py import MPI

import attention2d
from attention2d import _core

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
LIBC = ctypes.CDLL("libc.so.6")
# A leak on purpose, for a check of the soak itself (A2D_SOAK_LEAK_KIB=16: 16 KiB per call that
# are never freed; docs/reliability.md, "A soak"). Never set otherwise.
LEAK_KIB = int(os.environ.get("A2D_SOAK_LEAK_KIB", "0"))
LEAKED = []
DECODE_EVERY = 30
DECODE_STEPS = 100

# (seq, heads, kv_heads, head_dim): GQA, MQA and MHA, N below and above a few tiles.
SHAPES = [(37, 4, 2, 16), (129, 4, 4, 48), (200, 8, 2, 32), (96, 2, 1, 64)]
MASKS = [(False, 0), (True, 0), (True, 17)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16, "numpy"]
ALGOS = ["auto", "ring", "allgather-kv", "attention2d", "ulysses"]


def reference(q, k, v, dout, causal, window, scale):
    """fp64 attention of the full sequence and its gradients: O, LSE, dQ, dK, dV."""
    q, k, v = (t.double().detach().requires_grad_(True) for t in (q, k, v))
    groups = q.shape[2] // k.shape[2]
    kk, vv = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    n = q.shape[1]
    if causal:
        pos = torch.arange(n)
        visible = pos[None, :] <= pos[:, None]
        if window:
            visible &= pos[None, :] > pos[:, None] - window
        scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), vv)
    grads = torch.autograd.grad(out, (q, k, v), dout.double()) if dout is not None else None
    return out.detach(), lse.detach(), grads


def relative(a, b):
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def one_call(rng, call):
    seq, heads, kv_heads, head_dim = SHAPES[call % len(SHAPES)]
    causal, window = MASKS[(call // len(SHAPES)) % len(MASKS)]
    dtype = DTYPES[(call // (len(SHAPES) * len(MASKS))) % len(DTYPES)]
    algo = rng.choice(ALGOS)
    if algo == "ulysses" and (heads % SIZE or kv_heads % SIZE):
        algo = "auto"
    generator = torch.Generator().manual_seed(call)
    full = [torch.randn(1, seq, h, head_dim, generator=generator)
            for h in (heads, kv_heads, kv_heads, heads)]
    q, k, v, dout = full
    if dtype not in ("numpy", torch.float32):
        q, k, v, dout = (t.to(dtype).float() for t in full)  # the values the engine sees
    name = "float32" if dtype in ("numpy", torch.float32) else str(dtype).replace("torch.", "")
    bounds = _core.output_bounds({"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[name])
    backward = dtype != "numpy"
    ref_out, ref_lse, grads = reference(q, k, v, dout if backward else None, causal, window,
                                        head_dim ** -0.5)
    lay = "contiguous"

    def mine(x):
        local = attention2d.shard(x, lay)
        if dtype == "numpy":
            return local.numpy()
        return local.to(dtype).requires_grad_(backward)

    ql, kl, vl = mine(q), mine(k), mine(v)
    kwargs = dict(causal=causal, window=window, algo=algo, layout=lay, return_lse=True)
    out, lse = attention2d.attention(ql, kl, vl, **kwargs)
    errors = {"out": relative(out, attention2d.shard(ref_out, lay)),
              "lse": relative(lse, attention2d.shard(ref_lse, lay, dim=2))}
    if backward:
        out.backward(attention2d.shard(dout, lay).to(dtype))
        for label, local, expected in (("dq", ql, grads[0]), ("dk", kl, grads[1]),
                                       ("dv", vl, grads[2])):
            errors[label] = relative(local.grad, attention2d.shard(expected, lay))
    limits = {"out": bounds["out"], "lse": bounds["lse"], "dq": bounds["dq"],
              "dk": bounds["dk"], "dv": bounds["dv"]}
    # Relative Frobenius norms over the whole sequence: sum the squares over the ranks.
    bad = [label for label, e in errors.items() if e > limits[label] * 4]
    return bad, (seq, heads, kv_heads, head_dim, causal, window, name, algo, errors)


def decode_run(call):
    heads, kv_heads, head_dim, prompt = 6, 2, 32, 41
    total = prompt + DECODE_STEPS
    generator = torch.Generator().manual_seed(10_000 + call)
    q, k, v = (torch.randn(1, total, h, head_dim, generator=generator)
               for h in (heads, kv_heads, kv_heads))
    ref_out, ref_lse, _ = reference(q, k, v, None, True, 0, head_dim ** -0.5)
    dec = attention2d.Decoder(prompt=prompt, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    bounds = _core.output_bounds("fp32")
    index = torch.from_numpy(dec.layout.tokens())
    worst = 0.0
    out, lse = dec.prefill(*(x.index_select(1, index).contiguous() for x in (q, k, v)))
    steps = 0
    while dec.sequence < total:
        positions = torch.from_numpy(dec.next_positions(1))
        out, lse = dec.step(*(x.index_select(1, positions).contiguous() for x in (q, k, v)),
                            tokens=1)
        if len(positions):
            worst = max(worst, relative(out, ref_out.index_select(1, positions)))
        steps += 1
    return worst <= bounds["out"] * 4, steps


def resident_kib():
    """VmRSS of this process, in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    seed, status_file, stop_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    rng = random.Random(seed)
    order = list(range(len(SHAPES) * len(MASKS) * len(DTYPES)))
    rng.shuffle(order)
    calls = wrong = failed = decode_steps = attention_calls = 0
    if RANK > 0:
        with open(f"{status_file}.{RANK}", "w") as f:
            f.write(f"pid {os.getpid()} rss_kib {resident_kib()}\n")
    while True:
        stop = COMM.bcast(os.path.exists(stop_file) if RANK == 0 else None, root=0)
        if stop:
            break
        try:
            if calls % DECODE_EVERY == DECODE_EVERY - 1:
                ok, steps = decode_run(calls)
                decode_steps += steps
                bad, what = ([] if ok else ["decode"]), ("decode", steps)
            else:
                bad, what = one_call(rng, order[attention_calls % len(order)])
                attention_calls += 1
            # Every rank's verdict, so that all ranks count the call the same way.
            bad = sorted(set(sum(COMM.allgather(bad), [])))
            if bad:
                wrong += 1
                if RANK == 0:
                    print(f"soak_python: call {calls} wrong ({', '.join(bad)}): {what}",
                          file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - counted and shown; the soak goes on
            failed += 1
            print(f"soak_python: rank {RANK} call {calls} failed:\n{traceback.format_exc()}",
                  file=sys.stderr, flush=True)
        calls += 1
        if LEAK_KIB:
            LEAKED.append(bytearray(1024 * LEAK_KIB))
        # What the process holds, not what the allocator keeps cached: the sampled RSS then
        # follows live memory (a leak), not the high-water mark of the largest shape so far.
        gc.collect()
        LIBC.malloc_trim(0)
        # This rank's resident memory at rest, between calls: what scripts/cluster/soak.sh samples (an
        # outside read of /proc lands inside a call at random, up to 20 MiB above it).
        rss = resident_kib()
        if RANK == 0:
            with open(status_file + ".tmp", "w") as f:
                f.write(f"calls {calls} wrong {wrong} failed {failed} decode_steps {decode_steps}"
                        f" rss_kib {rss} pid {os.getpid()}\n")
            os.replace(status_file + ".tmp", status_file)
        else:
            with open(f"{status_file}.{RANK}.tmp", "w") as f:
                f.write(f"pid {os.getpid()} rss_kib {rss}\n")
            os.replace(f"{status_file}.{RANK}.tmp", f"{status_file}.{RANK}")
    failed = COMM.allreduce(failed)
    return 1 if wrong or failed else 0


if __name__ == "__main__":
    sys.exit(main())
