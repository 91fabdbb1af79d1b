#!/usr/bin/env python3
"""One configuration of a simulation sweep: every plan asked for, each in a SimGrid run of its
own (sim/run.sh), appended to OUT as a2d sim's JSON line with the platform, the wall time and
the peak memory of the simulation; a plan that fails, or that would not fit, gets a line saying
why. Used by scripts/sim/sim_scale.sh and scripts/sim/sim_cost.sh.

    sim/sweep.py --platform h100-fattree-128x8 --np 1024 --out docs/sim/scale.jsonl \\
        --plans attention2d,ring --top 3 -- --machine-file sim/machines/h100-8x400.machine \\
        --cuda-rules --memory-gbs 3350 --seq 1048576 --heads 40 --head-dim 128 --causal --backward

--top K adds the first K plans `a2d model` ranks for the same machine (block placement: the
hosts file's), as --plans entries. Before each run the engine's own host memory is estimated:
the index arrays a rank keeps of the whole sequence (Ring Attention: the positions of every part,
N x 8 bytes; all-gather K/V: the gathered keys' positions, order and inverse, 3 x N x 8 bytes),
times P; over --memory-limit-gib the plan is not simulated and its line says so.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def option(args, name, default=None):
    return args[args.index(name) + 1] if name in args else default


def spec_of(row):
    algo = row["algo"]
    if algo in ("attention2d", "attention2d-overlap"):
        return f"{algo}:{row['grid']}" + ("" if row["kv_transpose"] else ":nt")
    if algo == "hybrid":
        return f"hybrid:u{row['heads_parallel']}:{row['grid']}" + ("" if row["kv_transpose"] else ":nt")
    return f"{algo}:{row['layout']}"


def model_rows(a2d, ranks, sim_args):
    model_args = [a for a in sim_args if a not in ("--cuda-rules", "--backward", "--json")]
    for flag in ("--memory-gbs", "--host-reduction-gbs", "--pool-gib", "--warmup", "--iters",
                 "--plans", "--top"):
        if flag in model_args:
            i = model_args.index(flag)
            del model_args[i:i + 2]
    command = [a2d, "model", "--gpus", str(ranks), "--json"] + model_args
    if "--machine-file" not in model_args:
        command += ["--gpus-per-node", option(sim_args, "--gpus-per-node", "1")]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return [r for r in rows if r.get("placement", "block") == "block" and "skipped" not in r]


def host_bytes(spec, ranks, seq):
    algo = spec.split(":")[0]
    per_rank = {"ring": 1, "allgather-kv": 3}.get(algo, 0) * seq * 8
    return per_rank * ranks


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--platform", required=True)
    parser.add_argument("--np", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--plans", default="")
    parser.add_argument("--top", type=int, default=0)
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--memory-limit-gib", type=float, default=16)
    parser.add_argument("--not-simulated", action="append", default=[],
                        help="ALGO=REASON: a line saying why instead of a run (repeatable)")
    parser.add_argument("--binary", default=os.path.join(ROOT, "build/smpi/a2d"))
    parser.add_argument("--a2d", default=os.path.join(ROOT, "build/a2d"))
    parser.add_argument("sim_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    sim_args = args.sim_args[1:] if args.sim_args[:1] == ["--"] else args.sim_args
    seq = int(option(sim_args, "--seq"))
    ranked = model_rows(args.a2d, args.np, sim_args)
    specs = []
    for spec in [s for s in args.plans.split(",") if s] + [spec_of(r) for r in ranked[:args.top]]:
        # A grid algorithm without its grid: the model's fastest plan of it (as a2d sim takes it).
        if spec in ("attention2d", "attention2d-overlap", "hybrid"):
            spec = next((spec_of(r) for r in ranked if r["algo"] == spec), spec)
        if spec not in specs:
            specs.append(spec)
    base = {"platform": args.platform, "ranks": args.np, "seq": seq}
    refused = dict(item.split("=", 1) for item in args.not_simulated)
    with open(args.out, "a") as out:
        for spec in specs:
            if spec.split(":")[0] in refused:
                # With the model's prediction of the algorithm's best plan (a2d model), marked so.
                algo = spec.split(":")[0]
                best = next((r for r in ranked if r["algo"] == algo), None)
                line = dict(base, spec=spec, algo=algo,
                            failed="not simulated: " + refused[algo])
                if best:
                    line.update({"model_only": True, "layout": best["layout"],
                                 "pred_fwd_ms": best["fwd_ms"], "pred_bwd_ms": best["bwd_ms"]})
                out.write(json.dumps(line) + "\n")
                out.flush()
                continue
            estimate = host_bytes(spec, args.np, seq)
            if estimate > args.memory_limit_gib * 2**30:
                line = dict(base, spec=spec, algo=spec.split(":")[0], failed=(
                    f"not simulated: the engine's index arrays of the whole sequence would take "
                    f"{estimate / 2**30:.0f} GiB over the {args.np} ranks (limit "
                    f"{args.memory_limit_gib:g} GiB here)"))
                out.write(json.dumps(line) + "\n")
                out.flush()
                print(f"sweep: {args.np} ranks {spec}: {line['failed']}", file=sys.stderr)
                continue
            command = ["/usr/bin/time", "-f", "A2D_MAX_RSS_KIB %M", os.path.join(HERE, "run.sh"), "--platform", args.platform, "-np",
                       str(args.np), "--binary", args.binary, "--"] + sim_args + [
                           "--plans", spec, "--json"]
            load = open("/proc/loadavg").read().split()[:3]
            start = time.time()
            try:
                done = subprocess.run(command, capture_output=True, text=True,
                                      timeout=args.timeout)
                rows = [json.loads(l) for l in done.stdout.splitlines() if l.startswith("{")]
                reason = "" if done.returncode == 0 and rows else (
                    [l for l in done.stderr.splitlines() if "a2d sim" in l][:1] or
                    [l for l in done.stderr.splitlines() if not l.startswith("A2D_MAX")][-1:] or
                    [f"exit {done.returncode}"])[0]
                rss = [int(l.split()[1]) for l in done.stderr.splitlines()
                       if l.startswith("A2D_MAX_RSS_KIB")]
            except subprocess.TimeoutExpired:
                rows, reason, rss = [], f"not finished in {args.timeout} s", []
            wall = time.time() - start
            extra = {"platform": args.platform, "sim_wall_s": round(wall, 1),
                     "sim_max_rss_mib": round(rss[0] / 1024) if rss else None,
                     "load_before": " ".join(load)}
            for row in rows:
                out.write(json.dumps(dict(extra, **row)) + "\n")
            if not rows:
                out.write(json.dumps(dict(base, **extra, spec=spec, algo=spec.split(":")[0],
                                          failed=reason)) + "\n")
            out.flush()
            print(f"sweep: {args.np} ranks N={seq} {spec}: "
                  f"{'failed: ' + reason if not rows else 'done'} in {wall:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
