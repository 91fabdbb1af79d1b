#!/usr/bin/env python3
"""Tables (and a plot) of the simulations' JSON lines, for docs/simulation.md.

    sim/report.py paper docs/sim/paper.jsonl
    sim/report.py scale docs/sim/scale-p*.jsonl [--plot docs/sim/speedup_vs_p.svg]
    sim/report.py trust docs/sim/trust.jsonl
    sim/report.py phases FILE.jsonl          (every row, phase by phase: simulated, the device's
                                              kernel and data time in it, predicted)
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections import defaultdict

# The paper's own figures (arXiv 2503.15758, abstract): its largest speedups over Ring Attention,
# on a GPT-3-like model; the per-configuration measurements were not recovered
# (/work/shared/paper/ALGORITHM.md, section 9).
PAPER = {("a100-16x4", 64): "up to 5x", ("h100-64x1", 64): "up to 9.4x"}


def rows_of(paths):
    rows = []
    for path in paths if isinstance(paths, list) else [paths]:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.startswith("{")]
    return rows


def total(r, prefix=""):
    return r[prefix + "fwd_ms"] + r.get(prefix + "bwd_ms", 0.0)


def pred_total(r):
    return r["pred_fwd_ms"] + r.get("pred_bwd_ms", 0.0)


def paper(path):
    rows = [r for r in rows_of(path) if "skipped" not in r]
    groups = defaultdict(dict)
    for r in rows:
        groups[(r["platform"], r["ranks"], r["model"], r["seq"])][r["algo"]] = r
    models = ["760M", "2.7B", "13B"]
    seqs = sorted({r["seq"] for r in rows})
    testbeds = [("a100-16x4", "a100-hdr: 16 nodes x 4 A100"), ("h100-64x1", "h100-ndr: 64 nodes x 1 H100")]
    print("Cells: simulated speedup of ATTENTION2D-NO / ATTENTION2D-O over Ring Attention (forward +"
          " backward), and in brackets the cost model's for ATTENTION2D-NO.\n")
    for platform, label in testbeds:
        for p in (16, 64):
            keys = [k for k in groups if k[0] == platform and k[1] == p]
            if not keys:
                continue
            side = int(math.isqrt(p))
            per_node = groups[keys[0]]["ring"]["gpus_per_node"]
            note = PAPER.get((platform, p), "")
            print(f"**{label}, P = {p} ({p // per_node} nodes), grid {side} x {side}**"
                  + (f" (paper, measured: {note})" if note else "") + "\n")
            print("| model | " + " | ".join(f"N = 2^{int(math.log2(n))}" for n in seqs) + " |")
            print("|---|" + "---|" * len(seqs))
            for model in models:
                cells = []
                for n in seqs:
                    g = groups.get((platform, p, model, n), {})
                    if not {"attention2d", "attention2d-overlap", "ring"} <= g.keys():
                        cells.append("-")
                        continue
                    ring = total(g["ring"])
                    no, ov = ring / total(g["attention2d"]), ring / total(g["attention2d-overlap"])
                    pred = pred_total(g["ring"]) / pred_total(g["attention2d"])
                    cells.append(f"{no:.2f} / {ov:.2f} ({pred:.2f})")
                print(f"| {model} | " + " | ".join(cells) + " |")
            print()
    # Simulated against predicted time, per algorithm: where the two differ.
    print("Simulated / predicted time (forward + backward), over the rows above:\n")
    print("| testbed | P | algorithm | min | median | max |")
    print("|---|---|---|---|---|---|")
    by = defaultdict(list)
    for r in rows:
        by[(r["platform"], r["ranks"], r["algo"])].append(total(r) / pred_total(r))
    for (platform, p, algo), ratios in sorted(by.items()):
        ratios.sort()
        print(f"| {platform} | {p} | {algo} | {ratios[0]:.2f} | {ratios[len(ratios) // 2]:.2f} | "
              f"{ratios[-1]:.2f} |")
    print()


def label(r):
    shape = r["grid"] if r["algo"] in ("attention2d", "attention2d-overlap") else (
        f"U{r['heads_parallel']} {r['grid']}" if r["algo"] == "hybrid" else r["layout"])
    return f"{r['algo']} {shape}" + ("" if r.get("kv_transpose", True) or r["algo"] not in (
        "attention2d", "attention2d-overlap", "hybrid") else " nt")


def ring_time(group):
    """Ring Attention's fwd + bwd: simulated, or (marked) the model's where it was not simulated."""
    for r in group:
        if r.get("algo") == "ring" and "fwd_ms" in r and "failed" not in r:
            return total(r), ""
    for r in group:
        if r.get("algo") == "ring" and r.get("model_only"):
            return pred_total(r), " (Ring: model)"
    return None, ""


def scale(path, plot):
    rows = rows_of(path)
    groups = defaultdict(list)
    for r in rows:
        groups[(r["ranks"], r["seq"])].append(r)
    print("| P | N | plan (spec) | sim fwd+bwd ms | model ms | sim / model | planner's rank |"
          " over Ring (sim) | sim wall s | sim RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    best = {}
    for (p, n), group in sorted(groups.items()):
        ran = [r for r in group if "skipped" not in r and "failed" not in r]
        ring, ring_note = ring_time(group)
        seen = set()
        for r in sorted(group, key=lambda r: total(r) if ("fwd_ms" in r and "failed" not in r)
                        else 1e30):
            key = label(r) if "grid" in r else r["spec"]
            if key in seen:
                continue
            seen.add(key)
            if "skipped" in r or "failed" in r:
                why = r.get("skipped") or r.get("failed")
                model = f"{pred_total(r):.2f}" if r.get("model_only") else ""
                print(f"| {p} | 2^{int(math.log2(n))} | {r.get('spec', key)} | {why} | {model} |"
                      " | | | | |")
                continue
            speed = f"{ring / total(r):.2f}x{ring_note}" if ring else "-"
            print(f"| {p} | 2^{int(math.log2(n))} | {key} ({r['spec']}) | {total(r):.2f} | "
                  f"{pred_total(r):.2f} | {total(r) / pred_total(r):.2f} | "
                  f"{r['planner_rank'] if r['planner_rank'] > 0 else '-'} | {speed} | "
                  f"{r.get('sim_wall_s', r.get('wall_s', 0)):.0f} | {r.get('sim_max_rss_mib') or ''} |")
        if ran:
            fastest = min(ran, key=total)
            planned = [r for r in ran if r["planner_rank"] == 1]
            best[(p, n)] = (fastest, planned[0] if planned else None, ring, ring_note, group)
    print()
    print("| P | N | simulated best | planner's choice | regret (its sim time / best's) |"
          " best over Ring (sim) | best ATTENTION2D (NO, O) over Ring (sim) | (model) |")
    print("|---|---|---|---|---|---|---|---|")
    curve = defaultdict(dict)
    for (p, n), (fastest, planned, ring, ring_note, group) in sorted(best.items()):
        a2d = [r for r in group if "fwd_ms" in r and "failed" not in r
               and r["algo"].startswith("attention2d")]
        ring_model = next((pred_total(r) for r in group if r.get("algo") == "ring"
                           and "pred_fwd_ms" in r), None)
        speed = model_speed = "-"
        if ring and a2d:
            b = min(a2d, key=total)
            sim_speed = ring / total(b)
            speed = f"{sim_speed:.2f}x{ring_note}"
            if ring_model:
                pred_speed = ring_model / min(pred_total(r) for r in a2d)
                model_speed = f"{pred_speed:.2f}x"
                curve[n][p] = (sim_speed, pred_speed)
        regret = f"{total(planned) / total(fastest):.2f}" if planned else "not simulated"
        overall = f"{ring / total(fastest):.2f}x{ring_note}" if ring else "-"
        print(f"| {p} | 2^{int(math.log2(n))} | {label(fastest)} | "
              f"{label(planned) if planned else '-'} | {regret} | {overall} | {speed} | "
              f"{model_speed} |")
    print()
    if plot:
        write_plot(curve, plot)


def write_plot(curve, path):
    """Best ATTENTION2D over Ring Attention against P (simulated, and the model's), with sqrt(P)/2
    for the words ratio's slope; gnuplot, SVG."""
    with tempfile.TemporaryDirectory() as tmp:
        series = []
        for n, points in sorted(curve.items()):
            data = os.path.join(tmp, f"n{n}.dat")
            with open(data, "w") as f:
                for p, (sim, model) in sorted(points.items()):
                    f.write(f"{p} {sim} {model}\n")
            exp = int(math.log2(n))
            series.append(f"'{data}' using 1:2 with linespoints title 'simulated, N = 2^{exp}'")
            series.append(f"'{data}' using 1:3 with lines dashtype 2 title 'model, N = 2^{exp}'")
        series.append("sqrt(x)/2 with lines dashtype 3 lc rgb 'gray' title 'sqrt(P)/2'")
        script = f"""set terminal svg size 720,480 dynamic font 'Arial,12'
set output '{os.path.abspath(path)}'
set logscale xy 2
set xlabel 'GPUs P (H100, 8 per node, NDR fat tree)'
set ylabel 'speedup over Ring Attention (fwd + bwd)'
set key left top
set grid
set title 'Best ATTENTION2D over Ring Attention, simulated in SimGrid (a simulation, not a measurement)'
plot {', '.join(series)}
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    print(f"plot: {path}")


def trust(path):
    rows = rows_of(path)
    print("| P | N | plan | phase | measured ms | simulated ms | sim / measured | model ms |")
    print("|---|---|---|---|---|---|---|---|")
    errors = []
    pairs = defaultdict(dict)
    for r in rows:
        pairs[(r["ranks"], r["seq"], label(r))][r["source"]] = r
    for (p, n, name), both in sorted(pairs.items()):
        if not {"measured", "simulated"} <= both.keys():
            continue
        m, s = both["measured"], both["simulated"]
        for direction, key in (("forward", "fwd_ms"), ("backward", "bwd_ms")):
            phases = sorted(k[3:] for k in m if k.startswith(f"ms.{direction}.")
                            and not k.endswith(".setup"))
            for phase in phases + [direction]:
                mv = m["ms." + phase] if phase != direction else m[key]
                sv = s.get("ms." + phase, 0.0) if phase != direction else s[key]
                pv = s.get("pred_ms." + phase) if phase != direction else s.get("pred_" + key)
                ratio = sv / mv if mv > 0 else float("nan")
                if phase == direction:
                    errors.append(ratio)
                bold = "**" if phase == direction else ""
                print(f"| {p} | 2^{int(math.log2(n))} | {name} | {bold}{phase}{bold} | {mv:.1f} | "
                      f"{sv:.1f} | {ratio:.2f} | {'' if pv is None else format(pv, '.1f')} |")
    if errors:
        errors.sort()
        dev = [abs(math.log(e)) for e in errors]
        print(f"\nWhole directions: simulated / measured from {errors[0]:.2f} to {errors[-1]:.2f}, "
              f"median {errors[len(errors) // 2]:.2f}; {sum(d <= math.log(1.25) for d in dev)} of "
              f"{len(errors)} within 25 %.")


def phases(path):
    for r in rows_of(path):
        if "skipped" in r or "failed" in r:
            why = "skipped: " + r["skipped"] if "skipped" in r else "failed: " + r["failed"]
            print(f"{r.get('spec', r.get('algo'))} P={r.get('ranks')} N={r.get('seq')}: {why}")
            continue
        print(f"== {label(r)} P={r['ranks']} N={r['seq']}: fwd {r['fwd_ms']:.3f} ms (pred "
              f"{r['pred_fwd_ms']:.3f}), bwd {r.get('bwd_ms', 0):.3f} (pred {r.get('pred_bwd_ms', 0):.3f})")
        print(f"   {'phase':40s} {'sim':>9s} {'dev.kern':>9s} {'dev.data':>9s} {'pred':>9s}")
        for p in sorted(k[3:] for k in r if k.startswith("ms.")):
            pred = r.get("pred_ms." + p)
            print(f"   {p:40s} {r['ms.' + p]:9.3f} {r.get('dev_kernel_ms.' + p, 0):9.3f} "
                  f"{r.get('dev_data_ms.' + p, 0):9.3f} {'' if pred is None else format(pred, '9.3f')}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=["paper", "scale", "trust", "phases"])
    parser.add_argument("jsonl", nargs="+")
    parser.add_argument("--plot")
    args = parser.parse_args()
    {"paper": lambda: paper(args.jsonl), "scale": lambda: scale(args.jsonl, args.plot),
     "trust": lambda: trust(args.jsonl), "phases": lambda: phases(args.jsonl)}[args.kind]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
