#!/bin/bash
# scripts/bench.sh — `make bench`: every side-by-side comparison of issue 18 in
# one run, on this machine, and the ratios against the targets.
#
#   bash scripts/bench.sh [BUILD_DIR]        (env: SECTIONS="coll store launch train",
#                                             ANCHORS=../shared/anchors, REPS=1)
#
# Sections (each runs its existing script; nothing here times anything itself):
#   coll    bench/coll_compare.sh 2 4 8: all_reduce, crun tcp/shm vs Gloo and Open MPI;
#           bench/lat_rounds.sh: 8 B and 1 KiB at 2 ranks vs Open MPI, LAT_ROUNDS (7)
#           interleaved runs (the 2-rank targets use their medians)
#   store   jobs/store_bench.lua (unix socket and loopback TCP) vs anchors/store/store_bench.py,
#           and bench/store_floor.c: what a bare C echo server does (the floor)
#   launch  bench/launch_bench.sh: crun-lua -n 8 vs torchrun and mpirun (hyperfine)
#   train   anchors/train/compare.py: jobs/train.lua vs torch DDP (interleaved)
# Writes bench/results/<date>-<cpu>.md (the tables, the raw outputs, the
# targets) and prints the target lines. A job, not a test: it needs torch
# (Debian's python3-torch), Open MPI and hyperfine, and an idle machine.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
ANCHORS=$(cd "${ANCHORS:-$ROOT/../shared/anchors}" && pwd)
SECTIONS=${SECTIONS:-coll store launch train}
REPS=${REPS:-1}
PY=/usr/bin/python3
CPU=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
SLUG=$(echo "$CPU" | tr -cs 'A-Za-z0-9' '-' | sed 's/-$//')
STAMP=$(date -u +%Y-%m-%d)
WORK=${WORK:-/tmp/crun-bench-$STAMP}
REPORT=$ROOT/bench/results/$STAMP-$SLUG.md
mkdir -p "$WORK" "$ROOT/bench/results"
export OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo MASTER_ADDR=127.0.0.1

if ! $PY -c 'import torch' 2>/dev/null; then
  echo "bench: $PY cannot import torch; install Debian's python3-torch (apt-get install python3-torch)" >&2
  exit 1
fi
SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
for tool in hyperfine mpirun; do
  command -v $tool >/dev/null || $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 \
    install -y -qq --no-install-recommends "$([ $tool = mpirun ] && echo openmpi-bin || echo $tool)" >/dev/null
done
cd "$ROOT"
for s in $SECTIONS; do
  echo "== bench: $s ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
  case $s in
  coll)
    OUT=$WORK/coll ANCHORS=$WORK/anchors-coll bash bench/coll_compare.sh "$BUILD" 2 4 8 | tee "$WORK/coll.txt"
    OUT=$WORK/lat ANCHORS=$WORK/anchors-coll bash bench/lat_rounds.sh "$BUILD" "${LAT_ROUNDS:-7}" | tee "$WORK/coll_lat.txt" ;;
  store)
    $PY "$ANCHORS/store/store_bench.py" --out "$WORK/store_torch.csv" > "$WORK/store_torch.txt" 2>&1
    # the default (set returns once sent, as torch's), then acknowledged sets (CRUN_STORE_ASYNC_SET=0)
    for a in 1 0; do
      for u in 1 0; do
        CRUN_STORE_ASYNC_SET=$a CRUN_STORE_UNIX=$u LUA_PATH="$BUILD/lua/?.lua;$BUILD/lua/?/init.lua;;" \
          LUA_CPATH="$BUILD/lua/?.so;;" lua5.4 jobs/store_bench.lua --torch-csv "$WORK/store_torch.csv" \
          --out "$WORK/store_crun_unix$u${a/1/}.csv" | tee "$WORK/store_unix$u${a/1/}.txt"
      done
    done
    # the floor of any acknowledged request/reply store here (bench/store_floor.c)
    if cc -O2 -o "$WORK/store_floor" bench/store_floor.c -lpthread; then
      : > "$WORK/store_floor.csv"
      for m in "" "--poll" "--unix" "--unix --poll"; do
        timeout 120 "$WORK/store_floor" $m 8 10000 >> "$WORK/store_floor.csv"
      done
      cat "$WORK/store_floor.csv"
    fi ;;
  launch)
    OUT=$WORK/launch BUILD=$BUILD ANCHORS=$ANCHORS SKIP_MI=1 bash bench/launch_bench.sh 10 | tee "$WORK/launch.txt" ;;
  train)
    # one BLAS thread per rank on both sides, as the anchor runs torch (its
    # launcher's OMP_NUM_THREADS=1); crun-lua's own default for one rank per
    # node would give BLAS every core (launcher: as torchrun)
    OMP_NUM_THREADS=1 $PY "$ANCHORS/train/compare.py" --crun "$BUILD/crun-lua" --reps "$REPS" --variants crun,torch \
      --configs 1:64:2,2:64:2,4:64:2,1:512:4,2:512:4,4:512:4 --out "$WORK/train" | tee "$WORK/train.txt" ;;
  *) echo "bench: unknown section $s" >&2; exit 2 ;;
  esac
done

$PY - "$WORK" "$REPORT" "$CPU" "$SECTIONS" <<'PY'
import csv, json, os, sys
work, report, cpu, sections = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()
lines, targets = [], []

def rows(path, kind):
    out = {}
    if not os.path.exists(path): return out
    with open(path) as f:
        body = [l for l in f if l.strip() and not l.startswith("#")]
    for r in csv.DictReader(body):
        if kind == "crun": out[int(r["bytes"])] = float(r["time_us"])
        elif r.get("op") == "allreduce": out[int(float(r["bytes"]))] = float(r["median_s"]) * 1e6
    return out

def target(name, ok, detail):
    targets.append(f"| {name} | {detail} | {'met' if ok else 'NOT met'} |")

if "coll" in sections:
    for n in (2, 4, 8):
        c, m = rows(f"{work}/coll/crun_shm1_ws{n}.csv", "crun"), rows(f"{work}/coll/mpi_shm_ws{n}.csv", "mpi")
        for b in (8, 1024):
            if b in c and b in m and n > 2:
                lines.append(f"- all_reduce {b} B, {n} ranks: crun {c[b]:.2f} us, Open MPI {m[b]:.2f} us")
    # 2 ranks: the medians of bench/lat_rounds.sh's interleaved runs (one run
    # lands anywhere between a fast and a slow figure by the ranks' phase)
    if os.path.exists(f"{work}/lat/lat.csv"):
        lat = list(csv.DictReader(open(f"{work}/lat/lat.csv")))
        for b in (8, 1024):
            v = {s: sorted(float(r["us"]) for r in lat if r["system"] == s and int(r["bytes"]) == b)
                 for s in ("crun", "openmpi")}
            if v["crun"] and v["openmpi"]:
                c2, m2 = v["crun"][len(v["crun"]) // 2], v["openmpi"][len(v["openmpi"]) // 2]
                target(f"all_reduce {b} B, 2 ranks <= Open MPI", c2 <= m2,
                       f"crun {c2:.2f} us, Open MPI {m2:.2f} us ({c2 / m2:.2f}x; medians of {len(v['crun'])} "
                       f"interleaved runs, fastest {v['crun'][0]:.2f} / {v['openmpi'][0]:.2f})")
if "store" in sections:
    torch = {}
    if os.path.exists(f"{work}/store_torch.csv"):
        body = [l for l in open(f"{work}/store_torch.csv") if not l.startswith("#")]
        for r in csv.DictReader(body): torch[r["test"]] = r
    for u, name in (("1", "unix socket"), ("0", "loopback TCP")):
        p = f"{work}/store_crun_unix{u}.csv"
        if not os.path.exists(p) or not torch: continue
        crun = {r["test"]: r for r in csv.DictReader(open(p))}
        g = float(torch["latency_get"]["median_us"]) / float(crun["latency_get"]["median_us"])
        target(f"store get latency >= 4x torch ({name})", g >= 4, f"{g:.1f}x")
        t = float(crun["throughput_setget"]["agg_ops_per_s"]) / float(torch["throughput_setget"]["agg_ops_per_s"])
        floor = ""
        if os.path.exists(f"{work}/store_floor.csv"):  # store_floor,tcp|unix,block|poll,clients,nops,round trips/s
            fl = [float(l.split(",")[5]) for l in open(f"{work}/store_floor.csv")
                  if l.startswith("store_floor,") and l.split(",")[1] == ("unix" if u == "1" else "tcp")]
            if fl:
                tt = float(torch["throughput_setget"]["agg_ops_per_s"])
                floor = (f"; the floor here, a bare C echo server (bench/store_floor.c, 8 clients): "
                         f"{max(fl) / 1e3:.0f}k round trips/s = {max(fl) / tt:.1f}x torch")
        acked = ""
        pa = f"{work}/store_crun_unix{u}0.csv"
        if os.path.exists(pa):
            ca = {r["test"]: r for r in csv.DictReader(open(pa))}
            ta = float(ca["throughput_setget"]["agg_ops_per_s"]) / float(torch["throughput_setget"]["agg_ops_per_s"])
            acked = f"; with acknowledged sets (CRUN_STORE_ASYNC_SET=0, not torch's semantics) {ta:.1f}x"
        target(f"store 8-client set+get >= 4x torch ({name}; set as torch's, not waiting)", t >= 4,
               f"{t:.1f}x{acked}{floor}")
if "launch" in sections and os.path.exists(f"{work}/launch/launch.json"):
    res = json.load(open(f"{work}/launch/launch.json"))["results"]
    ms = res[0]["median"] * 1e3
    target("launch 8 ranks to a store barrier <= 30 ms", ms <= 30,
           f"{ms:.1f} ms median; " + ", ".join(f"{r['command']} {r['median'] * 1e3:.0f} ms" for r in res[1:]))
if "train" in sections and os.path.exists(f"{work}/train/runs.jsonl"):
    recs = [json.loads(l) for l in open(f"{work}/train/runs.jsonl")]
    recs = [r for r in recs if not r.get("bench") and not r.get("rss_pass") and r.get("rc") == 0 and "steady_sps" in r]
    for c in sorted({(r["ranks"], r["hidden"], r["layers"]) for r in recs}):
        def med(v):
            v = sorted(v); return v[len(v) // 2] if v else None
        a = med([r["steady_sps"] for r in recs if (r["ranks"], r["hidden"], r["layers"]) == c and r["variant"] == "crun"])
        b = med([r["steady_sps"] for r in recs if (r["ranks"], r["hidden"], r["layers"]) == c and r["variant"] == "torch"])
        if a and b:
            target(f"training {c[0]} rank(s), {c[1]}x{c[2]} >= 1.5x torch DDP", a / b >= 1.5,
                   f"{a:.0f} vs {b:.0f} samples/s ({a / b:.2f}x)")

with open(report, "w") as f:
    f.write(f"# make bench, {os.path.basename(report)[:10]}, {cpu}\n\n")
    f.write("Every figure below was taken in this one run on this machine (scripts/bench.sh).\n\n")
    f.write("## Targets (issue 18)\n\n| target | measured | |\n|---|---|---|\n" + "\n".join(targets) + "\n\n")
    if lines: f.write("\n".join(lines) + "\n\n")
    for s in sections:
        for name in sorted(os.listdir(work)):
            if name.startswith(s) and name.endswith(".txt"):
                f.write(f"## {name}\n\n```\n{open(os.path.join(work, name)).read().strip()}\n```\n\n")
print("\n".join(["", f"bench: {report}", "| target | measured | |", "|---|---|---|"] + targets))
PY
