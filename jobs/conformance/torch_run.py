#!/usr/bin/python3
"""Runs a conformance program (gen.py) on torch.distributed with Gloo.

Writes OUT/rank<r>.bin: one record per output, "<op> <label> <dtype> <nbytes>\\n" + bytes + "\\n".
Where torch 1.13's Gloo lacks an op or a dtype, the program's meaning is kept with
torch's documented semantics through supported calls (counted in OUT/emulated.txt):
int16 -> int32, bfloat16 -> float32 and bool -> uint8 carriers; reduce_scatter and
reduce_scatter_tensor as all_reduce + own block; all_to_all and all_gather_into_tensor
through all_to_all_single and all_gather.
"""
import json
import os
import sys
from datetime import timedelta

os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

P = 4294967291
TD = {"int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16, "int32": torch.int32,
      "int64": torch.int64, "float16": torch.float16, "bfloat16": torch.bfloat16,
      "float32": torch.float32, "float64": torch.float64, "bool": torch.bool}
CARRIER = {"int16": torch.int32, "bfloat16": torch.float32, "bool": torch.uint8}
RED = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR,
       "bxor": dist.ReduceOp.BXOR}
BOOL_RED = {"sum": "max", "product": "min", "min": "min", "max": "max"}


def parse(path):
    prog = {"groups": {}, "ops": []}
    for line in open(path):
        w = line.split()
        if not w:
            continue
        if w[0] in ("seed", "world"):
            prog[w[0]] = int(w[1])
        elif w[0] == "group":
            prog["groups"][int(w[1])] = [int(x) for x in w[2].split(",")]
        elif w[0] == "op":
            f = dict(kv.split("=", 1) for kv in w[3:])
            prog["ops"].append((int(w[1]), w[2], f))
    return prog


def xs(seed, op, r, n, off=0):
    i = np.arange(off, off + n, dtype=np.int64)
    return (7919 * i * i + 2654435761 * i + 40503 * (r + 1) * (i + 3)
            + 97 * (op + 1) * (op + 7) + 1000003 * seed + 12345) % P


def values(dt, red, x):
    """The input values (as float64 or int64 numpy arrays) for dtype dt."""
    if red == "product":
        sign = np.where((x // 7) % 2 == 1, -1, 1)
        if dt in ("float16", "bfloat16", "float32", "float64"):
            return sign * np.array([1.0, 2.0, 0.5, 1.5])[x % 4]
        if dt in ("int32", "int64"):
            return sign * np.array([1, 2, 3, 1])[x % 4]
        if dt in ("int16", "int8"):
            return sign * np.array([1, 2, 1, 1])[x % 4]
        if dt == "uint8":
            return np.array([1, 2, 1, 1])[x % 4]
        return (x % 5 != 0).astype(np.int64)
    if dt == "int64":
        return (x - 2147483645) * 1048573
    if dt == "int32":
        return x % 16777216 - 8388608
    if dt == "int16":
        return x % 8001 - 4000
    if dt == "int8":
        return x % 31 - 15
    if dt == "uint8":
        return x % 32
    if dt == "bool":
        return (x % 3 == 0).astype(np.int64)
    if dt == "float64":
        return (x - 2147483645) / 1024.0
    if dt == "float32":
        return (x % 4194304 - 2097152) / 64.0
    if dt == "float16":
        return (x % 4001 - 2000) / 8.0
    if dt == "bfloat16":
        return (x % 255 - 127) / 4.0
    raise ValueError(dt)


def make(dt, red, seed, op, r, n, off=0):
    v = values(dt, red, xs(seed, op, r, n, off))
    t = torch.from_numpy(np.asarray(v, dtype=np.float64 if dt.startswith(("float", "bfloat")) else np.int64))
    return t.to(TD[dt])


def tobytes(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def obj(r, k):
    return [r * 1000003 - 7 * k, "s%d_%d" % (r, k), -(2 ** 40) + r * k * 12345, k]


def js(v):
    return json.dumps(v, separators=(",", ":"))


class Runner:
    def __init__(self, prog, rank, out):
        self.prog, self.rank, self.out = prog, rank, out
        self.emulated = 0

    def rec(self, idx, label, dt, data):
        self.out.write(b"%d %s %s %d\n" % (idx, label.encode(), dt.encode(), len(data)))
        self.out.write(data + b"\n")

    def carried(self, t):
        c = CARRIER.get(str(t.dtype).replace("torch.", ""))
        if c is None:
            return t
        self.emulated += 1
        return t.to(c)

    def red(self, dt, red):
        if dt == "bool":
            red = BOOL_RED[red]
        return RED[red]

    def wait(self, w):
        if w is not None:
            w.wait()

    def run(self, idx, name, f, store):
        seed, r, W = self.prog["seed"], self.rank, self.prog["world"]
        gi = int(f.get("g", 0))
        members = self.prog["groups"][gi]
        if r not in members:
            return
        grp = self.pgs[gi]
        n_g = len(members)
        me = members.index(r)
        dt, red = f.get("dt"), f.get("red")
        n = int(f.get("n", 0))
        asy = f.get("async") == "1"
        root = int(f["root"]) if "root" in f else None
        if name == "all_reduce":
            t = make(dt, red, seed, idx, r, n)
            c = self.carried(t)
            self.wait(dist.all_reduce(c, self.red(dt, red), group=grp, async_op=asy))
            self.rec(idx, "out", dt, tobytes(c.to(t.dtype)))
        elif name == "broadcast":
            t = make(dt, None, seed, idx, r, n)
            c = self.carried(t)
            self.wait(dist.broadcast(c, root, group=grp, async_op=asy))
            self.rec(idx, "out", dt, tobytes(c.to(t.dtype)))
        elif name == "reduce":
            t = make(dt, red, seed, idx, r, n)
            c = self.carried(t)
            self.wait(dist.reduce(c, root, self.red(dt, red), group=grp, async_op=asy))
            if r == root:
                self.rec(idx, "out", dt, tobytes(c.to(t.dtype)))
        elif name in ("all_gather", "all_gather_into_tensor"):
            t = make(dt, None, seed, idx, r, n)
            c = self.carried(t)
            outs = [torch.zeros_like(c) for _ in range(n_g)]
            if n == 0:
                # Gloo (torch 1.13) dies with SIGFPE on an all_gather of empty
                # tensors; the result is empty by definition
                self.emulated += 1
            else:
                self.wait(dist.all_gather(outs, c, group=grp, async_op=asy))
            if name == "all_gather_into_tensor":
                self.emulated += 1
            self.rec(idx, "out", dt, tobytes(torch.cat(outs).to(t.dtype)))
        elif name == "gather":
            t = make(dt, None, seed, idx, r, n)
            c = self.carried(t)
            outs = [torch.zeros_like(c) for _ in range(n_g)] if r == root else None
            self.wait(dist.gather(c, outs, dst=root, group=grp, async_op=asy))
            if r == root:
                self.rec(idx, "out", dt, tobytes(torch.cat(outs).to(t.dtype)))
        elif name == "scatter":
            full = make(dt, None, seed, idx, r, n * n_g)
            c = self.carried(full)
            ins = list(c.chunk(n_g)) if (r == root and n > 0) else ([c[:0]] * n_g if r == root else None)
            out = torch.zeros(n, dtype=c.dtype)
            self.wait(dist.scatter(out, ins, src=root, group=grp, async_op=asy))
            self.rec(idx, "out", dt, tobytes(out.to(full.dtype)))
        elif name in ("reduce_scatter", "reduce_scatter_tensor"):
            full = make(dt, red, seed, idx, r, n * n_g)
            c = self.carried(full).clone()
            self.emulated += 1
            self.wait(dist.all_reduce(c, self.red(dt, red), group=grp, async_op=asy))
            self.rec(idx, "out", dt, tobytes(c[me * n:(me + 1) * n].to(full.dtype)))
        elif name in ("all_to_all", "all_to_all_single"):
            if name == "all_to_all":
                rows = [[n] * n_g for _ in range(n_g)]
                self.emulated += 1
            else:
                rows = [[int(v) for v in row.split(",")] for row in f["splits"].split(";")]
            ins = rows[me]
            outs = [rows[j][me] for j in range(n_g)]
            full = make(dt, None, seed, idx, r, sum(ins))
            c = self.carried(full)
            o = torch.zeros(sum(outs), dtype=c.dtype)
            self.wait(dist.all_to_all_single(o, c, outs, ins, group=grp, async_op=asy))
            self.rec(idx, "out", dt, tobytes(o.to(full.dtype)))
        elif name == "sendrecv":
            t = make(dt, None, seed, idx, r, n)
            c = self.carried(t)
            o = torch.zeros_like(c)
            nxt, prv = members[(me + 1) % n_g], members[(me - 1) % n_g]
            ws = [dist.isend(c, nxt, group=grp), dist.irecv(o, prv, group=grp)]
            for w in ws:
                w.wait()
            self.rec(idx, "out", dt, tobytes(o.to(t.dtype)))
        elif name == "barrier":
            dist.barrier(group=grp)
        elif name == "broadcast_object_list":
            lst = [obj(r, idx + j) for j in range(3)] if r == root else [None] * 3
            dist.broadcast_object_list(lst, src=root, group=grp)
            self.rec(idx, "obj", "json", js(lst).encode())
        elif name == "all_gather_object":
            lst = [None] * n_g
            dist.all_gather_object(lst, obj(r, idx), group=grp)
            self.rec(idx, "obj", "json", js(lst).encode())
        elif name == "gather_object":
            lst = [None] * n_g if r == root else None
            dist.gather_object(obj(r, idx), lst, dst=root, group=grp)
            if r == root:
                self.rec(idx, "obj", "json", js(lst).encode())
        elif name == "scatter_object_list":
            out = [None]
            ins = [obj(root, idx * 10 + j) for j in range(n_g)] if r == root else None
            if gi == 0:
                dist.scatter_object_list(out, ins, src=root, group=grp)
            else:
                # torch 1.13 compares the group rank with the global src here
                # (distributed_c10d.py, scatter_object_list): the same meaning
                # through broadcast_object_list
                full = ins if r == root else [None] * n_g
                dist.broadcast_object_list(full, src=root, group=grp)
                out = [full[me]]
                self.emulated += 1
            self.rec(idx, "obj", "json", js(out).encode())
        elif name == "store":
            K = "conf/%d/" % idx
            store.add(K + "c", r + 1)
            store.set(K + "s/%d" % r, b"\x00\xff%d-%d" % (r, idx))
            dist.barrier()
            res = [str(store.add(K + "c", 0)),
                   store.get(K + "s/%d" % ((r + 1) % W)).hex(),
                   store.compare_set(K + "x/%d" % r, "", "v%d" % r).hex(),
                   store.compare_set(K + "x/%d" % r, "wrong", "zz").hex(),
                   store.compare_set(K + "x/%d" % r, "v%d" % r, "w%d" % r).hex()]
            dist.barrier()
            res += [str(int(store.delete_key(K + "s/%d" % r))), str(int(store.delete_key(K + "nope")))]
            self.rec(idx, "store", "text", "|".join(res).encode())
        else:
            raise ValueError(name)


def worker(rank, path, outdir, port):
    prog = parse(path)
    W = prog["world"]
    store = dist.TCPStore("127.0.0.1", port, W, rank == 0, timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank,
                            world_size=W, timeout=timedelta(seconds=60))
    with open(os.path.join(outdir, "rank%d.bin" % rank), "wb") as out:
        run = Runner(prog, rank, out)
        run.pgs = {0: dist.group.WORLD}
        for gi in sorted(prog["groups"]):
            if gi:
                run.pgs[gi] = dist.new_group(prog["groups"][gi])
        prog["groups"][0] = list(range(W))
        for idx, name, f in prog["ops"]:
            run.run(idx, name, f, store)
    dist.barrier()
    if rank == 0:
        with open(os.path.join(outdir, "emulated.txt"), "w") as fh:
            fh.write("%d\n" % run.emulated)
    dist.destroy_process_group()


if __name__ == "__main__":
    path, outdir, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.makedirs(outdir, exist_ok=True)
    W = parse(path)["world"]
    mp.spawn(worker, args=(path, outdir, port), nprocs=W)
