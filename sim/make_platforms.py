#!/usr/bin/env python3
"""Writes the SimGrid platforms of sim/platforms/ (docs/simulation.md, "Platforms").

    sim/make_platforms.py            # rewrites every platform and its hosts file
    sim/make_platforms.py --check    # exits 1 if a committed file differs from what it writes
    sim/make_platforms.py --cluster MACHINE_FILE --hosts H --name NAME
                                     # an emulated cluster (scripts/cluster/cluster.sh) as its machine
                                     # file describes it: sim/platforms/NAME.xml (scripts/sim/sim_trust.sh)

Every figure is a datasheet's or NCCL's, the same the cost model's presets use
(docs/cost-model.md, "Machines"), so that a simulation and the model's prediction differ by what
the simulator models and the model does not, never by their inputs:

  NVLink 3 (A100): 600 GB/s per GPU both ways = 300 GB/s per direction (A100 datasheet)
  NVLink 4 (H100): 900 GB/s per GPU both ways = 450 GB/s per direction (H100 SXM datasheet)
  HDR InfiniBand: 200 Gb/s = 25 GB/s per port and direction (ConnectX-6 specification)
  NDR InfiniBand: 400 Gb/s = 50 GB/s per port and direction (ConnectX-7 specification); a DGX
      H100 node has eight such ports, one per GPU (DGX H100 datasheet)
  latency per message: 3.4 us over NVLink, 9.6 us over the network, NCCL's own tuning model
      (NVIDIA/nccl src/graph/tuning.cc, hwLat, ring / simple protocol), split over the route's
      links (two links: 1.7 + 1.7 us and 4.8 + 4.8 us; four in a two-level fat tree: 2.4 us each)

A hosts file NAME.hosts lists the platform's hosts in rank order, one line per rank slot
(block placement: consecutive ranks on one node), for sim/run.sh.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "platforms")

HEADER = """<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<!-- Written by sim/make_platforms.py (edit that, not this). docs/simulation.md, "Platforms". -->
<platform version="4.1">
"""


def per_gpu_full(name, nodes, gpus, nvlink_gbps, nic_gbps, comment):
    """Every GPU a host with its own NVLink link (to the node's NVSwitch) and its own network
    port; routes listed in full: inside a node over the two GPUs' NVLink links, between nodes
    over the two GPUs' ports (a non-blocking fabric: no link beyond the ports)."""
    lines = [HEADER, f"<!-- {comment} -->\n", f'<zone id="{name}" routing="Full">\n',
             f'  <prop id="gpus_per_node" value="{gpus}"/>\n']
    count = nodes * gpus
    for g in range(count):
        lines.append(f'  <host id="gpu-{g}" speed="1Gf"/>\n')
    for g in range(count):
        lines.append(f'  <link id="nvlink-{g}" bandwidth="{nvlink_gbps}GBps" latency="1.7us" '
                     f'sharing_policy="SPLITDUPLEX"/>\n')
        lines.append(f'  <link id="port-{g}" bandwidth="{nic_gbps}GBps" latency="4.8us" '
                     f'sharing_policy="SPLITDUPLEX"/>\n')
    for a in range(count):
        for b in range(count):
            if a == b:
                continue
            link = "nvlink" if a // gpus == b // gpus else "port"
            lines.append(f'  <route src="gpu-{a}" dst="gpu-{b}" symmetrical="NO">'
                         f'<link_ctn id="{link}-{a}" direction="UP"/>'
                         f'<link_ctn id="{link}-{b}" direction="DOWN"/></route>\n')
    lines.append("</zone>\n</platform>\n")
    hosts = [f"gpu-{g}\n" for g in range(count)]
    return "".join(lines), "".join(hosts)


def node_cluster(name, nodes, gpus, nvlink_gbps, port_gbps, ports, topology, comment):
    """SimGrid's <cluster>: a host per node with a core per GPU; the node's ports bundled into
    its one link (ports x port_gbps), NVLink as the host's loopback link (SimGrid makes it a
    FATPIPE: each flow inside the node gets the full per-GPU NVLink rate)."""
    if topology:
        levels = len(topology[0])
        parts = ";".join(",".join(str(x) for x in level) for level in topology)
        topo = f' topology="FAT_TREE" topo_parameters="{levels};{parts}"'
        hops = 2 * levels
    else:
        topo = ""
        hops = 2
    latency = 9.6 / hops
    body = (f'<cluster id="{name}" prefix="node-" radical="0-{nodes - 1}" suffix="" '
            f'speed="1Gf" core="{gpus}" bw="{ports * port_gbps}GBps" lat="{latency:g}us" '
            f'sharing_policy="SPLITDUPLEX"{topo} loopback_bw="{nvlink_gbps}GBps" '
            f'loopback_lat="3.4us"/>\n')
    text = (HEADER + f"<!-- {comment} -->\n" + '<zone id="world" routing="Full">\n' +
            f'  <prop id="gpus_per_node" value="{gpus}"/>\n  ' + body + "</zone>\n</platform>\n")
    hosts = "".join(f"node-{n}\n" for n in range(nodes) for _ in range(gpus))
    return text, hosts


def platforms():
    yield "a100-16x4", per_gpu_full(
        "a100-16x4", 16, 4, 300, 25,
        "The paper's A100 testbed: 16 nodes x 4 A100, NVLink 3 inside a node (300 GB/s per GPU "
        "and direction), one HDR InfiniBand port per GPU (25 GB/s) into a non-blocking fabric. "
        "The cost model's a100-hdr preset with --gpus-per-node 4.")
    yield "h100-64x1", node_cluster(
        "h100-64x1", 64, 1, 450, 50, 1, None,
        "The paper's H100 testbed: 64 nodes x 1 H100, one NDR InfiniBand port each (50 GB/s) on "
        "one non-blocking switch (a 64-port NDR switch holds them all). The cost model's h100-ndr "
        "preset with --gpus-per-node 1.")
    for nodes, topology in ((32, ((8, 4), (1, 8), (1, 1))),
                            (128, ((16, 8), (1, 16), (1, 1))),
                            (512, ((32, 16), (1, 32), (1, 1)))):
        leaves = nodes // topology[0][0]
        name = f"h100-fattree-{nodes}x8"
        yield name, node_cluster(
            name, nodes, 8, 450, 50, 8, topology,
            f"{nodes} DGX-H100-like nodes x 8 H100 = {nodes * 8} GPUs: NVLink 4 inside a node, the "
            f"node's eight NDR ports (8 x 50 GB/s) bundled into one link to a leaf switch of a "
            f"two-level non-blocking fat tree ({leaves} leaves of {topology[0][0]} nodes, "
            f"{topology[1][1]} spines). The cost model: sim/machines/h100-8x400.machine.")


def machine_file(path):
    values = {}
    for line in open(path):
        line = line.split("#")[0].strip()
        if "=" in line:
            key, value = (part.strip() for part in line.split("=", 1))
            values[key] = value
    return values


def emulated_cluster(path, hosts, name):
    """scripts/cluster/cluster.sh's hosts (one rank each) on their bridge: every host one link, shaped to
    the machine file's inter-node bandwidth (the tbf rate) in each direction, with half the
    measured message latency (a2d calibrate's ring shift across the cluster) at each end."""
    m = machine_file(path)
    if int(m.get("ranks_per_node", "1")) != 1:
        sys.exit("make_platforms: the emulated cluster's platform takes one rank per host")
    gbps = float(m["inter_bandwidth_gbs"])
    latency_us = float(m["inter_latency_us"]) / 2
    comment = (f"An emulated cluster of scripts/cluster/cluster.sh: {hosts} hosts x 1 rank, one link each of "
               f"{gbps * 8000:g} Mbit/s per direction (tbf), {2 * latency_us:g} us per message "
               f"(a2d calibrate across it); from its machine file {m.get('name', path)}.")
    body = (f'<cluster id="{name}" prefix="host-" radical="0-{hosts - 1}" suffix="" speed="1Gf" '
            f'bw="{gbps * 1000:g}MBps" lat="{latency_us:g}us" sharing_policy="SPLITDUPLEX"/>\n')
    text = (HEADER + f"<!-- {comment} -->\n" + '<zone id="world" routing="Full">\n' +
            '  <prop id="gpus_per_node" value="1"/>\n  ' + body + "</zone>\n</platform>\n")
    return text, "".join(f"host-{h}\n" for h in range(hosts))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--cluster", help="an emulated cluster's machine file")
    parser.add_argument("--hosts", type=int)
    parser.add_argument("--name")
    args = parser.parse_args()
    os.makedirs(OUT, exist_ok=True)
    if args.cluster:
        xml, hosts = emulated_cluster(args.cluster, args.hosts, args.name)
        for suffix, text in ((".xml", xml), (".hosts", hosts)):
            with open(os.path.join(OUT, args.name + suffix), "w") as out:
                out.write(text)
        return 0
    stale = []
    for name, (xml, hosts) in platforms():
        for suffix, text in ((".xml", xml), (".hosts", hosts)):
            path = os.path.join(OUT, name + suffix)
            if args.check:
                if not os.path.exists(path) or open(path).read() != text:
                    stale.append(path)
                continue
            with open(path, "w") as out:
                out.write(text)
    if stale:
        print("sim/make_platforms.py: stale: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
