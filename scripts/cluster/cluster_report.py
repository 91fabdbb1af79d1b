#!/usr/bin/env python3
"""Tables and plots of scripts/cluster/cluster_bench.sh's rows (one JSON object per line).

    scripts/cluster/cluster_report.py cluster-bench.jsonl [--plots docs/cluster] > report.md
    scripts/cluster/cluster_report.py scaling.jsonl --scaling docs/cluster/scaling.svg > scaling.md

Per configuration (P, ranks per host, link rate): every row's measured forward and backward
time beside the prediction of the cluster's machine file; the speedup of the best ATTENTION2D
row (either variant, any grid, forward + backward) over Ring Attention and over all-gather K/V;
the words ratio (bytes a rank sends, Ring over that best ATTENTION2D row); the planner's regret
(the measured time of the plan `a2d plan` ranked first over the fastest measured row); the load
average before and after. A row is "communication-dominated" when the model puts less than half
of its forward + backward time in the kernels.

--scaling PLOT.svg: instead, one table with a line per configuration (P, link rate): Ring
Attention, all-gather K/V, Ulysses, the hybrid and the best ATTENTION2D row, forward + backward,
measured and predicted, the best ATTENTION2D row's speedup over Ring measured and predicted, and
how many communication-dominated rows the model put within 25 % of their measured time; and a
plot of that speedup against P, one line per link rate (solid: measured, dashed: model).
"""
import argparse
import collections
import json
import math
import os
import subprocess
import sys


def total(row, key):
    f, b = row.get(f"{key}fwd_ms"), row.get(f"{key}bwd_ms")
    if f is None or b is None or (isinstance(f, float) and math.isnan(f)):
        return float("nan")
    return f + b


def measured(row):
    return row["fwd_ms"] + row["bwd_ms"]


def predicted(row):
    f, b = row.get("pred_fwd_ms"), row.get("pred_bwd_ms")
    return f + b if f is not None and b is not None else float("nan")


def name(row):
    if row["algo"] == "hybrid":
        return f"hybrid {row['heads_parallel']} x ({row['grid']})"
    if row["algo"].startswith("attention2d"):
        short = "A2D-O" if row["algo"] == "attention2d-overlap" else "A2D-NO"
        text = f"{short} {row['grid']}" + ("" if row.get("kv_transpose", True) else " nt")
    else:
        text = {"ring": "Ring", "allgather-kv": "all-gather K/V",
                "ulysses": "Ulysses"}[row["algo"]] + f" ({row['layout']})"
    return text + (" round-robin" if round_robin(row.get("placement")) else "")


def round_robin(placement):
    """Rank q on node q mod nodes (mpirun --map-by node); rows of docs/cluster/*.jsonl written
    before 2026-12 call it "cyclic"."""
    return placement in ("round-robin", "cyclic")


def comm_share(row):
    kernel = row.get("pred_ms.forward.kernel", 0) + row.get("pred_ms.backward.kernel", 0)
    p = predicted(row)
    return 1 - kernel / p if p and not math.isnan(p) else float("nan")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("rows")
    parser.add_argument("--plots", default="")
    parser.add_argument("--scaling", default="", help="the scaling table, and its plot here")
    parser.add_argument("--detail", default="",
                        help="P,S,RATE: where the time of that configuration's rows goes")
    args = parser.parse_args()
    rows = [json.loads(line) for line in open(args.rows) if line.startswith("{")]
    if args.scaling:
        print(scaling(rows, args.scaling))
        return
    configs = collections.OrderedDict()
    for r in rows:
        configs.setdefault((r["P"], r["slots"], r["rate_mbit"], r["link"]), []).append(r)
    out = []
    summary = []
    within = [0, 0]
    for (p, s, rate, link), group in sorted(configs.items()):
        ran = [r for r in group if "skipped" not in r]
        if not ran:
            continue
        first = group[0]
        problem = (f"N={first['seq']} H={first['heads']} D={first['head_dim']}"
                   f"{' causal' if first['causal'] else ''} {first['dtype']}")
        out.append(f"\n#### P = {p}: {p // s} hosts x {s}, {rate} Mbit/s per {link}, {problem}\n")
        cpu = first.get("cpu_shares")
        cpu_text = (f"; the machine's CPU over the benches: user {cpu['user']:.0%}, system "
                    f"{cpu['system']:.0%}, softirq {cpu['softirq']:.0%}, idle {cpu['idle']:.0%}"
                    if cpu else "")
        out.append(f"load average before / after: {first['load_before']} / "
                   f"{first['load_after']}{cpu_text}\n")
        out.append("| plan | fwd ms (meas / pred) | bwd ms (meas / pred) | total m/p | "
                   "MB sent per rank fwd+bwd | comm share (model) |")
        out.append("|---|---|---|---|---|---|")
        for r in sorted(ran, key=measured):
            ratio = measured(r) / predicted(r) if predicted(r) > 0 else float("nan")
            share = comm_share(r)
            if share > 0.5 and not math.isnan(ratio):
                within[1] += 1
                within[0] += abs(ratio - 1) <= 0.25
            out.append(f"| {name(r)} | {r['fwd_ms']:.0f} / {r.get('pred_fwd_ms', float('nan')):.0f} "
                       f"| {r['bwd_ms']:.0f} / {r.get('pred_bwd_ms', float('nan')):.0f} | "
                       f"{ratio:.2f} | {(r['bytes_sent_fwd'] + r['bytes_sent_bwd']) / 1e6:.2f} | "
                       f"{share:.0%} |")
        a2d = [r for r in ran if r["algo"].startswith("attention2d")]
        best = min(a2d, key=measured)
        ring = min((r for r in ran if r["algo"] == "ring"), key=measured, default=None)
        gather = min((r for r in ran if r["algo"] == "allgather-kv"), key=measured, default=None)
        fastest = min(ran, key=measured)
        chosen = next((r for r in ran if r["algo"] == first["plan_algo"] and
                       round_robin(r.get("placement")) ==
                       round_robin(first.get("plan_placement")) and
                       (not r["algo"].startswith("attention2d") or
                        (r["grid"] == first["plan_grid"] and
                         r.get("kv_transpose", True) == first["plan_kv_transpose"]))), None)
        regret = measured(chosen) / measured(fastest) - 1 if chosen else float("nan")
        words = ((ring["bytes_sent_fwd"] + ring["bytes_sent_bwd"]) /
                 (best["bytes_sent_fwd"] + best["bytes_sent_bwd"])) if ring else float("nan")
        entry = {"P": p, "slots": s, "rate": rate, "link": link, "best": name(best),
                 "over_ring": measured(ring) / measured(best) if ring else float("nan"),
                 "over_ring_pred": predicted(ring) / predicted(best) if ring else float("nan"),
                 "over_gather": measured(gather) / measured(best) if gather else float("nan"),
                 "words": words, "plan": name(chosen) if chosen else first["plan_algo"],
                 "regret": regret, "fastest": name(fastest),
                 "load": f"{first['load_before'].split()[0]} / {first['load_after'].split()[0]}"}
        summary.append(entry)
        out.append(f"\nbest ATTENTION2D: {entry['best']}; over Ring {entry['over_ring']:.2f}x "
                   f"(predicted {entry['over_ring_pred']:.2f}x), over all-gather K/V "
                   f"{entry['over_gather']:.2f}x; words ratio {words:.2f}; a2d plan's first: "
                   f"{entry['plan']}, regret {regret:+.0%} (fastest: {entry['fastest']})\n")
    head = ["\n| P | hosts x ranks | Mbit/s | best ATTENTION2D | over Ring (pred) | "
            "over all-gather K/V | words ratio | a2d plan's first | regret | load 1-min "
            "before / after |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for e in summary:
        head.append(f"| {e['P']} | {e['P'] // e['slots']} x {e['slots']} | {e['rate']} | "
                    f"{e['best']} | {e['over_ring']:.2f}x ({e['over_ring_pred']:.2f}x) | "
                    f"{e['over_gather']:.2f}x | {e['words']:.2f} | {e['plan']} | "
                    f"{e['regret']:+.0%}{' ✗' if e['regret'] > 0.15 else ''} | {e['load']} |")
    ok = sum(1 for e in summary if e["regret"] <= 0.15)
    head.append(f"\nPlanner within 15 % of the fastest measured plan on {ok} of {len(summary)} "
                f"configurations. Communication-dominated rows (model: kernels < 50 % of the "
                f"time) within ±25 % of their prediction: {within[0]} of {within[1]}.")
    print("\n".join(head + out))
    if args.detail:
        p, s_, rate = (int(x) for x in args.detail.split(","))
        group = [r for r in rows if (r["P"], r["slots"], r["rate_mbit"]) == (p, s_, rate)
                 and "skipped" not in r]
        print(detail(group, rate))
    if args.plots:
        plot(summary, args.plots)


def within_25(group):
    """Communication-dominated rows (the model puts < 50 % of the time in the kernels) and how
    many of them the model predicts within 25 % of the measured forward + backward time."""
    dominated = [r for r in group if comm_share(r) > 0.5 and predicted(r) > 0]
    return sum(abs(measured(r) / predicted(r) - 1) <= 0.25 for r in dominated), len(dominated)


def scaling(rows, plot_path):
    configs = collections.OrderedDict()
    for r in rows:
        if "skipped" not in r:
            configs.setdefault((r["P"], r["slots"], r["rate_mbit"]), []).append(r)
    lines = ["| P | hosts x ranks | Mbit/s | Ring | all-gather K/V | Ulysses | hybrid | best ATTENTION2D | "
             "its speedup over Ring (model) | comm.-dominated rows within 25 % | load before / "
             "after |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    points = []

    def cell(group, algo):
        picked = [r for r in group if r["algo"] == algo]
        if not picked:
            return "–", None
        best = min(picked, key=measured)
        return f"{measured(best):.0f} ({predicted(best):.0f})", best

    for (p, slots, rate), group in sorted(configs.items()):
        ring_text, ring = cell(group, "ring")
        gather_text, _ = cell(group, "allgather-kv")
        ulysses_text, _ = cell(group, "ulysses")
        hybrid_text, hybrid = cell(group, "hybrid")
        a2d = min((r for r in group if r["algo"].startswith("attention2d")), key=measured)
        over = measured(ring) / measured(a2d) if ring else float("nan")
        over_pred = predicted(ring) / predicted(a2d) if ring else float("nan")
        if slots == 1:
            points.append((p, rate, over, over_pred))
        ok, dominated = within_25(group)
        if hybrid:
            hybrid_text = f"{hybrid_text} {hybrid['heads_parallel']} x {hybrid['grid']}"
        first = group[0]
        lines.append(f"| {p} | {p // slots} x {slots} | {rate} | {ring_text} | {gather_text} | {ulysses_text} | "
                     f"{hybrid_text} | {name(a2d)}: {measured(a2d):.0f} ({predicted(a2d):.0f}) | "
                     f"{over:.2f}x ({over_pred:.2f}x) | {ok} of {dominated} | "
                     f"{first['load_before'].split()[0]} / {first['load_after'].split()[0]} |")
    lines.append("\nms, forward + backward, the slowest rank's median; in brackets the cost "
                 "model's prediction from the cluster's machine file. The plot: one rank per host.")
    rates = sorted({q[1] for q in points})
    ps = sorted({q[0] for q in points})
    data = "\n".join(" ".join([str(p)] + [next((f"{o:.4f} {m:.4f}" for (pp, rr, o, m) in points
                                                 if pp == p and rr == r), "NaN NaN")
                                           for r in rates]) for p in ps)
    speedup_plot(plot_path, "Best ATTENTION2D over Ring Attention, forward + backward, one rank "
                 "per emulated host", "ranks P", "speedup over Ring",
                 f"set logscale x 2\nset xrange [{min(ps) * 0.8}:{max(ps) * 1.25}]\n"
                 f"set xtics ({', '.join(str(p) for p in ps)})\nset yrange [0:*]\n",
                 data, [f"{r} Mbit/s" for r in rates], model_points=True)
    return "\n".join(lines)


def detail(group, rate):
    """Per row: the link's time for the bytes the busiest rank sends (its bound where one link per
    rank carries them), the kernels' measured and predicted time, the measured total, and how much
    of the shorter of link and kernel time the row hid (1: perfect overlap, 0: none, < 0: more
    than their sum)."""
    bytes_per_ms = rate * 1e6 / 8 / 1e3
    lines = ["\n| plan | link time ms (bytes / rate) | kernel ms measured (pred) | other measured ms | "
             "total ms | hidden of min(link, kernel) |", "|---|---|---|---|---|---|"]
    for r in sorted(group, key=measured):
        link = (r["bytes_sent_fwd"] + r["bytes_sent_bwd"]) / bytes_per_ms
        kernel = r.get("ms.forward.kernel", 0) + r.get("ms.backward.kernel", 0)
        kernel_pred = r.get("pred_ms.forward.kernel", 0) + r.get("pred_ms.backward.kernel", 0)
        phases = sum(v for k, v in r.items() if k.startswith("ms.") and not k.endswith(".kernel"))
        hidden = (link + kernel - measured(r)) / min(link, kernel) if min(link, kernel) > 0 else 0
        lines.append(f"| {name(r)} | {link:.0f} | {kernel:.0f} ({kernel_pred:.0f}) | {phases:.0f} | "
                     f"{measured(r):.0f} | {hidden:+.2f} |")
    return "\n".join(lines)


def plot(summary, directory):
    """Measured speedup (solid) and the model's (dashed) of the best ATTENTION2D row over Ring
    Attention, against P per link rate and against the link rate per P, one pair of plots per
    ranks-per-host."""
    os.makedirs(directory, exist_ok=True)
    for slots in sorted({e["slots"] for e in summary}):
        picked = [e for e in summary if e["slots"] == slots]
        rates = sorted({e["rate"] for e in picked})
        ps = sorted({e["P"] for e in picked})

        def value(p, r, key):
            return next((f"{e[key]:.4f}" for e in picked if e["P"] == p and e["rate"] == r), "NaN")

        data_p = "\n".join(" ".join([str(p)] + [value(p, r, k) for r in rates
                                                  for k in ("over_ring", "over_ring_pred")])
                           for p in ps)
        data_r = "\n".join(" ".join([str(r)] + [value(p, r, k) for p in ps
                                                  for k in ("over_ring", "over_ring_pred")])
                           for r in rates)
        for kind, data, series, xlabel, logx in (
                ("p", data_p, [f"{r} Mbit/s" for r in rates], "ranks P", "set logscale x 2\n"),
                ("rate", data_r, [f"P = {p}" for p in ps], "link rate (Mbit/s)",
                 "set logscale x 10\n")):
            target = os.path.join(directory, f"speedup_vs_{kind}_{slots}_per_host.svg")
            speedup_plot(target, f"Best ATTENTION2D over Ring Attention, forward + backward, "
                         f"{slots} rank(s) per host (solid: measured, dashed: model)", xlabel,
                         "speedup", logx, data, series)


def speedup_plot(target, title, xlabel, ylabel, axes, data, series, model_points=False):
    """An SVG of measured (solid) and predicted (dashed) speedups: data has x, then per series
    its measured and its predicted value; axes holds gnuplot's axis settings."""
    curves = []
    for i, name_ in enumerate(series):
        measured_title, model_title = ((f"{name_}, measured", f"{name_}, model") if model_points
                                       else (name_, f"{name_}, model"))
        curves.append(f"$data using 1:{2 * i + 2} with linespoints lc {i + 1} pt 7 "
                      f"title '{measured_title}'")
        model_style = "linespoints pt 6" if model_points else "lines"
        curves.append(f"$data using 1:{2 * i + 3} with {model_style} lc {i + 1} dt 2 "
                      f"title '{model_title}'")
    script = (f"set terminal svg size 760,460 dynamic\nset output '{target}'\n"
              f"set title '{title}' noenhanced\nset xlabel '{xlabel}'\nset ylabel '{ylabel}'\n"
              f"{axes}set grid\nset key outside right\n$data << EOD\n{data}\nEOD\nplot " +
              ", ".join(curves) + ", 1 notitle lc 0 dt 3\n")
    subprocess.run(["gnuplot"], input=script.encode(), check=True)
    print(f"wrote {target}", file=sys.stderr)

if __name__ == "__main__":
    main()
