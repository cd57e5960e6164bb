#!/usr/bin/env bash
# The main job of `make demo`. Until the training job lands this runs the
# multi-process store demo.
set -euo pipefail
BUILD=${1:-build}
if [ -f jobs/train.lua ] && [ -x "$BUILD/crun-lua" ]; then
  exec "$BUILD/crun-lua" -n 4 jobs/train.lua
fi
source "$BUILD/env.sh"
exec lua5.4 examples/store_demo.lua
