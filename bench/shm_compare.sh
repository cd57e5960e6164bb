#!/bin/bash
# bench/shm_compare.sh — issue 7 benchmark: crun (shared-memory engine and TCP
# alone) next to Gloo (torch 1.13) and Open MPI (shared memory) in one run, at
# the world sizes given (default 2 4 8), REPS runs each (default 3), reporting
# the median of the runs.
#
#   bash bench/shm_compare.sh [BUILD_DIR] [world sizes...]
#   env: OUT (default /tmp/crun-shm-compare), REPS (3), BUDGET (Gloo/MPI
#        seconds per cell, 1), ANCHORS (default /tmp/anchors-hier, copied from
#        /work/shared/anchors when missing)
#
# Systems: crun shm (the engine as crun-lua runs it: direct path on the shared
# tensor heap), crun bounce (the same engine copying through its segment, as
# without crun-lua: CRUN_SHM_DIRECT=0), crun tcp, Gloo, Open MPI.
# Measured: all_reduce float32 sum 8 B..64 MiB (every system), broadcast and
# all_gather at 1 and 16 MiB (crun shm and Gloo: gloo_bench.py measures
# both). Every system times ops back to back (crun: jobs/bench.lua
# --no-barrier), takes the max over ranks per iteration and its median;
# busbw as nccl-tests define it. Output: raw CSVs under $OUT/raw, the merged
# $OUT/all.csv (system,op,ranks,bytes,time_us,busbw_gbs: median of the runs)
# for bench/chart.sh, a table on stdout with the machine's load, and
# $OUT/all_reduce_<n>ranks.{svg,png} charts.
set -u
BUILD=${1:-build}; shift || true
NS=${*:-2 4 8}
OUT=${OUT:-/tmp/crun-shm-compare}
REPS=${REPS:-3}
BUDGET=${BUDGET:-1}
ANCH=${ANCHORS:-/tmp/anchors-hier}
SRC=$(cd "$(dirname "$0")/.." && pwd)
AR_SIZES=8,1K,64K,1M,16M,64M
BIG_SIZES=1M,16M
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"
[ -x "$BUILD/crun-lua" ] || { echo "shm_compare: no $BUILD/crun-lua (build the crun-lua target first)" >&2; exit 2; }
mkdir -p "$OUT/raw"
[ -d "$ANCH" ] || cp -r /work/shared/anchors "$ANCH"
if [ ! -x "$ANCH/build/mpi_allreduce" ] && command -v mpicc >/dev/null; then
  mkdir -p "$ANCH/build" && mpicc -O2 -march=native -o "$ANCH/build/mpi_allreduce" "$ANCH/mpi/mpi_allreduce.c"
fi
crun() {  # crun <transport> <ranks> <collective> <sizes> <out> (bounce: shm without the direct path)
  local tr=$1 direct=1
  [ "$tr" = bounce ] && tr=shm direct=0
  CRUN_TRANSPORT=$tr CRUN_SHM_DIRECT=$direct timeout 600 "$BUILD/crun-lua" -n "$2" --master-port 0 --no-prefix "$SRC/jobs/bench.lua" \
    "$3" --sizes "$4" --no-barrier --csv > "$5" || echo "shm_compare: crun $1 $3 at $2 ranks failed" >&2
}
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/load.txt"
for rep in $(seq 1 "$REPS"); do
  for n in $NS; do
    R="$OUT/raw/r${rep}_n$n"
    crun shm "$n" all_reduce $AR_SIZES "${R}_crun_shm_all_reduce.csv"
    crun shm "$n" broadcast $BIG_SIZES "${R}_crun_shm_broadcast.csv"
    crun shm "$n" all_gather $BIG_SIZES "${R}_crun_shm_all_gather.csv"
    crun bounce "$n" all_reduce $AR_SIZES "${R}_crun_bounce_all_reduce.csv"
    crun tcp "$n" all_reduce $AR_SIZES "${R}_crun_tcp_all_reduce.csv"
    timeout 600 /usr/bin/python3 "$ANCH/gloo/gloo_bench.py" --world-size "$n" --budget "$BUDGET" \
      --ops allreduce,broadcast,allgather --out "${R}_gloo.csv" > /dev/null 2>&1 || echo "shm_compare: gloo at $n ranks failed" >&2
    if [ -x "$ANCH/build/mpi_allreduce" ]; then
      timeout 600 $MPIRUN -np "$n" "$ANCH/build/mpi_allreduce" "$BUDGET" > "${R}_mpi.csv" 2>/dev/null ||
        echo "shm_compare: Open MPI at $n ranks failed" >&2
    fi
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/load.txt"

# Merge: median over runs per (system, op, ranks, bytes); then the table.
python3 - "$OUT" <<'PY'
import csv, glob, os, re, statistics, sys
out = sys.argv[1]
cells = {}
NAMES = {"allreduce": "all_reduce", "broadcast": "broadcast", "allgather": "all_gather"}
for path in glob.glob(f"{out}/raw/r*_n*_*.csv"):
    m = re.match(r"r\d+_n(\d+)_(.*)\.csv", os.path.basename(path))
    n, what = int(m.group(1)), m.group(2)
    with open(path) as f:
        lines = [l for l in f if l.strip() and not l.startswith("#")]
    for r in csv.DictReader(lines):
        try:
            if what.startswith("crun_"):
                system, op = "crun " + what.split("_")[1], r["collective"]
                t, bus, b = float(r["time_us"]), float(r["busbw_gbs"]), int(r["bytes"])
            else:
                system, op = ("gloo" if what == "gloo" else "openmpi"), NAMES.get(r["op"])
                t, bus, b = float(r["median_s"]) * 1e6, float(r["busbw_GBps"]), int(float(r["bytes"]))
        except (KeyError, ValueError, TypeError):
            continue
        if op is None: continue
        cells.setdefault((system, op, n, b), []).append((t, bus))
rows = []
for (system, op, n, b), v in sorted(cells.items()):
    rows.append((system, op, n, b, statistics.median(x[0] for x in v), statistics.median(x[1] for x in v), len(v)))
with open(f"{out}/all.csv", "w") as f:
    f.write("system,op,ranks,bytes,time_us,busbw_gbs,runs\n")
    for r in rows: f.write("%s,%s,%d,%d,%.2f,%.4f,%d\n" % r)
get = {(r[0], r[1], r[2], r[3]): r for r in rows}
systems = ["crun shm", "crun bounce", "crun tcp", "gloo", "openmpi"]
for op in ["all_reduce", "broadcast", "all_gather"]:
    for n in sorted({r[2] for r in rows}):
        sizes = sorted({r[3] for r in rows if r[1] == op and r[2] == n})
        if not sizes: continue
        print(f"\n{op} float32, {n} ranks: time us / busbw GB/s (median of runs)")
        print("%10s" % "bytes" + "".join("%22s" % s for s in systems))
        for b in sizes:
            print("%10d" % b + "".join("%22s" % ("%.1f / %.3f" % get[(s, op, n, b)][4:6] if (s, op, n, b) in get else "-")
                                       for s in systems))
PY

# Charts of busbw against size per world size (bench/chart.sh; skipped with a
# note when gnuplot is missing).
for n in $NS; do
  bash "$SRC/bench/chart.sh" -o "$OUT/all_reduce_${n}ranks" -n "$n" \
    -t "all_reduce float32 sum, $n ranks (median of $REPS runs)" "$OUT/all.csv" || true
done
