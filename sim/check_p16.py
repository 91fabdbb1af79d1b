#!/usr/bin/env python3
"""CTest sim.smpi_p16: the engine's schedule in SimGrid at P = 16 (sim/CMakeLists.txt).

Runs every algorithm of the engine on the simulated A100 testbed (4 nodes x 4 GPUs of
sim/platforms/a100-16x4.xml), forward and backward, twice, and asserts:
  - every plan ran, and the two simulations are identical (SimGrid is deterministic), and
    identical to a third with every rank's globals privatized (docs/simulation.md, "Globals")
    and a warm-up call before the timed one;
  - the bytes each rank sent, counted inside the simulation by the counting communicator, equal
    the cost model's exact bytes for every plan and direction;
  - ATTENTION2D-NO's kernel time on the simulated device equals the model's compute;
  - a phase whose transfers share no link (the 4 x 4 grid's row all-gather of Q: a ring across
    four nodes, one flow per port) takes the alpha-beta time of its ring on the preset's links;
  - no simulated phase is shorter than the device's own work in it.
Prints the table; exits 1 on the first failed assertion.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# a2d's JSON has 6 significant digits: two numbers rounded apart differ by up to 1e-5 of them.
ROUNDING = 1e-5


def simulate(binary, privatize=False):
    command = [os.path.join(HERE, "run.sh"), "--platform", "a100-16x4", "-np", "16", "--binary",
               binary] + (["--privatize"] if privatize else []) + ["--", "--machine", "a100-hdr", "--gpus-per-node", "4", "--seq", "8192",
               "--heads", "16", "--head-dim", "96", "--causal", "--dtype", "bf16", "--backward",
               "--plans", "attention2d:4x4,attention2d-overlap:4x4,ring,allgather-kv,ulysses,"
               "hybrid:u2:2x4", "--json"] + (["--warmup", "1"] if privatize else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        sys.exit(f"sim.smpi_p16: {' '.join(command)} exited {done.returncode}:\n{done.stderr}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def check(condition, text):
    if not condition:
        print("FAIL: " + text)
        sys.exit(1)
    print("ok:   " + text)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    args = parser.parse_args()
    first, second = simulate(args.binary), simulate(args.binary)
    private = simulate(args.binary, privatize=True)
    check(len(first) == 6 and all("skipped" not in r for r in first), "all 6 plans simulated")
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]
    check(strip(first) == strip(second), "two simulations give identical results")
    check(strip(first) == strip(private),
          "every rank with its own copy of the program's globals (smpi/privatization:dlopen), "
          "after a warm-up call, gives the same results as the shared globals of -no-privatize "
          "without one")
    print(f"{'plan':<28} {'sim fwd ms':>10} {'pred fwd':>9} {'sim bwd ms':>10} {'pred bwd':>9}")
    for r in first:
        print(f"{r['algo'] + ' ' + r['grid']:<28} {r['fwd_ms']:10.3f} {r['pred_fwd_ms']:9.3f} "
              f"{r['bwd_ms']:10.3f} {r['pred_bwd_ms']:9.3f}")
    for r in first:
        name = f"{r['algo']} {r['grid']}"
        check(r["bytes_sent_fwd"] == r["pred_bytes_fwd"] and
              r["bytes_sent_bwd"] == r["pred_bytes_bwd"],
              f"{name}: bytes per rank {r['bytes_sent_fwd']} / {r['bytes_sent_bwd']} = the model's")
        for key, ms in r.items():
            if not key.startswith("ms."):
                continue
            phase = key[3:]
            device = r.get("dev_kernel_ms." + phase, 0) + r.get("dev_data_ms." + phase, 0)
            check(ms >= device * (1 - ROUNDING),
                  f"{name}: {phase} {ms:.4f} ms >= the device's work in it {device:.4f} ms")
    a2d = first[0]
    for direction in ("forward", "backward"):
        got = a2d["dev_kernel_ms." + direction + ".kernel"]
        want = a2d["pred_ms." + direction + ".kernel"]
        check(abs(got - want) <= ROUNDING * want,
              f"attention2d 4x4 {direction} kernel {got:.5f} ms = the model's compute {want:.5f}")
    got, want = a2d["ms.forward.q_allgather"], a2d["pred_ms.forward.q_allgather"]
    check(abs(got - want) <= 0.01 * want,
          f"attention2d 4x4 Q all-gather {got:.5f} ms = its ring's alpha-beta time {want:.5f} "
          f"(within 1 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
