#!/usr/bin/env python3
"""bench/store_scale_torch.py -- jobs/store_scale.lua's measurement on torch's TCPStore.

    /usr/bin/python3 bench/store_scale_torch.py [--clients 10000] [--procs 8] [--timeout 120]

The master TCPStore lives in this process. Each of --procs child processes
opens one control client and waits for "go"; then it opens its share of the
clients one after another, each does add("joined", 1) and stays connected;
the client whose add returns N sets "all". Reported: time from "go" to
"all", this process's RSS before and after, joins per second.
"""
import argparse
import datetime
import multiprocessing as mp
import resource
import sys
import time

import torch.distributed as dist


def rss_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def client(port, count, total, procs, timeout):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    td = datetime.timedelta(seconds=timeout)
    ctl = dist.TCPStore("127.0.0.1", port, None, False, td, wait_for_workers=False)
    if ctl.add("ready", 1) == procs:
        ctl.set("ready_all", "1")
    ctl.wait(["go"])
    keep = []
    for _ in range(count):
        c = dist.TCPStore("127.0.0.1", port, None, False, td, wait_for_workers=False)
        keep.append(c)
        if c.add("joined", 1) == total:
            c.set("all", "1")
    ctl.wait(["release"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=10000)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=120)
    o = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    td = datetime.timedelta(seconds=o.timeout)
    master = dist.TCPStore("127.0.0.1", 0, None, True, td, wait_for_workers=False)
    port = master.port
    ctx = mp.get_context("fork")
    ps = []
    for p in range(o.procs):
        n = o.clients // o.procs + (1 if p < o.clients % o.procs else 0)
        ps.append(ctx.Process(target=client, args=(port, n, o.clients, o.procs, o.timeout)))
        ps[-1].start()
    master.wait(["ready_all"])
    rss0 = rss_kb("VmRSS")
    t0 = time.perf_counter()
    master.set("go", "1")
    master.wait(["all"])
    dt = time.perf_counter() - t0
    rss1, hwm = rss_kb("VmRSS"), rss_kb("VmHWM")
    joined = master.add("joined", 0)
    master.set("release", "1")
    failed = 0
    for p in ps:
        p.join(o.timeout)
        failed += p.exitcode != 0
    print("torch TCPStore: %d clients from %d processes joined in %.3f s (%.0f joins/s) over loopback TCP; "
          "server process RSS %.1f MiB before, %.1f MiB with every client connected (peak %.1f MiB): %.1f KiB per client"
          % (joined, o.procs, dt, joined / dt, rss0 / 1024, rss1 / 1024, hwm / 1024, (rss1 - rss0) / max(joined, 1)))
    sys.exit(1 if failed or joined != o.clients else 0)


if __name__ == "__main__":
    main()
