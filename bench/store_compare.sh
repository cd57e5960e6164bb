#!/bin/bash
# bench/store_compare.sh — the store benchmark side by side in one run, repeated:
# per repetition torch's TCPStore anchor, then for the unix socket and for
# loopback TCP (CRUN_STORE_UNIX=1/0) jobs/store_bench.lua with a baseline
# build, this build, and this build with CRUN_STORE_ASYNC_SET=0 (each set waits
# for its acknowledgement; the default, like torch's set, does not), each
# against that repetition's torch figures. A job, not a test.
#
#   BASELINE=<other checkout> bash bench/store_compare.sh [BUILD_DIR] [REPS]
#   (env: OUT=folder for the CSVs and outputs, default /tmp/store_compare;
#    ANCHOR=path of anchors/store/store_bench.py; PYTHON=/usr/bin/python3)
# Prints one line per run with the load average; the CSVs are in $OUT.
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$HERE/build}; REPS=${2:-3}
OUT=${OUT:-/tmp/store_compare}; PYTHON=${PYTHON:-/usr/bin/python3}
ANCHOR=${ANCHOR:-/work/shared/anchors/store/store_bench.py}
BASE=${BASELINE:?set BASELINE to a checkout with a build/ (the "before")}
mkdir -p "$OUT"
load() { cut -d' ' -f1 /proc/loadavg; }
for r in $(seq "$REPS"); do
  echo "rep $r torch $(date -u +%H:%M:%S) load $(load)"
  "$PYTHON" "$ANCHOR" --out "$OUT/torch$r.csv" > /dev/null 2>&1 || { echo "torch anchor failed"; exit 1; }
  for u in 1 0; do
    for v in before after acked; do
      la=$(load)
      case $v in
        before) cmd=("$BASE/build/crun-lua" --master-port 0 "$BASE/jobs/store_bench.lua");;
        after) cmd=("$BUILD/crun-lua" --master-port 0 "$HERE/jobs/store_bench.lua");;
        acked) cmd=(env CRUN_STORE_ASYNC_SET=0 "$BUILD/crun-lua" --master-port 0 "$HERE/jobs/store_bench.lua");;
      esac
      CRUN_STORE_UNIX=$u "${cmd[@]}" --torch-csv "$OUT/torch$r.csv" --out "$OUT/$v-u$u-$r.csv" > "$OUT/$v-u$u-$r.txt" 2>&1
      echo "rep $r unix=$u $v load $la: $(grep -E 'latency_get|throughput' "$OUT/$v-u$u-$r.txt" |
        awk '{printf "%s %s us / %s ops/s %s  ", $2, $6, $(NF-2), $NF}')"
    done
  done
done
