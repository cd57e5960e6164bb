#!/usr/bin/env bash
# `timeout` for sanitizer builds: scripts/san_run.sh puts this first in the
# tests' PATH (as san-bin/timeout), so that the fixed deadlines specs give
# coreutils' timeout (`timeout -s KILL 60 crun-lua ...`) grow with the
# slowdown of instrumented code: the duration is multiplied by
# CRUN_SAN_TIMEOUT_SCALE (default 5), options and the command are passed on.
scale=${CRUN_SAN_TIMEOUT_SCALE:-5}
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -s|-k|--signal|--kill-after) args+=("$1" "$2"); shift 2 ;;
    -*) args+=("$1"); shift ;;
    *) break ;;
  esac
done
d=${1:-}
shift
if [[ "$d" =~ ^([0-9]+(\.[0-9]+)?)([smhd]?)$ ]]; then
  d=$(awk -v v="${BASH_REMATCH[1]}" -v k="$scale" 'BEGIN { printf "%g", v * k }')${BASH_REMATCH[3]}
fi
exec /usr/bin/timeout "${args[@]}" "$d" "$@"
