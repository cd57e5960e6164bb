#!/bin/bash
# bench/launch_bench.sh — launch overhead of a whole 8-rank job, side by side in one run:
#   crun-lua -n 8 examples/hello.lua            (every rank meets at a store barrier, prints, exits)
#   torchrun --nproc_per_node 8 hello.py         (init_process_group gloo + barrier + destroy)
#   torchrun ... --monitor_interval 0.1          (the same without torchrun's 5 s polling)
#   mpirun -np 8 hello_mpi                       (MPI_Init + MPI_Barrier + MPI_Finalize)
# The torch and MPI programs are the anchors of /work/shared/anchors/launch (see its README: Debian's
# torchrun needs launch/torchrun_py311.py on Python 3.11).
#
# Usage: bash bench/launch_bench.sh [runs]      (default 5; env: BUILD=build dir, N=ranks,
#        ANCHORS=anchors dir, SKIP_MI=1 to leave out the monitor_interval 0.1 row,
#        BASELINE=another crun-lua (an older build) timed in the same run, second row)
# Writes results to $OUT (default /tmp/crun-launch-bench) and prints the medians.
set -euo pipefail
RUNS=${1:-5}
N=${N:-8}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}
ANCHORS=${ANCHORS:-/work/shared/anchors}
OUT=${OUT:-/tmp/crun-launch-bench}
CRUN="$BUILD/crun-lua"

for tool in hyperfine mpicc mpirun /usr/bin/python3; do
  command -v "$tool" >/dev/null || { echo "launch_bench: $tool not found" >&2; exit 1; }
done
[ -x "$CRUN" ] || { echo "launch_bench: $CRUN not built (cmake --build $BUILD --target crun-lua)" >&2; exit 1; }

mkdir -p "$OUT"
cp "$ANCHORS/launch/hello.py" "$ANCHORS/launch/hello_mpi.c" "$ANCHORS/launch/torchrun_py311.py" "$OUT/"
mpicc -O2 -o "$OUT/hello_mpi" "$OUT/hello_mpi.c"

# Sanity: each job must succeed before it is timed.
"$CRUN" -n "$N" --master-port 0 "$ROOT/examples/hello.lua" | grep -c "hello from rank" | grep -qx "$N" \
  || { echo "launch_bench: crun-lua hello did not print $N lines" >&2; exit 1; }

export OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo MASTER_ADDR=127.0.0.1
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"
TORCHRUN="/usr/bin/python3 $OUT/torchrun_py311.py --standalone --nproc_per_node $N"
args=(-n "crun-lua -n $N" "$CRUN -n $N --master-port 0 $ROOT/examples/hello.lua")
[ -n "${BASELINE:-}" ] && args+=(-n "baseline crun-lua -n $N" "$BASELINE -n $N --master-port 0 $ROOT/examples/hello.lua")
args+=(-n "torchrun N=$N" "$TORCHRUN $OUT/hello.py")
[ "${SKIP_MI:-0}" = 1 ] || args+=(-n "torchrun N=$N mi=0.1" \
      "/usr/bin/python3 $OUT/torchrun_py311.py --standalone --monitor_interval 0.1 --nproc_per_node $N $OUT/hello.py")
args+=(-n "mpirun -np $N" "$MPIRUN -np $N $OUT/hello_mpi")

hyperfine -N --warmup 1 --runs "$RUNS" --style basic \
  --export-json "$OUT/launch.json" --export-markdown "$OUT/launch.md" "${args[@]}"

/usr/bin/python3 - "$OUT/launch.json" <<'PY'
import json, sys
res = json.load(open(sys.argv[1]))["results"]
base = res[0]["median"]
print("\n%-24s %12s %10s" % ("command", "median", "x crun-lua"))
for r in res:
    print("%-24s %10.1f ms %10.1f" % (r["command"], r["median"] * 1e3, r["median"] / base))
PY
echo "results: $OUT/launch.json, $OUT/launch.md"
