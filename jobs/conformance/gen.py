#!/usr/bin/python3
"""Writes one random program of collectives for the conformance check.

The same program runs on crun (crun_run.lua) and on torch with Gloo (torch_run.py);
compare.py then checks that every rank saw the same outputs.  A program is text:

    seed S
    world W
    group G r0,r1,...          (sub-groups, created in this order by every rank)
    op I NAME key=value ...    (one operation; g=0 is the whole world)

Input values are computed by both runners from (seed, op index, global rank, element
index) with integer arithmetic (see inputs in torch_run.py / crun_run.lua): signed,
non-periodic, large, and exactly representable in their dtype.
"""
import argparse
import random

DTYPES = ["int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16",
          "float32", "float64", "bool"]
INT = {"int8", "uint8", "int16", "int32", "int64"}
SIZES = [0, 1, 2, 7, 255, 1023, 1024, 1025, 4095, 4097, 16383, 65536, 65537, 100003]


def reds_for(dt):
    if dt in INT:
        return ["sum", "product", "min", "max", "band", "bor", "bxor"]
    return ["sum", "product", "min", "max"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--ops", type=int, default=40)
    ap.add_argument("--max-elems", type=int, default=100003)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if not 1 <= a.world <= 4:
        ap.error("--world must be 1..4 (the inputs keep float sums and products exact up to 4)")
    rng = random.Random(a.seed * 1000 + a.world)
    W = a.world
    lines = [f"seed {a.seed}", f"world {W}"]
    groups = [list(range(W))]
    for _ in range(2):
        k = rng.randint(1, W)
        groups.append(sorted(rng.sample(range(W), k)))
    for gi, g in enumerate(groups[1:], 1):
        lines.append(f"group {gi} " + ",".join(map(str, g)))
    sizes = [s for s in SIZES if s <= a.max_elems]
    kinds = ["all_reduce"] * 4 + ["broadcast", "reduce", "all_gather", "all_gather_into_tensor",
             "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
             "all_to_all_single", "sendrecv", "barrier", "broadcast_object_list",
             "all_gather_object", "gather_object", "scatter_object_list", "store"]
    for i in range(a.ops):
        op = rng.choice(kinds)
        gi = rng.randrange(len(groups))
        g = groups[gi]
        n = len(g)
        dt = rng.choice(DTYPES)
        per = rng.choice(sizes)
        if op in ("all_gather", "all_gather_into_tensor", "gather", "scatter", "reduce_scatter",
                  "reduce_scatter_tensor", "all_to_all", "all_to_all_single"):
            per = min(per, max(1, a.max_elems // n))
        f = {"dt": dt, "n": per, "g": gi, "async": rng.randint(0, 1)}
        if op in ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"):
            f["red"] = rng.choice(reds_for(dt))
        if op in ("broadcast", "reduce", "gather", "scatter", "broadcast_object_list",
                  "gather_object", "scatter_object_list"):
            f["root"] = rng.choice(g)
        if op == "all_to_all_single":
            rows = []
            for _ in range(n):
                rows.append([rng.choice([0, 1, 3, per, per + 5]) for _ in range(n)])
            f["splits"] = ";".join(",".join(map(str, r)) for r in rows)
        if op in ("barrier", "store") or op.endswith("_object") or op.endswith("object_list"):
            f = {"g": gi if op != "store" else 0, **({"root": f["root"]} if "root" in f else {})}
        if op == "sendrecv" and n < 2:
            op = "barrier"
            f = {"g": gi}
        lines.append(f"op {i} {op} " + " ".join(f"{k}={v}" for k, v in f.items()))
    with open(a.out, "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
