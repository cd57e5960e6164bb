#!/usr/bin/env bash
# Runs one test under a sanitizer build (CMake option CRUN_SANITIZE) and fails
# it when any process it started -- the test itself, crun-lua, its workers --
# wrote a sanitizer report, whatever exit status the test expected of them.
#   usage: san_run.sh address|thread REPORT_ROOT SAN_BIN -- command args...
# The reports go to a fresh REPORT_ROOT/<test>.XXXXXX (log_path) and are
# printed on stderr at the end. SAN_BIN (build-*/san-bin) goes first in PATH:
# its lua5.4 is instrumented (tests/san/lua.c), so it loads the instrumented
# crun.core without a preload of the sanitizer runtime (a preload reaches sh
# and bash too, which crash at start under TSan).
set -u
kind=$1 root=$2 sanbin=$3
shift 3
[ "${1:-}" = "--" ] && shift
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$root"
# the report directory is named after the spec (a *_spec.lua argument), else
# the first .lua argument (a job; not gpu_gate.lua before a spec), else the
# program
name=$(basename "$1")
for a in "$@"; do case "$a" in *.lua) name=$(basename "$a" .lua); break ;; esac; done
for a in "$@"; do case "$a" in *_spec.lua) name=$(basename "$a" .lua); break ;; esac; done
dir=$(mktemp -d "$root/$name.XXXXXX")

case "$kind" in
  address)
    # Leaks are checked in crun's programs and in lua5.4 (which runs
    # crun.core) only, should another program ever carry the runtime.
    # detect_leaks=1 comes from $on/<program name> (%b) for crun's programs.
    on="$root/leak-checked"
    mkdir -p "$on"
    for exe in lua5.4 $(find "$(dirname "$root")" -maxdepth 2 -type f -perm -u+x \
                          \( -name 'crun-lua' -o -name '*_dbl' -o -path '*/tests/*' -o -path '*/examples/*' -o -path '*/bench/*' \) \
                          -printf '%f\n'); do
      [ -e "$on/$exe" ] || echo "detect_leaks=1" >"$on/$exe"
    done
    # Open MPI (mpirun specs) keeps its plugins loaded so that its own leaks
    # name their module and scripts/lsan.supp can match them
    export OMPI_MCA_mca_base_component_disable_dlclose=1
    # (PMIx loads plugins of its own, with its own variable)
    export PMIX_MCA_mca_base_component_disable_dlclose=1
    # glibc has no frame pointers: under mpirun unwind slowly and fully, so
    # that leaks inside Open MPI's own vasprintf calls name Open MPI
    case "$name" in mpi_*|multihost_spec|test_mpi_*) ASAN_OPTIONS="fast_unwind_on_malloc=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}" ;; esac
    export ASAN_OPTIONS="halt_on_error=1:handle_segv=0:allocator_may_return_null=1:detect_leaks=0:include_if_exists=$on/%b:log_path=$dir/asan:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$dir/ubsan${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
    ;;
  thread)
    # die_after_fork=1 (TSan's own default): a child forked beside a running
    # thread dies when it starts a thread of its own, and so fails its test.
    # TSan checks little in such a child, so that fork is a gap in the
    # checking, not only a crash risk. crun-lua forks its workers, the REPL's supervisor and
    # a c10d or multi-node launch's workers from a thread-less process
    # (launcher/agent.c), and so do the C tests: every spec passed with it on
    # 2026-11-25, every c.* test on 2026-11-27 (c.test_coll too: 11 cases,
    # 123 s; with verbosity=1 TSan said "parent had 1 threads" at each of its
    # forks, the harness's and pg_spawn's). TSAN_OPTIONS=die_after_fork=0
    # turns it off for a run.
    export TSAN_OPTIONS="handle_segv=0:allocator_may_return_null=1:die_after_fork=1:halt_on_error=1:second_deadlock_stack=1:log_path=$dir/tsan:suppressions=$here/tsan.supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
    ;;
  *) echo "EINVAL: san_run.sh: kind must be address or thread, not '$kind'" >&2; exit 2 ;;
esac
# san-bin/timeout scales the deadlines specs give timeout(1) (scripts/san_timeout.sh)
[ -e "$sanbin/timeout" ] || ln -sf "$here/san_timeout.sh" "$sanbin/timeout"
export CRUN_SAN_TIMEOUT_SCALE=${CRUN_SAN_TIMEOUT_SCALE:-5}
export PATH="$sanbin:$PATH"
# handle_segv=0: specs kill workers with SIGSEGV on purpose and check that
# the launcher reports the signal; a real crash still fails its test.
# allocator_may_return_null=1: tensor_hostile_spec asks for 4 TiB and expects
# ENOMEM, as malloc returns NULL without a sanitizer

"$@"
rc=$?
# A report is a file with an error; a file holding only a notice (LSan's
# "Running thread N was not suspended" in a worker forked without exec, a
# libasan limitation: the forked child still lists the parent's thread) is
# shown but does not fail the test.
# (and ASan's "failed to allocate" warning, printed when a too-large
# malloc returns NULL under allocator_may_return_null=1, which crun reports
# as ENOMEM: tensor_hostile_spec does it on purpose)
notice='^==[0-9]+==(Running thread [0-9]+ was not suspended. False leaks are possible.|WARNING: AddressSanitizer failed to allocate 0x[0-9a-f]+ bytes)$'
reports=$(for f in $(find "$dir" -type f -size +0 | sort); do
            grep -qvE "$notice|^$" "$f" && echo "$f"; done)
notes=$(find "$dir" -type f -size +0 | sort)
if [ -n "$reports" ]; then
  n=$(echo "$reports" | wc -l)
  echo "san_run: $n sanitizer report(s) ($kind) from: $*" >&2
  for f in $reports; do echo "==== $f" >&2; cat "$f" >&2; done
  # (77 too: ctest reads it as skipped, and a report must fail the test)
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ]; then rc=1; fi
elif [ -n "$notes" ]; then
  echo "san_run: $(echo "$notes" | wc -l) sanitizer notice(s), no report ($kind): $(cat $notes | sort | uniq -c | head -3)" >&2
  rm -rf "$dir"
else
  rmdir "$dir" 2>/dev/null
fi
exit "$rc"
