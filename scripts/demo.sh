#!/usr/bin/env bash
# The main job of `make demo`: trains the MLP classifier of jobs/train.lua
# with DDP on 4 ranks (progress, per-epoch exactly-once evaluation and
# checkpoints), then evaluates the final checkpoint on 3 ranks with
# jobs/evaluate.lua (2000 test samples do not split evenly over 3 ranks:
# each is still counted once).
set -euo pipefail
BUILD=${1:-build}
if [ ! -x "$BUILD/crun-lua" ]; then
  echo "demo: $BUILD/crun-lua is missing; run 'make build' first" >&2
  exit 1
fi
CKPT="$BUILD/demo-ckpt"
"$BUILD/crun-lua" -n 4 jobs/train.lua --ckpt-dir "$CKPT" --no-resume
"$BUILD/crun-lua" -n 3 jobs/evaluate.lua --ckpt "$CKPT/train.crun"
