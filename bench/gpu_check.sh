#!/bin/bash
# bench/gpu_check.sh — the GPU checks of issue 12 on a machine with a GPU.
#
#   bench/gpu_check.sh pack BUNDLE.tar.xz [BUILD]   # here: a CUDA build, packed
#   bench/gpu_check.sh run [BUNDLE.tar.xz] [LOGDIR] # there, in a checkout
#
# GPU machines often lack what crun is built on here (Debian's Lua 5.4,
# busted, libuv, libsodium, Open MPI ...) and cannot install it. `pack`
# puts a CUDA build (crun-lua, the Lua modules, the C GPU tests), the shared
# libraries they load apart from glibc, CUDA and NCCL, Lua and busted into
# one archive (about 9 MB); `run` unpacks it and takes CUDA, cuBLAS and NCCL
# from the GPU machine (/usr/local/cuda, else the first found under
# /usr/local, /opt or /usr/lib, e.g. a PyTorch wheel's NCCL). Without a
# bundle, `run` uses the build in ./build and the system's Lua.
#
# `run` runs the C GPU tests, spec.cuda_spec, spec.cuda_math_spec and
# spec.nccl_spec, jobs/bench.lua --device cuda (all_reduce and all_gather,
# 8 B to 128 MiB) and, when NCCL_TESTS names a built nccl-tests build/
# folder, NCCL's own all_reduce_perf and all_gather_perf on the same sizes,
# then a 1-rank jobs/train.lua on the CPU and on the GPU. Each step has a
# time limit; the whole run stays within BUDGET seconds (300). One GPU runs
# the 1-rank cases only: NCCL puts one rank on each GPU.
set -u
cmd=${1:-run}
if [ "$cmd" = pack ]; then
  out=${2:?usage: gpu_check.sh pack BUNDLE.tar.xz [BUILD]}
  build=${3:-build}
  [ -x "$build/crun-lua" ] || { echo "gpu_check: no $build/crun-lua (build first)" >&2; exit 2; }
  st=$(mktemp -d) && trap 'rm -rf "$st"' EXIT
  mkdir -p "$st/build/tests" "$st/lib" "$st/bin" "$st/lua/share" "$st/lua/lib"
  cp -L "$build/crun-lua" "$st/build/" && cp -rL "$build/lua" "$st/build/"
  for t in test_cuda test_cuda_kernels; do [ -x "$build/tests/$t" ] && cp -L "$build/tests/$t" "$st/build/tests/"; done
  strip --strip-debug "$st/build/crun-lua" "$st/build/lua/crun/core.so" "$st"/build/tests/* 2>/dev/null
  cp -L "$(command -v lua5.4)" "$(command -v busted)" "$st/bin/"
  cp -rL /usr/share/lua/5.4/. "$st/lua/share/" && cp -rL /usr/lib/x86_64-linux-gnu/lua/5.4/. "$st/lua/lib/"
  for f in "$st/build/crun-lua" "$st/build/lua/crun/core.so" "$st"/build/tests/* "$st/bin/lua5.4" $(find "$st/lua/lib" -name '*.so'); do
    ldd "$f"
  done | awk '/=>/ {print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so|libcudart|libnccl|libcublas' |
    xargs -r cp -L -t "$st/lib/"
  tar -C "$st" -cJf "$out" . && echo "gpu_check: packed $(du -h "$out" | cut -f1) into $out"
  exit
fi
[ "$cmd" = run ] || { echo "usage: gpu_check.sh pack BUNDLE.tar.xz [BUILD] | run [BUNDLE.tar.xz] [LOGDIR]" >&2; exit 2; }

R=$PWD T0=$(date +%s) BUDGET=${BUDGET:-300} LOG=${3:-/tmp/crun-gpu-check}
mkdir -p "$LOG"
if [ -n "${2:-}" ]; then
  D=$(mktemp -d) && trap 'rm -rf "$D"' EXIT && tar -xJf "$2" -C "$D" || exit 2
  L=$D/bin/lua5.4 BUSTED="$D/bin/lua5.4 $D/bin/busted" BD=$D/build LUAX="$D/lua/share/?.lua;$D/lua/share/?/init.lua;" LUAC="$D/lua/lib/?.so;"
  EXTRA=$D/lib
  export PATH="$D/bin:$PATH" # specs start lua5.4 by name
else
  L=lua5.4 BUSTED="lua5.4 /usr/bin/busted" BD=$R/build LUAX="" LUAC="" EXTRA=""
fi
pick() { # the folder of a CUDA or NCCL library on this machine
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib; do
    [ -e "$d/$1" ] && { echo "$d"; return; }
  done
  f=$(find /usr/local /opt /usr/lib -name "$1" 2>/dev/null | head -1)
  [ -n "$f" ] && dirname "$f"
}
LD=$EXTRA
for n in libcudart.so.13 libnccl.so.2 libcublas.so.13 libcublasLt.so.13; do
  d=$(pick $n)
  echo "$n: ${d:-not found}"
  [ -n "$d" ] && LD="$LD:$d"
done
export LD_LIBRARY_PATH="${LD#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LUA_PATH="$BD/lua/?.lua;$BD/lua/?/init.lua;$R/spec/?.lua;$LUAX;"
export LUA_CPATH="$BD/lua/?.so;$LUAC;"
export CRUN_LUA=$BD/crun-lua CRUN_BUILD_DIR=$BD CRUN_SOURCE_DIR=$R
B="$BUSTED --no-auto-insulate -o utfTerminal"
C=$CRUN_LUA
fails=0
step() { # step NAME LIMIT COMMAND...: its log in $LOG/NAME.log, its last lines here
  local n=$1 t=$2 left=$((BUDGET - ($(date +%s) - T0)))
  shift 2
  if [ $left -lt 15 ]; then echo "=== $n: not run (the ${BUDGET} s budget is spent)"; return; fi
  [ "$t" -gt $left ] && t=$left
  local s=$(date +%s)
  timeout -k 5 "$t" "$@" > "$LOG/$n.log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && fails=$((fails + 1))
  echo "=== $n: rc $rc in $(($(date +%s) - s)) s (limit $t s)"
  tail -n "${TAILN:-8}" "$LOG/$n.log" | cut -c1-240
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
if ! $L -e 'local c = require "crun.cuda"
  print("crun.cuda.is_available()", c.is_available(), "devices", c.device_count(), "nccl", require("crun.core").have_nccl)
  if not c.is_available() then print("gpu_check: skipped: " .. tostring(c.unavailable_reason())) os.exit(77) end'; then
  exit 77
fi
for t in test_cuda test_cuda_kernels; do [ -x "$BD/tests/$t" ] && TAILN=2 step "$t" 60 "$BD/tests/$t"; done
TAILN=4 step cuda_spec 120 $B spec/cuda_spec.lua
TAILN=4 step cuda_math_spec 150 $B spec/cuda_math_spec.lua
TAILN=4 step nccl_spec 150 $B spec/nccl_spec.lua
SZ=8,64,512,4K,32K,256K,2M,16M,128M
for coll in all_reduce all_gather; do
  TAILN=11 step "bench_$coll" 60 $C -n 1 jobs/bench.lua $coll --device cuda --sizes $SZ --budget 1
  TAILN=11 step "bench_${coll}_nocheck" 60 env CRUN_NCCL_CHECK=0 $C -n 1 jobs/bench.lua $coll --device cuda --sizes $SZ --budget 1 --no-barrier
  [ -x "${NCCL_TESTS:-/nonexistent}/${coll}_perf" ] &&
    TAILN=14 step "nccltests_$coll" 60 "$NCCL_TESTS/${coll}_perf" -b 8 -e 128M -f 8 -g 1 -w 5 -n 50
done
for dev in cpu cuda; do
  TAILN=1 step "train_$dev" 90 $C -n 1 jobs/train.lua --device $dev --epochs 1 --hidden 1024 --layers 3 --batch-size 256 --no-ckpt
done
echo "gpu_check: $fails step(s) failed, $(($(date +%s) - T0)) s; logs in $LOG"
[ $fails -eq 0 ]
