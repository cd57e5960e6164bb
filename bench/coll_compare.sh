#!/bin/bash
# bench/coll_compare.sh — all_reduce side by side: crun (TCP alone and with the
# shared-memory engine), Gloo (torch 1.13) and Open MPI (shared memory and TCP),
# in one run on this machine, at the world sizes given (default 2 4).
#
#   bash bench/coll_compare.sh [BUILD_DIR] [world sizes...]
#
# Every system times ops back to back (no barrier between iterations), takes
# the max over ranks per iteration and reports the median, with nccl-tests'
# busbw = algbw * 2(n-1)/n. Output: one CSV per system and world size under
# $OUT (default /tmp/crun-coll-compare) and a summary table on stdout.
set -u
BUILD=${1:-build}; shift || true
SIZES_N=${*:-2 4}
OUT=${OUT:-/tmp/crun-coll-compare}
BUDGET=${BUDGET:-3}
ANCH=${ANCHORS:-/tmp/anchors-crun-bench}
SRC=$(cd "$(dirname "$0")/.." && pwd)
SIZES=8,1K,64K,1M,16M,64M
mkdir -p "$OUT"
. "$SRC/bench/mpi_anchor.sh"

for n in $SIZES_N; do
  for shm in 0 1; do
    CRUN_SHM=$shm timeout 600 "$BUILD/crun-lua" -n "$n" --master-port 0 --no-prefix "$SRC/jobs/bench.lua" \
      all_reduce --sizes $SIZES --no-barrier --csv > "$OUT/crun_shm${shm}_ws$n.csv"
  done
  timeout 600 /usr/bin/python3 "$ANCH/gloo/gloo_bench.py" --world-size "$n" --budget "$BUDGET" \
    --out "$OUT/gloo_ws$n.csv" > /dev/null 2>&1
  if [ -x "$ANCH/build/mpi_allreduce" ]; then
    timeout 600 $MPIRUN -np "$n" "$ANCH/build/mpi_allreduce" "$BUDGET" > "$OUT/mpi_shm_ws$n.csv" 2>/dev/null
    timeout 600 $MPIRUN -np "$n" --mca btl tcp,self "$ANCH/build/mpi_allreduce" "$BUDGET" > "$OUT/mpi_tcp_ws$n.csv" 2>/dev/null
  fi
done

# Summary: time (us) and busbw (GB/s) per size, one column per system.
python3 - "$OUT" $SIZES_N <<'PY'
import csv, os, sys
out, ns = sys.argv[1], sys.argv[2:]
def load(path, kind):
    rows = {}
    if not os.path.exists(path): return rows
    with open(path) as f:
        lines = [l for l in f if l.strip() and not l.startswith("#")]
    for r in csv.DictReader(lines):
        if kind == "crun":
            rows[int(r["bytes"])] = (float(r["time_us"]), float(r["busbw_gbs"]))
        elif r["op"] == "allreduce":
            rows[int(float(r["bytes"]))] = (float(r["median_s"]) * 1e6, float(r["busbw_GBps"]))
    return rows
for n in ns:
    systems = [("crun tcp", load(f"{out}/crun_shm0_ws{n}.csv", "crun")),
               ("crun shm", load(f"{out}/crun_shm1_ws{n}.csv", "crun")),
               ("gloo", load(f"{out}/gloo_ws{n}.csv", "x")),
               ("mpi shm", load(f"{out}/mpi_shm_ws{n}.csv", "x")),
               ("mpi tcp", load(f"{out}/mpi_tcp_ws{n}.csv", "x"))]
    print(f"\nall_reduce float32 sum, {n} ranks: time us / busbw GB/s (median)")
    print("%10s" % "bytes" + "".join("%22s" % s for s, _ in systems))
    for b in sorted(set().union(*[set(r) for _, r in systems])):
        cells = []
        for _, r in systems:
            cells.append("%22s" % ("%.1f / %.3f" % r[b] if b in r else "-"))
        print("%10d" % b + "".join(cells))
PY
