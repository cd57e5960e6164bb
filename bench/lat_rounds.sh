#!/bin/bash
# bench/lat_rounds.sh — small all_reduce at 2 ranks, crun (from Lua, shared
# memory) and Open MPI's anchor, in interleaved rounds.
#
#   bash bench/lat_rounds.sh [BUILD_DIR] [ROUNDS]      (env: OUT, ANCHORS)
#
# Each run's figure is a median over 1,000 ops timed one by one, the max over
# ranks per op (jobs/bench.lua --no-barrier, anchors/mpi/mpi_allreduce.c). A
# run lands anywhere between a fast and a slow figure, by the phase the two
# ranks start in (runtime/transport/shm/README.md, third pass), so one run
# compares nothing: this takes ROUNDS (7) of each, interleaved, and prints
# every run and the median per system and size. Output: $OUT/lat.csv
# (system,round,bytes,us) and a summary on stdout.
set -u
BUILD=$(cd "${1:-build}" && pwd)
ROUNDS=${2:-7}
SRC=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/crun-lat-rounds}
ANCH=${ANCHORS:-/tmp/anchors-crun-bench}
mkdir -p "$OUT"
. "$SRC/bench/mpi_anchor.sh"
echo "system,round,bytes,us" > "$OUT/lat.csv"
for r in $(seq "$ROUNDS"); do
  CRUN_SHM=1 timeout 120 "$BUILD/crun-lua" -n 2 --master-port 0 --no-prefix "$SRC/jobs/bench.lua" all_reduce \
    --sizes 8,1K --no-barrier --csv 2>/dev/null | awk -F, -v r="$r" 'NR > 1 && !/^#/ {print "crun," r "," $3 "," $7}' >> "$OUT/lat.csv"
  if [ -x "$ANCH/build/mpi_allreduce" ]; then
    timeout 120 $MPIRUN -np 2 "$ANCH/build/mpi_allreduce" 3 8 1024 2>/dev/null |
      awk -F, -v r="$r" '/^allreduce/ {printf "openmpi,%s,%d,%.3f\n", r, $3, $5 * 1e6}' >> "$OUT/lat.csv"
  fi
done
python3 - "$OUT/lat.csv" "$ROUNDS" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(f"all_reduce float32 sum, 2 ranks, {sys.argv[2]} interleaved rounds: us per run, then the median")
for b in ("8", "1024"):
    for s in ("crun", "openmpi"):
        v = [float(r["us"]) for r in rows if r["system"] == s and r["bytes"] == b]
        if not v: continue
        med = sorted(v)[len(v) // 2]
        print(f"  {s:8s} {b:>5s} B: " + " ".join(f"{x:.2f}" for x in v) + f"  | median {med:.2f}")
PY
