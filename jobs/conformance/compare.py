#!/usr/bin/python3
"""Compares what every rank saw on crun with what it saw on torch (records of
torch_run.py / crun_run.lua).  Integers, data movement, min/max, objects and store
replies must agree exactly, and so must float32/float64 sums and every product (the
generated inputs make them exact for W <= 4); float16/bfloat16 sums within rounding
(|a-b| <= ((W*W+W-2)/4 + W/2) * eps * M, M the largest input magnitude of the dtype).

    compare.py PROGRAM TORCH_DIR CRUN_DIR [--no-store] [--json]
Prints one line (ops, values compared, disagreements); lists each disagreement.
Exit 1 on any disagreement or missing record.
"""
import json
import sys

import numpy as np

NP = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32,
      "int64": np.int64, "float16": np.float16, "bfloat16": np.uint16,
      "float32": np.float32, "float64": np.float64, "bool": np.uint8}
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23, "float64": 2.0 ** -52}
MAXIN = {"float16": 250.0, "bfloat16": 32.0, "float32": 32768.0, "float64": 2.1e6}


def read(path):
    recs = {}
    with open(path, "rb") as fh:
        while True:
            head = fh.readline()
            if not head:
                break
            idx, label, dt, n = head.decode().split()
            data = fh.read(int(n))
            fh.read(1)
            recs[(int(idx), label)] = (dt, data)
    return recs


def decode(dt, data):
    a = np.frombuffer(data, dtype=NP[dt])
    if dt == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dt in EPS:
        return a.astype(np.float64)
    return a


def main():
    prog_path, tdir, cdir = sys.argv[1:4]
    no_store = "--no-store" in sys.argv
    world, ops = 0, {}
    for line in open(prog_path):
        w = line.split()
        if w and w[0] == "world":
            world = int(w[1])
        if w and w[0] == "op":
            ops[int(w[1])] = (w[2], dict(kv.split("=", 1) for kv in w[3:]))
    values = compared = 0
    bad = []
    for r in range(world):
        t = read("%s/rank%d.bin" % (tdir, r))
        c = read("%s/rank%d.bin" % (cdir, r))
        for key, (dt, tdata) in sorted(t.items()):
            name, f = ops[key[0]]
            if name == "store" and no_store:
                continue
            if key not in c:
                bad.append("rank %d op %d %s: no output on crun" % (r, key[0], name))
                continue
            cdt, cdata = c[key]
            compared += 1
            if dt in ("json", "text"):
                values += 1
                if tdata != cdata:
                    bad.append("rank %d op %d %s: torch %r crun %r" % (r, key[0], name, tdata[:200], cdata[:200]))
                continue
            a, b = decode(dt, tdata), decode(dt, cdata)
            values += a.size
            if a.shape != b.shape:
                bad.append("rank %d op %d %s %s: %d values on torch, %d on crun" % (r, key[0], name, dt, a.size, b.size))
                continue
            red = f.get("red")
            if dt in ("float16", "bfloat16") and red == "sum":
                # the one inexact case: each of W-1 additions rounds (at most
                # eps/2 of a partial sum <= k*M), in an order that differs
                # between the two; float32/float64 sums and every product of the
                # generated inputs are exact for W <= 4 and compared exactly
                tol = ((world * world + world - 2) / 4 + world / 2) * EPS[dt] * MAXIN[dt]
                ok = np.abs(a - b) <= tol
            else:
                ok = (a == b) | (np.isnan(a) & np.isnan(b)) if dt in EPS else (a == b)
            if not ok.all():
                i = int(np.argmin(ok))
                bad.append("rank %d op %d %s %s n=%d red=%s: %d of %d differ, first at %d: torch %r crun %r"
                           % (r, key[0], name, dt, a.size, red, int((~ok).sum()), a.size, i, a[i], b[i]))
        for key in c:
            if key not in t:
                bad.append("rank %d op %d: output on crun only" % (r, key[0]))
    summary = {"ops": len(ops), "records": compared, "values": int(values), "disagreements": len(bad)}
    print(json.dumps(summary))
    for b in bad[:50]:
        print("  " + b)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
