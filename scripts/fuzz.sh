#!/usr/bin/env bash
# fuzz.sh — builds the libFuzzer targets of tests/fuzz with clang and runs
# each for a bounded time, then prints executions, coverage and crashes per
# target (used by `make fuzz` and by ctest's fuzz.smoke).
#
#   scripts/fuzz.sh [--build DIR] [--cc CLANG] [--seconds S | --runs N]
#                   [--smoke] [--jobs J] [target ...]
#
# --seconds S   run each target S seconds (default $FUZZ_SECONDS or 60)
# --runs N      run each target for N executions instead
# --smoke       CI mode: 5 s per target over a scratch copy of the corpus
# --no-build    use the targets already built in DIR
# $FUZZ_ARGS     more libFuzzer flags for every target, e.g. FUZZ_ARGS=-max_len=1024
# A target's corpus is tests/fuzz/corpus/<target> (seeds, read only) plus
# DIR/corpus/<target> (what the run adds); a crash leaves its input in
# DIR/crashes/<target>/ and makes the script exit 1.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
build=$src/build-fuzz cc=${CC_FUZZ:-} seconds=${FUZZ_SECONDS:-60} runs="" smoke=0 jobs=${JOBS:-2} nobuild=0
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --cc) cc=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --smoke) smoke=1; seconds=5; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    --no-build) nobuild=1; shift ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ -z "$cc" ]; then cc=$(command -v clang-14 || command -v clang || true); fi
if [ -z "$cc" ]; then
  echo "fuzz: SKIPPED: no clang found (apt-get install clang); libFuzzer comes with it"
  exit 77
fi
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$src"/tests/fuzz/*.c; do targets+=("$(basename "$f" .c)"); done
fi

mkdir -p "$build"
[ $nobuild -eq 0 ] && echo "fuzz: building in $build with $cc"
if [ $nobuild -eq 0 ] && ! { cmake -S "$src" -B "$build" -DCMAKE_C_COMPILER="$cc" -DCRUN_FUZZ=ON -DCRUN_BUILD_TESTS=OFF \
         -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/configure.log" 2>&1 &&
       cmake --build "$build" --target fuzz -j "$jobs" >"$build/build.log" 2>&1; }; then
  tail -30 "$build/configure.log" "$build/build.log" 2>/dev/null
  echo "fuzz: FAILED to build the targets"
  exit 1
fi

# Prints one summary line from a libFuzzer log.
summary() {
  local name=$1 log=$2 rc=$3
  local execs cov ft corp crashes
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  corp=$(grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' "$log" | tail -1 | cut -d' ' -f2)
  crashes=$(ls "$build/crashes/$name" 2>/dev/null | wc -l)
  printf '%-16s execs %-10s cov %-6s ft %-7s corpus %-10s crashes %s%s\n' "$name" "${execs:-?}" \
    "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes" "$([ "$rc" -ne 0 ] && echo "  (exit $rc: see $log)")"
}

status=0
lines=()
for t in "${targets[@]}"; do
  bin=$build/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "fuzz: no target $t"; status=1; continue; }
  seeds=$src/tests/fuzz/corpus/$t
  work=$build/corpus/$t
  [ $smoke -eq 1 ] && work=$build/smoke-corpus/$t && rm -rf "$work"
  mkdir -p "$work" "$build/crashes/$t" "$build/logs"
  dict=()
  [ -f "$src/tests/fuzz/$t.dict" ] && dict=(-dict="$src/tests/fuzz/$t.dict")
  bound=(-max_total_time="$seconds")
  [ -n "$runs" ] && bound=(-runs="$runs")
  log=$build/logs/$t.log
  echo "fuzz: $t (${bound[*]})"
  ASAN_OPTIONS=${ASAN_OPTIONS:-allocator_may_return_null=1:detect_leaks=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "$bin" "${bound[@]}" "${dict[@]}" ${FUZZ_ARGS:-} -print_final_stats=1 -rss_limit_mb=4096 -timeout=20 \
      -artifact_prefix="$build/crashes/$t/" "$work" "$seeds" >"$log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1 && grep -m3 -E 'ERROR|fuzz contract|runtime error' "$log"
  lines+=("$(summary "$t" "$log" $rc)")
done
echo
echo "fuzz: summary (corpus: inputs/bytes kept; crashes: inputs in $build/crashes)"
printf '%s\n' "${lines[@]}"
exit $status
