#!/bin/bash
# bench/mpi_bench.sh — all_reduce float32 sum in one run, side by side:
#   crun cpu backend   crun-lua -n N jobs/bench.lua all_reduce
#   crun mpi backend   mpirun -np N crun-lua jobs/bench.lua all_reduce (backend auto = mpi)
#   crun mpi, no check the same with CRUN_MPI_CHECK=0 (no signature exchange)
#   Open MPI itself    mpirun -np N mpi_allreduce (the anchor, /work/shared/anchors/mpi)
# and the cost of the mpi wrapper over Open MPI's own MPI_Allreduce per size.
#
#   bash bench/mpi_bench.sh [BUILD_DIR] [world sizes...]     (default: build 4)
#
# Every system times ops back to back (no barrier between iterations), takes
# the max over ranks per iteration and reports the median. CSVs go to $OUT
# (default /tmp/crun-mpi-bench); the table goes to stdout.
set -u
BUILD=${1:-build}; shift || true
NS=${*:-4}
OUT=${OUT:-/tmp/crun-mpi-bench}
BUDGET=${BUDGET:-3}
ANCH=${ANCHORS:-/tmp/anchors-crun-mpi-bench}
SRC=$(cd "$(dirname "$0")/.." && pwd)
SIZES=8,1K,64K,1M,16M,64M
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"
mkdir -p "$OUT"
[ -d "$ANCH" ] || cp -r /work/shared/anchors "$ANCH"
if [ ! -x "$ANCH/build/mpi_allreduce" ]; then
  mkdir -p "$ANCH/build" && mpicc -O2 -march=native -o "$ANCH/build/mpi_allreduce" "$ANCH/mpi/mpi_allreduce.c" || exit 1
fi
BENCH=("$SRC/jobs/bench.lua" all_reduce --sizes "$SIZES" --no-barrier --csv)

for n in $NS; do
  timeout 600 "$BUILD/crun-lua" -n "$n" --master-port 0 --no-prefix "${BENCH[@]}" > "$OUT/cpu_ws$n.csv"
  (unset CRUN_BACKEND; timeout 600 $MPIRUN -np "$n" "$BUILD/crun-lua" "${BENCH[@]}" > "$OUT/mpi_ws$n.csv")
  (unset CRUN_BACKEND; CRUN_MPI_CHECK=0 timeout 600 $MPIRUN -x CRUN_MPI_CHECK -np "$n" "$BUILD/crun-lua" \
     "${BENCH[@]}" > "$OUT/mpinocheck_ws$n.csv")
  timeout 600 $MPIRUN -np "$n" "$ANCH/build/mpi_allreduce" "$BUDGET" > "$OUT/ompi_ws$n.csv" 2>/dev/null
done

python3 - "$OUT" $NS <<'PY'
import csv, os, sys
out, ns = sys.argv[1], sys.argv[2:]
def load(path, tcol, scale):
    rows = {}
    if not os.path.exists(path): return rows
    with open(path) as f:
        lines = [l for l in f if l.strip() and not l.startswith("#")]
    for r in csv.DictReader(lines):
        rows[int(float(r["bytes"]))] = float(r[tcol]) * scale
    return rows
def fmt(us): return "-" if us is None else ("%.1f us" % us if us < 1000 else "%.2f ms" % (us / 1000))
for n in ns:
    cpu = load(f"{out}/cpu_ws{n}.csv", "time_us", 1)
    mpi = load(f"{out}/mpi_ws{n}.csv", "time_us", 1)
    raw = load(f"{out}/mpinocheck_ws{n}.csv", "time_us", 1)
    omp = load(f"{out}/ompi_ws{n}.csv", "median_s", 1e6)
    print(f"\nall_reduce float32 sum, {n} ranks (median of per-iteration max over ranks; busbw = 2(n-1)/n x bytes/time)")
    print("| size | crun cpu | crun mpi | crun mpi, CRUN_MPI_CHECK=0 | Open MPI MPI_Allreduce | mpi vs Open MPI | mpi busbw GB/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for b in sorted(set(cpu) | set(mpi) | set(omp)):
        m, o = mpi.get(b), omp.get(b)
        over = "-" if m is None or o is None else "%+.1f%%" % (100 * (m - o) / o)
        bus = "-" if m is None else "%.3f" % (b / (m * 1e-6) / 1e9 * 2 * (int(n) - 1) / int(n))
        print(f"| {b} | {fmt(cpu.get(b))} | {fmt(m)} | {fmt(raw.get(b))} | {fmt(o)} | {over} | {bus} |")
PY
