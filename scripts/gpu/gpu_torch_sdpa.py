#!/usr/bin/env python3
"""Times torch.nn.functional.scaled_dot_product_attention (its flash and cuDNN backends, bf16) on
the shapes scripts/gpu/gpu_check.sh times a2d's CUDA kernels on, and prints one JSON object per
(backend, shape, mode) with the same FLOP count as `a2d kernel`: forward 4 * pairs * D * H * B
(pairs = unmasked (query, key) pairs: N^2, or N (N + 1) / 2 causal), backward 2.5 times that.

  gpu_torch_sdpa.py --seqs 8192,16384,32768 --heads 16,32 [--head-dims 128,64] [--dry-run]

--dry-run prints the shapes and FLOP counts without importing torch (no GPU needed).
"""
import argparse
import json
import statistics
import sys


def flops(seq, heads, head_dim, causal, batch=1):
    pairs = seq * (seq + 1) // 2 if causal else seq * seq
    return 4.0 * pairs * head_dim * heads * batch


def shapes(args):
    for head_dim in args.head_dims:
        for heads in args.heads:
            for seq in args.seqs:
                for causal in (False, True):
                    yield head_dim, heads, seq, causal


def time_ms(torch, fn, warmup, repeats):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqs", default="8192,16384,32768")
    parser.add_argument("--heads", default="16,32")
    parser.add_argument("--head-dims", "--head-dim", default="128")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    args.seqs = [int(x) for x in args.seqs.split(",")]
    args.heads = [int(x) for x in args.heads.split(",")]
    args.head_dims = [int(x) for x in args.head_dims.split(",")]

    if args.dry_run:
        for head_dim, heads, seq, causal in shapes(args):
            print(json.dumps({"impl": "dry-run", "seq": seq, "heads": heads,
                              "head_dim": head_dim, "causal": causal,
                              "fwd_flops": flops(seq, heads, head_dim, causal)}))
        return 0

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"torch-flash": SDPBackend.FLASH_ATTENTION,
                "torch-cudnn": SDPBackend.CUDNN_ATTENTION}
    for head_dim, heads, seq, causal in shapes(args):
        shape = (1, heads, seq, head_dim)
        gen = torch.Generator(device="cuda").manual_seed(1)
        q, k, v, d_out = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
                          for _ in range(4))
        for name, backend in backends.items():
            record = {"impl": name, "seq": seq, "heads": heads, "head_dim": head_dim,
                      "causal": causal}
            try:
                with sdpa_kernel([backend]):
                    qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
                    fwd_ms = time_ms(torch, lambda: F.scaled_dot_product_attention(
                        q, k, v, is_causal=causal), args.warmup, args.repeats)
                    out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                    bwd_ms = time_ms(torch, lambda: torch.autograd.grad(
                        out, (qg, kg, vg), d_out, retain_graph=True), args.warmup, args.repeats)
                    del out, qg, kg, vg
            except RuntimeError as error:  # a backend that refuses the shape
                record["error"] = str(error).splitlines()[0]
                print(json.dumps(record), flush=True)
                continue
            f = flops(seq, heads, head_dim, causal)
            for mode, ms, mode_flops in (("forward", fwd_ms, f), ("backward", bwd_ms, 2.5 * f)):
                print(json.dumps(dict(record, mode=mode, ms=ms,
                                      tflops=mode_flops / (ms * 1e-3) / 1e12)), flush=True)
        del q, k, v, d_out
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
