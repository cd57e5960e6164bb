#!/usr/bin/env bash
# Checks tests/tmpdir_run.sh: the command sees a TMPDIR of its own, which is
# gone afterwards with what was put in it (named on stderr); the command's
# exit status comes back; CRUN_TEST_TMP_STRICT=1 fails a test that left files.
set -u
run=$(dirname "$0")/tmpdir_run.sh
err=$(mktemp) || exit 1
trap 'rm -f "$err"' EXIT
fail() { echo "tmpdir_run_check: $*" >&2; cat "$err" >&2; exit 1; }

dir=$(bash "$run" -- sh -c 'echo "$TMPDIR"; mkdir "$TMPDIR/d" && touch "$TMPDIR/d/f" && chmod 0500 "$TMPDIR/d"' 2>"$err")
[ "$?" = 0 ] || fail "a passing command failed"
case "$dir" in */crun-ctest.??????) ;; *) fail "TMPDIR was '$dir', not a crun-ctest.XXXXXX" ;; esac
[ ! -e "$dir" ] || fail "$dir is left"
grep -q "left in its TMPDIR (removed now): d" "$err" || fail "the leftover d is not named"

bash "$run" -- sh -c 'exit 3' 2>"$err"
[ "$?" = 3 ] || fail "the command's exit status 3 did not come back"

CRUN_TEST_TMP_STRICT=1 bash "$run" -- sh -c 'touch "$TMPDIR/x"' 2>"$err"
[ "$?" = 1 ] || fail "CRUN_TEST_TMP_STRICT=1 passed a test that left a file"
CRUN_TEST_TMP_STRICT=1 bash "$run" -- true 2>"$err" || fail "CRUN_TEST_TMP_STRICT=1 failed a clean test"
echo "tmpdir_run_check: ok"
