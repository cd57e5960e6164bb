#!/usr/bin/env bash
# Runs one test (ctest's command) with a private TMPDIR and removes it at the
# end, so that nothing the test, crun-lua or its ranks put there -- flight
# recorder dumps (crun-flight-*), stores' sockets and files, scratch files --
# stays behind in the shared /tmp.
#   usage: tmpdir_run.sh -- command args...
# The directory is ${TMPDIR:-/tmp}/crun-ctest.XXXXXX (0700), or under /tmp
# when TMPDIR is long: a unix socket's path (108 bytes) must fit below it.
# What the test left there is named on stderr before it goes; a test fails
# for it only with CRUN_TEST_TMP_STRICT=1 (dumps of the flight recorder that
# a test of a failure provokes on purpose are expected there).
set -u
[ "${1:-}" = "--" ] && shift
base=${TMPDIR:-/tmp}
[ "${#base}" -gt 40 ] && base=/tmp
dir=$(mktemp -d "$base/crun-ctest.XXXXXX") || { echo "tmpdir_run: cannot create a directory under $base" >&2; exit 1; }
# others may pass through (not list): specs of what another user can do in a
# shared directory (security_spec: a file store's file made by nobody) make
# that directory, mode 1777, under TMPDIR
chmod 0711 "$dir"
export TMPDIR=$dir
left=
cleanup() {
  chmod -R u+rwx -- "$dir" 2>/dev/null
  rm -rf -- "$dir"
}
trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
"$@"
rc=$?
left=$(cd "$dir" && ls -A | head -20 | tr '\n' ' ')
if [ -n "$left" ]; then
  echo "tmpdir_run: the test left in its TMPDIR (removed now): $left" >&2
  [ "${CRUN_TEST_TMP_STRICT:-0}" = 1 ] && [ "$rc" = 0 ] && rc=1
fi
exit "$rc"
