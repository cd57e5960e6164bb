#!/usr/bin/env bash
# docs.sh SRC DOXYFILE OUT — the API reference: LDoc over SRC/lua/crun (SRC/config.ld)
# into OUT/lua, Doxygen (DOXYFILE) over SRC/runtime/include into OUT/c.
# Fails when either tool prints any warning (the lines are shown); exits 77
# (ctest: skipped) when ldoc or doxygen is missing.
set -uo pipefail
src=$1 doxyfile=$2 out=$3
missing=()
command -v ldoc >/dev/null 2>&1 || missing+=("ldoc (apt-get install lua-ldoc)")
command -v doxygen >/dev/null 2>&1 || missing+=("doxygen (apt-get install doxygen)")
if [ ${#missing[@]} -gt 0 ]; then
  echo "SKIPPED: docs need ${missing[*]}"
  exit 77
fi
mkdir -p "$out/lua" "$out/c" || exit 1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0
# ldoc prints two lines of its own on success; anything else is a warning
(cd "$src" && ldoc -c config.ld -d "$out/lua" .) >"$log" 2>&1 || rc=1
grep -v -e '^reading configuration from ' -e '^output written to ' "$log" | sed 's/^/ldoc: /' >"$log.w"
doxygen "$doxyfile" 2>&1 | sed 's/^/doxygen: /' >>"$log.w" || rc=1
if [ -s "$log.w" ]; then
  cat "$log.w"
  echo "docs: $(wc -l <"$log.w") warning line(s)"
  rc=1
fi
rm -f "$log.w"
[ $rc = 0 ] && echo "docs: $out/lua/index.html and $out/c/html/index.html, no warnings"
exit $rc
