#!/usr/bin/python3
"""store_lat_torch.py -- bench/store_lat.lua's measurement on torch's TCPStore.

    /usr/bin/python3 bench/store_lat_torch.py server PORT
    /usr/bin/python3 bench/store_lat_torch.py client PORT [N]
"""
import sys
import time
from datetime import timedelta

import torch.distributed as dist

mode, port = sys.argv[1], int(sys.argv[2])
n = int(sys.argv[3]) if len(sys.argv) > 3 else 5000
if mode == "server":
    s = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=120), wait_for_workers=False)
    s.set("k", b"v" * 16)
    s.wait(["done"], timedelta(seconds=120))
    sys.exit(0)
st = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60))
for _ in range(500):
    st.get("k")
ts = []
pc = time.perf_counter
for _ in range(n):
    a = pc()
    st.get("k")
    ts.append(pc() - a)
ts.sort()
print("get median %.2f us p10 %.2f p90 %.2f" % (ts[n // 2] * 1e6, ts[n // 10] * 1e6, ts[n * 9 // 10] * 1e6))
st.set("done", "1")
