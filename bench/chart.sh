#!/bin/bash
# bench/chart.sh — busbw against message size, one line per system, log-x,
# rendered with gnuplot to PREFIX.svg and PREFIX.png.
#
#   bash bench/chart.sh [-o PREFIX] [-c COLLECTIVE] [-n RANKS] [-t TITLE] [LABEL=]CSV...
#
# Each CSV is one of (recognised by its header):
#   - jobs/bench.lua --csv output (collective,ranks,bytes,...,busbw_gbs),
#     e.g. crun with CRUN_TRANSPORT=shm and =tcp;
#   - the anchors' gloo_bench.py --out / mpi_allreduce CSV
#     (op,world_size,bytes,...,busbw_GBps);
#   - bench/shm_compare.sh's merged all.csv (system,op,ranks,bytes,...),
#     which holds every system: one line per system in it.
# LABEL names the line (default: the file name, or the system column). Rows
# are filtered to COLLECTIVE (default all_reduce) and RANKS (default: the
# first rank count seen). Default PREFIX: bench/results/busbw_<coll>_<n>ranks.
# gnuplot (Debian: gnuplot-nox) is needed; without it the script says so and
# exits 3.
set -eu
SRC=$(cd "$(dirname "$0")/.." && pwd)
PREFIX="" COLL=all_reduce RANKS="" TITLE=""
while getopts "o:c:n:t:" opt; do
  case $opt in
  o) PREFIX=$OPTARG ;; c) COLL=$OPTARG ;; n) RANKS=$OPTARG ;; t) TITLE=$OPTARG ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { echo "chart.sh: no CSV given (usage: bench/chart.sh [-o PREFIX] [-c COLL] [-n RANKS] [LABEL=]CSV...)" >&2; exit 2; }
command -v gnuplot >/dev/null || {
  echo "chart.sh: gnuplot is not installed (Debian: apt-get install gnuplot-nox); no chart drawn" >&2; exit 3; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# Writes one whitespace-separated data file per system: bytes busbw.
RANKS=$(python3 - "$TMP" "$COLL" "$RANKS" "$@" <<'PY'
import csv, os, sys
tmp, coll, ranks, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "broadcast": "broadcast"}
series = {}
for a in args:
    label, path = a.split("=", 1) if "=" in a and not os.path.exists(a) else (None, a)
    if not os.path.exists(path):
        sys.exit(f"chart.sh: no such file {path}")
    with open(path) as f:
        lines = [l for l in f if l.strip() and not l.startswith("#")]
    base = label or os.path.splitext(os.path.basename(path))[0]
    n = 0
    for r in csv.DictReader(lines):
        if "system" in r:
            name, op, k, b, bus = label and f"{label} {r['system']}" or r["system"], r["op"], r["ranks"], r["bytes"], r["busbw_gbs"]
        elif "collective" in r:
            name, op, k, b, bus = base, r["collective"], r["ranks"], r["bytes"], r["busbw_gbs"]
        elif "op" in r and "world_size" in r:
            name, op, k, b, bus = base, NAMES.get(r["op"], r["op"]), r["world_size"], r["bytes"], r["busbw_GBps"]
        else:
            sys.exit(f"chart.sh: {path}: unknown CSV header {list(r)}")
        if op != coll or bus in ("", "nan"): continue
        if not ranks: ranks = k
        if int(k) != int(ranks): continue
        series.setdefault(name, []).append((int(float(b)), float(bus)))
        n += 1
    if n == 0:
        print(f"chart.sh: {path}: no {coll} rows at {ranks or 'any'} ranks", file=sys.stderr)
if not series:
    sys.exit("chart.sh: nothing to plot")
with open(os.path.join(tmp, "index"), "w") as idx:
    for i, (name, pts) in enumerate(series.items()):
        p = os.path.join(tmp, f"s{i}.dat")
        with open(p, "w") as f:
            for b, bus in sorted(pts): f.write(f"{b} {bus}\n")
        idx.write(f"{p}\t{name}\n")
print(ranks)
PY
)
PREFIX=${PREFIX:-$SRC/bench/results/busbw_${COLL}_${RANKS}ranks}
mkdir -p "$(dirname "$PREFIX")"
TITLE=${TITLE:-"$COLL float32, $RANKS ranks: bus bandwidth"}
PLOT=""
while IFS=$'\t' read -r file name; do
  PLOT="${PLOT:+$PLOT, }'$file' using 1:2 with linespoints lw 2 title '$name'"
done < "$TMP/index"
for term in "svg size 800,500 noenhanced" "pngcairo size 800,500 noenhanced"; do
  ext=${term%% *}; ext=${ext#png}; ext=${ext:-png}; [ "$ext" = cairo ] && ext=png
  gnuplot <<GP
set terminal $term
set output '$PREFIX.$ext'
set title "$TITLE"
set logscale x 2
set format x "%.0b%B"
set xlabel 'message size (bytes)'
set ylabel 'busbw (GB/s)'
set key top left
set grid
plot $PLOT
GP
done
echo "chart.sh: wrote $PREFIX.svg and $PREFIX.png"
