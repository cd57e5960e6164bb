#!/bin/bash
# bench/store_pinned.sh — store get latency with the client and the server in two
# processes, pinned to different CPUs (as an idle machine's scheduler places them)
# and unpinned, side by side in one run: torch's TCPStore, crun over its unix
# socket and over loopback TCP, each with polling (default) and CRUN_STORE_SPIN_US=0.
#
#   bash bench/store_pinned.sh [BUILD_DIR] [N]     (env: BASELINE=another build dir,
#                                                  timed in the same run; CPUS="0 1")
# Uses bench/store_lat.lua and bench/store_lat_torch.py. A job, not a test.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
N=${2:-5000}
read -r CA CB <<< "${CPUS:-0 1}"
export CRUN_TOKEN=${CRUN_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}

# run_pair PIN_CLIENT PIN_SERVER SERVER_CMD... -- CLIENT_CMD... : prints the client's line
run_pair() {
  local pc=$1 ps=$2; shift 2
  local srv=() cli=()
  while [ "$1" != -- ]; do srv+=("$1"); shift; done
  shift; cli=("$@")
  local t1=() t2=()
  [ "$ps" != - ] && t1=(taskset -c "$ps")
  [ "$pc" != - ] && t2=(taskset -c "$pc")
  timeout 120 "${t1[@]}" "${srv[@]}" &
  local sp=$!
  sleep "${WAIT:-0.5}"
  timeout 120 "${t2[@]}" "${cli[@]}" || echo "(client failed)"
  wait "$sp"
}

crun_row() { # name build unix spin pc ps
  local port=$((30000 + RANDOM % 2000))
  printf "%-40s " "$1"
  CRUN_STORE_UNIX=$3 CRUN_STORE_SPIN_US=$4 run_pair "$5" "$6" \
    "$2/crun-lua" -n 1 --master-port 0 --no-prefix "$ROOT/bench/store_lat.lua" server $port -- \
    "$2/crun-lua" -n 1 --master-port 0 --no-prefix "$ROOT/bench/store_lat.lua" client $port "$N"
}

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); start $(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg)"
for pin in "$CA $CB" "- -"; do
  read -r pc ps <<< "$pin"
  echo "## client on CPU $pc, server on CPU $ps ('-': unpinned)"
  port=$((32000 + RANDOM % 2000))
  printf "%-40s " "torch TCPStore (TCP)"
  WAIT=2.5 run_pair "$pc" "$ps" /usr/bin/python3 "$ROOT/bench/store_lat_torch.py" server $port -- \
    /usr/bin/python3 "$ROOT/bench/store_lat_torch.py" client $port "$N"
  for u in 1 0; do
    t=$([ $u = 1 ] && echo "unix socket" || echo "loopback TCP")
    crun_row "crun, $t" "$BUILD" $u 50 "$pc" "$ps"
    crun_row "crun, $t, CRUN_STORE_SPIN_US=0" "$BUILD" $u 0 "$pc" "$ps"
    [ -n "${BASELINE:-}" ] && crun_row "baseline crun, $t" "$(cd "$BASELINE" && pwd)" $u 50 "$pc" "$ps"
  done
done
echo "end $(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg)"
