#!/usr/bin/env bash
# Predicted ATTENTION2D-NO vs Ring Attention speedups in the paper's setting (docs/cost-model.md):
# GPT-3-like attention of 760M (16 heads x 96), 2.7B (32 x 80) and 13B (40 x 128), causal, bf16,
# batch 1; 16 and 64 GPUs; a100-hdr with 4 GPUs per node and h100-ndr with 1; N = 2^13 .. 2^17.
# ATTENTION2D-NO on its best grid (with the paper's K/V transpose); Ring Attention with zigzag.
#   scripts/paper_table.sh [A2D_BINARY]
set -euo pipefail
a2d=${1:-build/a2d}
python3 - "$a2d" <<'PY'
import json, subprocess, sys
a2d = sys.argv[1]
models = [("760M", 16, 96), ("2.7B", 32, 80), ("13B", 40, 128)]
setups = [("a100-hdr", 4), ("h100-ndr", 1)]
lengths = [2 ** k for k in range(13, 18)]
print("| machine | GPUs | model | " + " | ".join("N=2^%d" % (n.bit_length() - 1) for n in lengths) + " |")
print("|---|---|---|" + "---|" * len(lengths))
for machine, per_node in setups:
    for gpus in (16, 64):
        for name, heads, dim in models:
            cells = []
            for n in lengths:
                out = subprocess.run([a2d, "model", "--machine", machine, "--gpus", str(gpus),
                                      "--gpus-per-node", str(per_node), "--seq", str(n),
                                      "--heads", str(heads), "--head-dim", str(dim), "--causal",
                                      "--dtype", "bf16", "--json"],
                                     check=True, capture_output=True, text=True).stdout
                rows = [json.loads(line) for line in out.splitlines() if '"fwd_ms"' in line]
                total = lambda r: r["fwd_ms"] + r["bwd_ms"]
                a2d_no = min((r for r in rows if r["algo"] == "attention2d" and r["kv_transpose"]), key=total)
                ring = next(r for r in rows if r["algo"] == "ring")
                cells.append("%.1fx (%s)" % (total(ring) / total(a2d_no), a2d_no["grid"]))
            print("| %s | %d (%d/node) | %s | %s |" % (machine, gpus, per_node, name, " | ".join(cells)))
PY
