#!/bin/bash
# bench/multihost_bench.sh — all_reduce across network-namespace hosts
# (scripts/netns.sh) whose links tc netem shapes, in one run: crun
# hierarchical (shared memory inside a host, TCP among one rank per host),
# crun flat TCP (CRUN_TRANSPORT=tcp) and Open MPI over TCP (btl tcp,self;
# mpirun on h0, its daemons started through netns.sh agent) and Gloo
# (torch.distributed from Debian's python3-torch, the anchors' gloo_bench.py,
# one process per rank started inside its host with RANK/WORLD_SIZE set as
# torchrun would, GLOO_SOCKET_IFNAME=eth0). Without torch the Gloo column is
# left empty and the table says why.
#
#   sudo bash bench/multihost_bench.sh [BUILD_DIR] [host counts...]   (default: build 2 4)
#
# Every host's eth0 sends at most RATE (default 10gbit) with DELAY (default
# 50us) added: netem on each host's egress, so every host-to-host transfer
# crosses one shaped link. A kernel without sch_netem gets tbf instead: the
# rate without the delay (the table says which). RANKS ranks per host
# (default 2). Sizes 8 B .. 64 MiB (SIZES). The hosts share this machine's
# CPUs, so neither crun nor mpirun pins ranks (each host would pin its ranks
# to the same first CPUs). Output: a CSV per system and host count under OUT
# (default /tmp/crun-multihost-bench) and bench/results/multihost.md with the
# table (time and busbw per size; the link rate as the limit column), the
# CSVs under bench/results/multihost/, and a
# busbw chart per host count (bench/chart.sh: multihost_<H>hosts.svg/.png).
# NAME (default multihost) names those results files, so runs at several
# rates can sit side by side (NAME=multihost_5gbit RATE=5gbit ...).
#
# What the machine can carry: the hosts share this machine's CPUs, and every
# byte crossing a "link" is copied by the kernel on both ends, so a fast
# shaped rate may be more than the CPUs can move. Before the systems run, the
# same hosts (same shaping) carry iperf3 (Debian's iperf3) in a ring, every
# host sending to the next at once for IPERF_SECONDS (default 3) - the traffic
# pattern of a ring all_reduce's TCP stage. The table gives that rate per
# link beside the link rate: where it is below the link rate, the CPUs, not
# the link, bound every system in that table.
set -u
BUILD=${1:-build}; shift || true
HOSTS_N=${*:-2 4}
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "$BUILD" && pwd)
OUT=${OUT:-/tmp/crun-multihost-bench}
RATE=${RATE:-10gbit}
DELAY=${DELAY:-50us}
RANKS=${RANKS:-2}
SIZES=${SIZES:-8,1K,8K,64K,256K,1M,4M,16M,64M}
BUDGET=${BUDGET:-2}
NAME=${NAME:-multihost}
IPERF_SECONDS=${IPERF_SECONDS:-3}
NETNS=$SRC/scripts/netns.sh
mkdir -p "$OUT"
GLOO_PY=$SRC/../shared/anchors/gloo/gloo_bench.py
[ -f "$GLOO_PY" ] || GLOO_PY=/work/shared/anchors/gloo/gloo_bench.py
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "multihost_bench: no torch (apt-get install python3-torch): Gloo not measured" >&2; GLOO_PY=""; }
# gloo_bench.py takes sizes in bytes
GLOO_SIZES=$(python3 -c 'import sys; print(",".join(str(int(t[:-1]) << {"K": 10, "M": 20, "G": 30}[t[-1]]) if t[-1] in "KMG" else t for t in sys.argv[1].split(",")))' "$SIZES")
rm -f "$OUT"/*.csv "$OUT"/iperf_h*
why=$("$NETNS" check) || { echo "multihost_bench: $why" >&2; exit 77; }

MPI_BIN=$OUT/mpi_allreduce
if [ ! -x "$MPI_BIN" ] && command -v mpicc >/dev/null; then
  mpicc -O2 -march=native -o "$MPI_BIN" "$SRC/../shared/anchors/mpi/mpi_allreduce.c" 2>/dev/null ||
    mpicc -O2 -march=native -o "$MPI_BIN" /work/shared/anchors/mpi/mpi_allreduce.c
fi

# iperf3 in a ring over hosts 0..H-1 of TAG (host i sends to host i+1, all at
# once); writes the mean received rate per link in GB/s to OUT/iperf_hH.
ring_iperf() {
  local tag=$1 h=$2 i pids=()
  command -v iperf3 >/dev/null || { echo "no iperf3 (apt-get install iperf3)" >"$OUT/iperf_h$h"; return 0; }
  for ((i = 0; i < h; i++)); do
    timeout 60 "$NETNS" exec "$tag" $(((i + 1) % h)) iperf3 -s -1 -p $((5300 + i)) >/dev/null 2>&1 &
    pids+=($!)
  done
  sleep 0.5
  for ((i = 0; i < h; i++)); do
    timeout 60 "$NETNS" exec "$tag" "$i" iperf3 -J -c "$("$NETNS" addr $(((i + 1) % h)))" -p $((5300 + i)) \
      -t "$IPERF_SECONDS" >"$OUT/iperf_h$h.$i.json" 2>/dev/null &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i"; done
  python3 - "$OUT" "$h" >"$OUT/iperf_h$h" <<'PY'
import json, sys
out, h = sys.argv[1], int(sys.argv[2])
try:
    v = [json.load(open(f"{out}/iperf_h{h}.{i}.json"))["end"]["sum_received"]["bits_per_second"] / 8e9 for i in range(h)]
    print("%.3f" % (sum(v) / len(v)))
except Exception as e:
    print(f"iperf3 failed: {e}")
PY
}

# One host count: build the hosts, shape them, run every system.
run_hosts() {
  local h=$1 tag i hostlist=""
  tag="b$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n' | cut -c1-5)"
  "$NETNS" up "$tag" "$h" $$
  trap '"$NETNS" down '"$tag" RETURN
  for ((i = 0; i < h; i++)); do
    ip netns exec "crun-$tag-h$i" tc qdisc add dev eth0 root netem delay "$DELAY" rate "$RATE" limit 100000 \
      2>/dev/null && echo "netem rate $RATE delay $DELAY" >"$OUT/shaping" ||
      { ip netns exec "crun-$tag-h$i" tc qdisc add dev eth0 root tbf rate "$RATE" burst 1mb latency 20ms &&
        echo "tbf rate $RATE (no sch_netem in this kernel: no delay added)" >"$OUT/shaping"; } ||
      { echo "multihost_bench: cannot shape host $i's link" >&2; return 1; }
    hostlist+="${hostlist:+,}h$i:$RANKS"
  done
  ring_iperf "$tag" "$h"
  export CRUN_TOKEN=bench-$tag CRUN_CGROUP=0
  for mode in hier tcp; do
    local env="" pids=()
    [ $mode = tcp ] && env="CRUN_TRANSPORT=tcp"
    for ((i = 0; i < h; i++)); do
      timeout -s KILL 900 "$NETNS" exec "$tag" "$i" env $env "$BUILD/crun-lua" -n "$RANKS" --nnodes "$h" \
        --node-rank "$i" --master-addr 10.77.0.1 --master-port 29500 --no-prefix --cpu-bind none \
        "$SRC/jobs/bench.lua" all_reduce --sizes "$SIZES" --no-barrier --csv \
        >"$OUT/crun_${mode}_h$h.node$i.csv" 2>"$OUT/crun_${mode}_h$h.node$i.err" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    cp "$OUT/crun_${mode}_h$h.node0.csv" "$OUT/crun_${mode}_h$h.csv"
  done
  if [ -n "$GLOO_PY" ]; then
    local ws=$((h * RANKS)) r pids=()
    for ((i = 0; i < h; i++)); do
      for ((r = 0; r < RANKS; r++)); do
        timeout -s KILL 900 "$NETNS" exec "$tag" "$i" env RANK=$((i * RANKS + r)) LOCAL_RANK=$r WORLD_SIZE=$ws \
          MASTER_ADDR=10.77.0.1 MASTER_PORT=29600 GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 \
          /usr/bin/python3 "$GLOO_PY" --ops allreduce --sizes "$GLOO_SIZES" --budget "$BUDGET" \
          --out "$OUT/gloo_h$h.csv" >/dev/null 2>"$OUT/gloo_h$h.r$((i * RANKS + r)).err" &
        pids+=($!)
      done
    done
    for p in "${pids[@]}"; do wait "$p"; done
  fi
  if [ -x "$MPI_BIN" ]; then
    CRUN_NETNS_TAG=$tag timeout -s KILL 900 "$NETNS" exec "$tag" 0 mpirun --allow-run-as-root --oversubscribe --bind-to none \
      --host "$hostlist" -np $((h * RANKS)) --mca plm_rsh_agent "$NETNS agent" --mca btl tcp,self \
      --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
      "$MPI_BIN" "$BUDGET" >"$OUT/mpi_tcp_h$h.csv" 2>"$OUT/mpi_tcp_h$h.err"
  fi
}

for h in $HOSTS_N; do run_hosts "$h"; done

python3 - "$OUT" "$RATE" "$(cat "$OUT/shaping")" "$RANKS" "$SRC/bench/results/$NAME.md" "$NAME" $HOSTS_N <<'PY'
import csv, os, re, sys
out, rate, shaping, ranks, md, name, hs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7:]
def load(path, kind):
    rows = {}
    if not os.path.exists(path): return rows
    with open(path) as f:
        lines = [l for l in f if l.strip() and not l.startswith("#")]
    for r in csv.DictReader(lines):
        if kind == "crun":
            rows[int(r["bytes"])] = (float(r["time_us"]), float(r["busbw_gbs"]))
        elif r.get("op") == "allreduce":
            rows[int(float(r["bytes"]))] = (float(r["median_s"]) * 1e6, float(r["busbw_GBps"]))
    return rows
m = re.match(r"([\d.]+)([kmg]?)bit", rate.lower())
link = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8 / 1e9 if m else float("nan")
text = [f"# all_reduce across network-namespace hosts\n",
        f"float32 sum; {ranks} ranks per host; every host's link shaped by tc: {shaping}; time us / busbw GB/s (median, nccl-tests' busbw). The limit column is the "
        f"link rate ({link:.3f} GB/s): with ranks on H hosts the hierarchical all_reduce sends "
        f"2(H-1)/H of the data over each link, so its busbw measured over all ranks may pass the link rate.\n",
        f"Command: `sudo{'' if name == 'multihost' else ' NAME=' + name}{'' if rate == '10gbit' else ' RATE=' + rate} "
        f"bash bench/multihost_bench.sh build {' '.join(hs)}`.\n"]
for h in hs:
    systems = [("crun hier", load(f"{out}/crun_hier_h{h}.csv", "crun")),
               ("crun tcp", load(f"{out}/crun_tcp_h{h}.csv", "crun")),
               ("Open MPI tcp", load(f"{out}/mpi_tcp_h{h}.csv", "x")),
               ("Gloo", load(f"{out}/gloo_h{h}.csv", "x"))]
    text.append(f"\n## {h} hosts x {ranks} ranks\n")
    ip = open(f"{out}/iperf_h{h}").read().strip() if os.path.exists(f"{out}/iperf_h{h}") else "not measured"
    try:
        ipf = float(ip)
        text.append(f"iperf3 in a ring over the same hosts, same run: {ipf:.3f} GB/s per link "
                    f"({100 * ipf / link:.0f} % of the link rate).\n")
    except ValueError:
        text.append(f"iperf3 ring: {ip}.\n")
    text.append("| bytes | " + " | ".join(s for s, _ in systems) + " | link GB/s | crun hier: link use |")
    text.append("| --- |" + " --- |" * (len(systems) + 2))
    H = int(h)
    for b in sorted(set().union(*[set(r) for _, r in systems])):
        cells = ["%.1f / %.3f" % r[b] if b in r else "-" for _, r in systems]
        hier = systems[0][1].get(b)
        # bytes each host's link carried per second: 2(H-1)/H of the buffer per all_reduce
        use = "%.0f %%" % (100 * b * 2 * (H - 1) / H / (hier[0] * 1e-6) / 1e9 / link) if hier and hier[0] > 0 else "-"
        text.append(f"| {b} | " + " | ".join(cells) + f" | {link:.3f} | {use} |")
os.makedirs(os.path.dirname(md), exist_ok=True)
with open(md, "w") as f: f.write("\n".join(text) + "\n")
print("\n".join(text))
PY

# The data behind the table and charts, kept beside them.
mkdir -p "$SRC/bench/results/$NAME"
for h in $HOSTS_N; do
  for f in crun_hier_h$h.csv crun_tcp_h$h.csv mpi_tcp_h$h.csv gloo_h$h.csv iperf_h$h; do
    [ -s "$OUT/$f" ] && cp "$OUT/$f" "$SRC/bench/results/$NAME/"
  done
done

# One chart per host count (needs gnuplot; the table stands without it).
for h in $HOSTS_N; do
  csvs=()
  for f in "crun hier=crun_hier_h$h.csv" "crun tcp=crun_tcp_h$h.csv" "Open MPI tcp=mpi_tcp_h$h.csv" "Gloo=gloo_h$h.csv"; do
    [ -s "$OUT/${f#*=}" ] && csvs+=("${f%%=*}=$OUT/${f#*=}")
  done
  bash "$SRC/bench/chart.sh" -o "$SRC/bench/results/${NAME}_${h}hosts" -n $((h * RANKS)) \
    -t "all_reduce busbw, $h hosts x $RANKS ranks, $(cat "$OUT/shaping")" "${csvs[@]}" || true
done
