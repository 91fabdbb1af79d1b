#!/usr/bin/env python3
"""The layers of attention2d, and a check that no #include climbs them.

A file may include headers of its own layer and of the layers below it, never of a layer above.
The ground floor holds plain values that include nothing of the project but each other; the
machinery (backends, communicators, algorithms, the cost model, the programs) stands on them.

    layer        headers (include/attention2d/)                        sources
    -----------  ----------------------------------------------------  --------------------------
    values       error dtype mask problem grid_shape layout             src/core src/layout
                 exchange_maps plan traffic node_layout timing version
    kernels      kernel reference                                       src/reference
    backend      buffer backend peak                                    src/backends/{cpu,host,
                                                                        fenced,cuda}
    comm         comm comm_wrappers comm_kind collective grid           src/comm
                 mpi_comm gloo_comm group_comm group_ops.h watchdog
    attention    attention relayout decomposition                       src/algorithms
    model        model cost_model memory_check planner                  src/model src/table
    simulation   sim                                                    src/backends/sim
    inference    inference                                              src/inference
    session      session shard_attention                                src/session
    tools        tools/*                                                src/tools
    programs     -                                                      apps bench python/src
                                                                        tests fuzz examples sim

The table LAYERS below is the same, as data; the most specific entry (longest path) names a
file's layer. A header of a folder of src/ belongs to its folder's layer.

    tests/layers/check_layers.py [--root DIR] [--plant FILE:HEADER]...

Exit status 0 when no include climbs; 1 with one line per climbing include:
    FILE:LINE: includes HEADER (layer L2) from layer L1
--plant FILE:HEADER pretends that FILE (a path from the root) includes HEADER (as spelled in
an #include) on a line after its last, to show that the check fails (CTest layers.plant).
"""
import argparse
import os
import re
import sys

# Lowest first. Paths are from the repository root; a folder covers everything under it.
LAYERS = [
    ("values", [
        "include/attention2d/error.hpp", "include/attention2d/dtype.hpp",
        "include/attention2d/mask.hpp", "include/attention2d/problem.hpp",
        "include/attention2d/grid_shape.hpp", "include/attention2d/layout.hpp",
        "include/attention2d/exchange_maps.hpp", "include/attention2d/plan.hpp",
        "include/attention2d/traffic.hpp", "include/attention2d/node_layout.hpp",
        "include/attention2d/timing.hpp", "include/attention2d/version.hpp.in",
        "src/core", "src/layout",
    ]),
    ("kernels", [
        "include/attention2d/kernel.hpp", "include/attention2d/reference.hpp",
        "src/reference",
    ]),
    ("backend", [
        "include/attention2d/buffer.hpp", "include/attention2d/backend.hpp",
        "include/attention2d/peak.hpp",
        "src/backends",
    ]),
    ("comm", [
        "include/attention2d/comm.hpp", "include/attention2d/comm_wrappers.hpp",
        "include/attention2d/comm_kind.hpp", "include/attention2d/collective.hpp",
        "include/attention2d/grid.hpp", "include/attention2d/mpi_comm.hpp",
        "include/attention2d/gloo_comm.hpp", "include/attention2d/group_comm.hpp",
        "include/attention2d/group_ops.h", "include/attention2d/watchdog.hpp",
        "src/comm",
    ]),
    ("attention", [
        "include/attention2d/attention.hpp", "include/attention2d/relayout.hpp",
        "include/attention2d/decomposition.hpp",
        "src/algorithms",
    ]),
    ("model", [
        "include/attention2d/model.hpp", "include/attention2d/cost_model.hpp",
        "include/attention2d/memory_check.hpp", "include/attention2d/planner.hpp",
        "src/model", "src/table",
    ]),
    ("simulation", [
        "include/attention2d/sim.hpp",
        "src/backends/sim",
    ]),
    ("inference", [
        "include/attention2d/inference.hpp",
        "src/inference",
    ]),
    ("session", [
        "include/attention2d/session.hpp", "include/attention2d/shard_attention.hpp",
        "src/session",
    ]),
    ("tools", [
        "include/attention2d/tools",
        "src/tools",
    ]),
    ("programs", [
        # The umbrella header includes every public header: it stands above them all.
        "include/attention2d/attention2d.hpp",
        "apps", "bench", "python/src", "tests", "fuzz", "examples", "sim",
    ]),
]

# Where the files to check live, and the suffixes of C++/CUDA sources and headers.
SCANNED = ["include", "src", "apps", "bench", "python/src", "tests", "fuzz", "examples", "sim"]
SUFFIXES = (".hpp", ".h", ".cpp", ".cc", ".cu", ".cuh", ".inc", ".hpp.in")
# #include "x" and #include <attention2d/x> (the installed spelling); other <...> are not ours.
INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<(attention2d/[^>]+)>)')
# Folders an include is looked up in, after the including file's own folder (as the build's
# include paths: include/, src/, the generated version header, the a2d program's folder).
SEARCH = ["include", "src"]


def layer_of(path):
    """(rank, name) of the most specific LAYERS entry covering `path`, or None."""
    best = None
    for rank, (name, entries) in enumerate(LAYERS):
        for entry in entries:
            if path == entry or path.startswith(entry + "/"):
                if best is None or len(entry) > best[0]:
                    best = (len(entry), rank, name)
    return None if best is None else (best[1], best[2])


def resolve(root, including, header):
    """The repository path of `header` as included from `including`, or None (not ours)."""
    candidates = [os.path.join(os.path.dirname(including), header)]
    candidates += [os.path.join(folder, header) for folder in SEARCH]
    for candidate in candidates:
        candidate = os.path.normpath(candidate)
        for spelled in (candidate, candidate + ".in"):  # version.hpp is generated from .in
            if os.path.isfile(os.path.join(root, spelled)):
                return spelled
    return None


def scanned_files(root):
    for top in SCANNED:
        for folder, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
            for name in sorted(files):
                if name.endswith(SUFFIXES):
                    yield os.path.relpath(os.path.join(folder, name), root)


def includes_of(root, path, planted):
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as source:
        lines = source.read().splitlines()
    for number, line in enumerate(lines, 1):
        match = INCLUDE.match(line)
        if match:
            yield number, match.group(1) or match.group(2)
    for header in planted.get(path, []):
        yield len(lines) + 1, header


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    parser.add_argument("--plant", action="append", default=[], metavar="FILE:HEADER")
    args = parser.parse_args()
    root = os.path.normpath(args.root)

    planted = {}
    for plant in args.plant:
        path, _, header = plant.partition(":")
        if not header or not os.path.isfile(os.path.join(root, path)):
            parser.error(f"--plant {plant}: want FILE:HEADER with FILE a file under {root}")
        planted.setdefault(os.path.normpath(path), []).append(header)

    climbs, unplaced, checked = [], set(), 0
    for path in scanned_files(root):
        own = layer_of(path)
        if own is None:
            unplaced.add(path)
            continue
        checked += 1
        for number, header in includes_of(root, path, planted):
            target = resolve(root, path, header)
            if target is None:
                continue  # a system or third-party header
            theirs = layer_of(target)
            if theirs is None:
                unplaced.add(target)
            elif theirs[0] > own[0]:
                climbs.append(f"{path}:{number}: includes {header} (layer {theirs[1]}) "
                              f"from layer {own[1]}")
    for path in sorted(unplaced):
        print(f"{path}: in no layer (add it to LAYERS in tests/layers/check_layers.py)")
    for climb in climbs:
        print(climb)
    if climbs or unplaced:
        print(f"check_layers: {len(climbs)} climbing include(s), {len(unplaced)} file(s) in no "
              f"layer, in {checked} files")
        return 1
    print(f"check_layers: {checked} files, no include climbs "
          f"({' < '.join(name for name, _ in LAYERS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
