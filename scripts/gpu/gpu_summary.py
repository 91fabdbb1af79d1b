#!/usr/bin/env python3
"""The speed table of scripts/gpu/gpu_check.sh: a2d's CUDA kernel (`a2d kernel --json` lines) beside
torch SDPA's flash and cuDNN backends (scripts/gpu/gpu_torch_sdpa.py lines), TFLOP/s on unmasked
FLOPs, and the share of the faster torch backend against the targets of issue 21 (forward
>= 50 %, backward >= 40 %).

  gpu_summary.py A2D_JSONL TORCH_JSONL
"""
import json
import sys

TARGETS = {"forward": 0.50, "backward": 0.40}


def read(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    ours = {}
    for r in read(sys.argv[1]):
        key = (r["head_dim"], r["heads"], r["seq"], bool(r["causal"]), r["mode"])
        ours[key] = r["gflops"] / 1e3
    torch = {}
    for r in read(sys.argv[2]):
        if "tflops" not in r:
            continue
        key = (r["head_dim"], r["heads"], r["seq"], bool(r["causal"]), r["mode"])
        torch.setdefault(key, {})[r["impl"]] = r["tflops"]
    print(f"{'D':>3} {'H':>3} {'N':>6} {'causal':>6} {'mode':>8} {'a2d':>8} {'flash':>8} {'cudnn':>8}"
          f" {'share':>7} {'target':>7}  (TFLOP/s, bf16, B=1)")
    met = True
    for key in sorted(set(ours) | set(torch)):
        head_dim, heads, seq, causal, mode = key
        a2d = ours.get(key)
        flash = torch.get(key, {}).get("torch-flash")
        cudnn = torch.get(key, {}).get("torch-cudnn")
        best = max([x for x in (flash, cudnn) if x is not None], default=None)
        share = a2d / best if a2d is not None and best else None
        ok = share is not None and share >= TARGETS[mode]
        met = met and ok

        def cell(x, fmt="8.1f"):
            return format(x, fmt) if x is not None else f"{'-':>8}"
        print(f"{head_dim:>3} {heads:>3} {seq:>6} {str(causal):>6} {mode:>8} {cell(a2d)} {cell(flash)}"
              f" {cell(cudnn)} {cell(share * 100 if share else None, '6.1f')}%"
              f" {'met' if ok else 'MISSED':>7}")
    generate = [r["generate_ms"] for r in read(sys.argv[1]) if "generate_ms" in r]
    if generate:
        print(f"input generation (a2d kernel's generate_ms, all cores): up to {max(generate):.0f} ms"
              " a run")
    if not ours or not torch:
        print("speed targets: no measurements (a2d rows: %d, torch rows: %d)"
              % (len(ours), len(torch)))
        return 0
    print("speed targets:", "all met" if met else "NOT all met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
