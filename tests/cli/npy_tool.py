#!/usr/bin/env python3
"""Small .npy helper for the command tests (no numpy needed).

  npy_tool.py make FILE DTYPE SEED D0 D1 ...   write a random array (DTYPE f2, f4 or f8)
  npy_tool.py shape FILE                        print the shape as D0xD1x...
  npy_tool.py dtype FILE                        print the element type (f2, f4 or f8)
  npy_tool.py compare A B BOUND                 exit 1 unless the relative Frobenius
                                                difference of A and B is <= BOUND
  npy_tool.py set FILE INDEX VALUE              set the element with flat index INDEX
                                                (VALUE may be nan, inf, -inf)
  npy_tool.py nonfinite-rows FILE               print the indices along axis 1 of the
                                                [B, N, ...] array whose rows hold a
                                                non-finite value, comma-separated
"""
import ast
import math
import random
import struct
import sys


# struct formats: binary16 ('e'), binary32, binary64.
FORMATS = {"f2": "e", "f4": "f", "f8": "d"}


def write(path, dtype, shape, values):
    header = "{'descr': '<%s', 'fortran_order': False, 'shape': (%s), }" % (
        dtype, "".join("%d, " % d for d in shape) if len(shape) != 1 else "%d," % shape[0])
    pad = (64 - (10 + len(header) + 1) % 64) % 64
    header = header + " " * pad + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%d%s" % (len(values), FORMATS[dtype]), *values))


def read(path):
    data = open(path, "rb").read()
    assert data[:6] == b"\x93NUMPY", path
    length = struct.unpack("<H", data[8:10])[0]
    header = ast.literal_eval(data[10:10 + length].decode())
    shape = header["shape"]
    count = math.prod(shape)
    fmt = FORMATS[header["descr"][1:]]
    values = struct.unpack_from("<%d%s" % (count, fmt), data, 10 + length)
    return shape, values


def descr(path):
    data = open(path, "rb").read()
    length = struct.unpack("<H", data[8:10])[0]
    return ast.literal_eval(data[10:10 + length].decode())["descr"][1:]


def main():
    command = sys.argv[1]
    if command == "make":
        path, dtype, seed = sys.argv[2], sys.argv[3], int(sys.argv[4])
        shape = [int(x) for x in sys.argv[5:]]
        rng = random.Random(seed)
        write(path, dtype, shape, [rng.gauss(0.0, 1.0) for _ in range(math.prod(shape))])
    elif command == "shape":
        print("x".join(str(d) for d in read(sys.argv[2])[0]))
    elif command == "dtype":
        print(descr(sys.argv[2]))
    elif command == "compare":
        (shape_a, a), (shape_b, b) = read(sys.argv[2]), read(sys.argv[3])
        bound = float(sys.argv[4])
        if shape_a != shape_b:
            sys.exit("shapes differ: %s vs %s" % (shape_a, shape_b))
        finite = [(x, y) for x, y in zip(a, b) if math.isfinite(x) or math.isfinite(y)]
        if any(math.isfinite(x) != math.isfinite(y) for x, y in finite):
            sys.exit("non-finite entries differ")
        pairs = [(x, y) for x, y in finite if math.isfinite(x)]
        diff = math.sqrt(sum((x - y) ** 2 for x, y in pairs))
        norm = math.sqrt(sum(y * y for _, y in pairs)) or 1.0
        print("relative difference %.3e" % (diff / norm))
        if diff / norm > bound:
            sys.exit("over the bound %g" % bound)
    elif command == "set":
        path, index, value = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
        data = open(path, "rb").read()
        length = struct.unpack("<H", data[8:10])[0]
        header = ast.literal_eval(data[10:10 + length].decode())
        size = {"<f4": 4, "<f8": 8}[header["descr"]]
        fmt = "<f" if size == 4 else "<d"
        offset = 10 + length + index * size
        data = data[:offset] + struct.pack(fmt, value) + data[offset + size:]
        open(path, "wb").write(data)
    elif command == "nonfinite-rows":
        shape, values = read(sys.argv[2])
        per_row = math.prod(shape[2:])
        rows = set()
        for i, x in enumerate(values):
            if not math.isfinite(x):
                rows.add((i // per_row) % shape[1])
        print(",".join(str(r) for r in sorted(rows)))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
