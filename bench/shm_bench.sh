#!/usr/bin/env bash
# shm_bench.sh — the shared-memory engine next to the Open MPI anchor (vader
# shared memory), same methodology (anchors/mpi/mpi_allreduce.c): float32 sum
# all_reduce 8 B..64 MiB at 2, 4 and 8 ranks, REPS runs each, then the median
# of the runs' medians; plus broadcast and all_gather at 16 MiB (compare with
# the Gloo rows of anchors/RESULTS-*.md). Runs are interleaved (shm, mpi, shm,
# ...) so that noise from other load hits both alike.
#
# Usage: BUILD=build-shm bash bench/shm_bench.sh      (after building shm_bench)
# Env:   BUILD (build dir, default build), REPS=3, BUDGET=2 (s per size),
#        RANKS="2 4 8", ANCHORS=/work/shared/anchors, OUT=/tmp/shm_bench_results
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$here/$BUILD ;; esac
REPS=${REPS:-3}
BUDGET=${BUDGET:-2}
RANKS=${RANKS:-"2 4 8"}
ANCHORS=${ANCHORS:-/work/shared/anchors}
OUT=${OUT:-/tmp/shm_bench_results}
SIZES="8 1024 65536 1048576 16777216 67108864"
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"

bench=$BUILD/bench/shm_bench
[ -x "$bench" ] || { echo "no $bench: cmake --build $BUILD --target shm_bench" >&2; exit 1; }
mkdir -p "$OUT"
rm -f "$OUT"/*.csv
have_mpi=0
if command -v mpicc >/dev/null && [ -f "$ANCHORS/mpi/mpi_allreduce.c" ]; then
  mpicc -O2 -march=native -o "$OUT/mpi_allreduce" "$ANCHORS/mpi/mpi_allreduce.c" && have_mpi=1
fi

for n in $RANKS; do
  for r in $(seq "$REPS"); do
    echo "ranks $n run $r" >&2
    timeout 300 "$bench" -n "$n" -b "$BUDGET" $SIZES > "$OUT/shm_ar_n${n}_r$r.csv"
    if [ $have_mpi = 1 ]; then
      timeout 300 $MPIRUN -np "$n" "$OUT/mpi_allreduce" "$BUDGET" $SIZES > "$OUT/mpi_ar_n${n}_r$r.csv"
    fi
    timeout 300 "$bench" -n "$n" -b "$BUDGET" -c broadcast 16777216 > "$OUT/shm_bc_n${n}_r$r.csv"
    timeout 300 "$bench" -n "$n" -b "$BUDGET" -c all_gather 16777216 > "$OUT/shm_ag_n${n}_r$r.csv"
  done
done

python3 - "$OUT" <<'EOF'
import csv, glob, os, statistics, sys
out = sys.argv[1]
rows = {}
for path in glob.glob(os.path.join(out, "*.csv")):
    src = os.path.basename(path).split("_")[0]
    with open(path) as f:
        for row in csv.DictReader(l for l in f if not l.startswith("#")):
            key = (src, row["op"], int(row["world_size"]), int(float(row["bytes"])))
            rows.setdefault(key, []).append((float(row["median_s"]), float(row["busbw_GBps"])))
def med(key):
    v = rows.get(key)
    if not v: return None
    return statistics.median(t for t, _ in v), statistics.median(b for _, b in v), len(v)
def fmt_t(t):
    return "-" if t is None else (f"{t*1e6:.1f} us" if t < 1e-3 else f"{t*1e3:.2f} ms")
print("| op | ranks | bytes | crun shm time | crun shm busbw GB/s | Open MPI time | Open MPI busbw GB/s | busbw ratio |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for key in sorted(k for k in rows if k[0] == "shm"):
    _, op, n, b = key
    s = med(key)
    m = med(("mpi", "allreduce", n, b)) if op == "all_reduce" else None
    ratio = f"{s[1]/m[1]:.2f}x" if m and m[1] > 0 else "-"
    print(f"| {op} | {n} | {b} | {fmt_t(s[0])} | {s[1]:.3f} | {fmt_t(m[0]) if m else '-'} | "
          f"{m[1]:.3f} | {ratio} |" if m else
          f"| {op} | {n} | {b} | {fmt_t(s[0])} | {s[1]:.3f} | - | - | - |")
runs = max(len(v) for v in rows.values())
print(f"\n(median of {runs} runs each; per-op time = max over ranks, median over iterations)")
EOF
