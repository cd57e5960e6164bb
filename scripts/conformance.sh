#!/usr/bin/env bash
# make conformance: random programs of collectives, object collectives and store
# calls run on crun (tcp, shm and mpi) and on torch.distributed with Gloo (Debian's
# python3-torch, installed here when missing); every rank's outputs must agree.
#   scripts/conformance.sh [BUILD_DIR]
#   CONF_PROGRAMS=N (default 24)  CONF_OPS=N ops per program (default 40)
#   CONF_SEED=S first seed (default 1)  CONF_BACKENDS="tcp shm mpi"
# Worlds cycle through 2, 3 and 4 ranks. The TCP runs use a 16 KiB ring slice so
# that the larger tensors cross several slices. Writes BUILD_DIR/conformance.txt.
set -euo pipefail
BUILD=${1:-build}
PROGRAMS=${CONF_PROGRAMS:-24}
OPS=${CONF_OPS:-40}
SEED0=${CONF_SEED:-1}
BACKENDS=${CONF_BACKENDS:-"tcp shm mpi"}
PY=/usr/bin/python3
HERE=$(cd "$(dirname "$0")/.." && pwd)
CJ="$HERE/jobs/conformance"

if ! $PY -c 'import torch, numpy' >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "conformance: installing python3-torch (Debian) for the torch side"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq \
    --no-install-recommends python3-torch python3-numpy >/dev/null
fi
command -v mpirun >/dev/null 2>&1 || BACKENDS=${BACKENDS//mpi/}
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"

work=$(mktemp -d /tmp/crun-conformance.XXXXXX)
trap 'rm -rf "$work"' EXIT
report="$BUILD/conformance.txt"
: > "$report"
fails=0; runs=0; total_ops=0; total_vals=0; total_recs=0; emulated=0
for ((k = 0; k < PROGRAMS; k++)); do
  seed=$((SEED0 + k)); W=$((2 + k % 3))
  prog="$work/p$seed.txt"
  $PY "$CJ/gen.py" --seed "$seed" --world "$W" --ops "$OPS" --out "$prog"
  port=$((30000 + (seed * 7) % 20000))
  if ! timeout -s KILL 300 $PY "$CJ/torch_run.py" "$prog" "$work/t$seed" "$port" >"$work/t$seed.log" 2>&1; then
    echo "seed $seed W=$W: torch run failed:"; tail -5 "$work/t$seed.log"; fails=$((fails + 1)); continue
  fi
  emulated=$((emulated + $(cat "$work/t$seed/emulated.txt")))
  for be in $BACKENDS; do
    out="$work/c$seed-$be"; mkdir -p "$out"
    case $be in
      tcp) cmd=(env CRUN_TRANSPORT=tcp CRUN_RING_SLICE=16384 timeout -s KILL 300 "$BUILD/crun-lua" -n "$W" "$CJ/crun_run.lua" "$prog" "$out") ;;
      shm) cmd=(env CRUN_TRANSPORT=shm timeout -s KILL 300 "$BUILD/crun-lua" -n "$W" "$CJ/crun_run.lua" "$prog" "$out") ;;
      mpi) cmd=(timeout -s KILL 300 $MPIRUN -np "$W" "$BUILD/crun-lua" "$CJ/crun_run.lua" "$prog" "$out") ;;
    esac
    runs=$((runs + 1))
    if ! "${cmd[@]}" >"$out.log" 2>&1; then
      echo "seed $seed W=$W $be: crun run failed:"; tail -5 "$out.log"; fails=$((fails + 1)); continue
    fi
    extra=(); [ "$be" = mpi ] && extra=(--no-store)
    if res=$($PY "$CJ/compare.py" "$prog" "$work/t$seed" "$out" "${extra[@]}"); then :; else fails=$((fails + 1)); fi
    line=$(head -1 <<<"$res")
    echo "seed $seed W=$W $be: $line" | tee -a "$report"
    tail -n +2 <<<"$res" | tee -a "$report"
    read -r ops recs vals < <($PY -c "import json,sys; d = json.loads(sys.argv[1]); print(d['ops'], d['records'], d['values'])" "$line")
    total_ops=$((total_ops + ops)); total_recs=$((total_recs + recs)); total_vals=$((total_vals + vals))
  done
done
summary="conformance: $PROGRAMS programs, $runs crun runs ($BACKENDS), $total_ops ops, $total_recs outputs, $total_vals values compared, $emulated torch-side emulations, $fails failed runs"
echo "$summary" | tee -a "$report"
[ "$fails" -eq 0 ]
