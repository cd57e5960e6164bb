#!/usr/bin/env bash
# check_install.sh [DEB_BUILD] — the two install routes that touch the system
# (make check-install; not part of make test):
#   1. the .deb of DEB_BUILD (make package) through apt: crun-lua -n 2 on an
#      example, require "crun" from the system lua5.4 with its default paths,
#      examples/c/allreduce.c built with pkg-config and a find_package(crun)
#      project, both on 2 ranks, the man page; then apt-get purge and a check
#      that none of the package's files is left;
#   2. `luarocks make` into a temporary tree: require "crun" from lua5.4 with
#      `luarocks path`, crun-lua -n 2 from the tree's bin; luarocks remove.
# Refuses to run when a crun package is installed already. Prints each step;
# exits non-zero at the first failure.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
deb_build=${1:-build-deb}
case $deb_build in /*) ;; *) deb_build=$src/$deb_build ;; esac
version=$(sed -n 's/^project(crun VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
deb=$deb_build/crun_${version}_amd64.deb
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
tmp=$(mktemp -d /tmp/crun-check-install.XXXXXX)
installed=0
cleanup() {
  # a failed check must not leave the package on the system
  if [ $installed = 1 ]; then
    echo "check-install: purging crun after the failure" >&2
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 purge -y -q crun >/dev/null 2>&1 || true
  fi
  rm -rf "$tmp" "$src/build.luarocks"
}
trap cleanup EXIT
step() { printf '\n== %s\n' "$*"; }
fail() { echo "check-install: FAILED: $*" >&2; exit 1; }
# two_ranks EXE: runs EXE as ranks 0 and 1 of a 2-rank job on a free-ish port
two_ranks() {
  local port=$((20000 + RANDOM % 20000)) env
  env="WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port"
  (env RANK=1 $env timeout -s KILL 60 "$1" & env RANK=0 $env timeout -s KILL 60 "$1"; r=$?; wait $! && exit $r)
}
# an example script copied out of the tree, so nothing can come from the build tree
cp "$src/examples/allreduce.lua" "$tmp/allreduce.lua"
printf 'local crun = require "crun"\nprint("crun-lua loads " .. package.searchpath("crun", package.path))\n' >"$tmp/where.lua"

# ------------------------------------------------------------------ the .deb
[ -f "$deb" ] || fail "$deb not found (make package)"
if dpkg-query -W -f='${Status}' crun 2>/dev/null | grep -q "install ok installed"; then
  fail "a crun package is installed already; remove it first (apt-get purge crun)"
fi
step "apt-get install $deb"
mapfile -t files < <(dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' | grep -v '/$')
echo "${#files[@]} files in the package"
installed=1
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "$deb" | tail -n 3
dpkg -s crun | grep -E '^(Status|Version):'

step "crun-lua -n 2 examples/allreduce.lua (installed /usr/bin/crun-lua)"
[ "$(command -v crun-lua)" = /usr/bin/crun-lua ] || fail "crun-lua on PATH is $(command -v crun-lua), not /usr/bin/crun-lua"
(cd "$tmp" && env -u LUA_PATH -u LUA_CPATH timeout -s KILL 120 crun-lua -n 2 --master-port 0 allreduce.lua)
where=$(cd "$tmp" && env -u LUA_PATH -u LUA_CPATH timeout -s KILL 60 crun-lua -n 1 --master-port 0 --no-prefix where.lua)
echo "$where"
[ "$where" = "crun-lua loads /usr/bin/../share/lua/5.4/crun/init.lua" ] || fail "crun-lua did not load the installed Lua files"
crun-lua --version

step 'require "crun" from the system lua5.4, default package.path/cpath'
out=$(cd "$tmp" && env -u LUA_PATH -u LUA_CPATH lua5.4 -e '
  local crun = require "crun"
  local t = crun.tensor.arange(1, 5) * 2
  print(package.searchpath("crun", package.path), package.searchpath("crun.core", package.cpath),
        crun.version, t:sum())')
echo "$out"
echo "$out" | grep -q "^/usr/share/lua/5.4/crun/init.lua	/usr/lib/x86_64-linux-gnu/lua/5.4/crun/core.so	$version	20" ||
  fail "lua5.4 did not load the installed module"

step "examples/c/allreduce.c with pkg-config --cflags --libs crun, on 2 ranks"
pkg-config --modversion crun
cc -o "$tmp/allreduce" "$src/examples/c/allreduce.c" $(pkg-config --cflags --libs crun)
ldd "$tmp/allreduce" | grep libcrunrt
lib=$(ldd "$tmp/allreduce" | awk '/libcrunrt/ {print $3}')
[ "$(readlink -f "$lib")" = "$(readlink -f /usr/lib/x86_64-linux-gnu/libcrunrt.so.0)" ] || fail "not linked to the installed libcrunrt ($lib)"
two_ranks "$tmp/allreduce"

step "find_package(crun CONFIG) from /usr, crun::crunrt_static, on 2 ranks"
mkdir -p "$tmp/cm"
printf 'cmake_minimum_required(VERSION 3.20)\nproject(user C)\nfind_package(crun %s CONFIG REQUIRED)\nadd_executable(ex %s)\ntarget_link_libraries(ex PRIVATE crun::crunrt_static)\n' \
  "$version" "$src/examples/c/allreduce.c" >"$tmp/cm/CMakeLists.txt"
cmake -S "$tmp/cm" -B "$tmp/cm/b" >/dev/null && cmake --build "$tmp/cm/b" >/dev/null
two_ranks "$tmp/cm/b/ex"

step "man crun-lua"
man -w crun-lua
MANWIDTH=80 man crun-lua 2>/dev/null | head -n 4

step "apt-get purge crun; nothing of it left"
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 purge -y -q crun | grep -v "Reading database" | tail -n 2
installed=0
left=0
for f in "${files[@]}"; do
  if [ -e "$f" ] || [ -L "$f" ]; then echo "left behind: $f"; left=1; fi
done
for d in /usr/share/lua/5.4/crun /usr/lib/x86_64-linux-gnu/lua/5.4/crun /usr/lib/x86_64-linux-gnu/cmake/crun /usr/include/crun; do
  if [ -e "$d" ]; then echo "left behind: $d/"; left=1; fi
done
[ $left = 0 ] || fail "files left after purge"
if dpkg-query -W -f='${Status}' crun 2>/dev/null | grep -q installed; then fail "dpkg still lists crun"; fi
if ldconfig -p | grep -q libcrunrt; then fail "ldconfig still lists libcrunrt"; fi
echo "removed: ${#files[@]} files gone, dpkg and ldconfig forget crun"

# ------------------------------------------------------------------ luarocks
step "luarocks --lua-version 5.4 make --tree $tmp/tree"
command -v luarocks >/dev/null || fail "luarocks not found (apt-get install luarocks)"
(cd "$src" && luarocks --lua-version 5.4 make --tree "$tmp/tree" "crun-${version}-1.rockspec" 2>&1 | tail -n 3)
luarocks --lua-version 5.4 --tree "$tmp/tree" list | grep -A1 '^crun'
eval "$(luarocks --lua-version 5.4 --tree "$tmp/tree" path)"
out=$(cd "$tmp" && lua5.4 -e 'local crun = require "crun"
  print(package.searchpath("crun", package.path), package.searchpath("crun.core", package.cpath), crun.version)')
echo "$out"
echo "$out" | grep -q "^$tmp/tree/share/lua/5.4/crun/init.lua	$tmp/tree/lib/lua/5.4/crun/core.so	$version" ||
  fail "lua5.4 did not load the module from the luarocks tree"
step "crun-lua -n 2 from the luarocks tree"
(cd "$tmp" && timeout -s KILL 120 "$tmp/tree/bin/crun-lua" -n 2 --master-port 0 allreduce.lua)
where=$(cd "$tmp" && timeout -s KILL 60 "$tmp/tree/bin/crun-lua" -n 1 --master-port 0 --no-prefix where.lua)
echo "$where"
[ "$where" = "crun-lua loads $tmp/tree/bin/../share/lua/5.4/crun/init.lua" ] || fail "crun-lua did not load the tree's Lua files"
luarocks --lua-version 5.4 --tree "$tmp/tree" remove crun | tail -n 1
left=$(cd "$tmp/tree" && find . -path '*crun*')
[ -z "$left" ] || fail "left in the luarocks tree after luarocks remove: $left"
echo "luarocks remove: nothing of crun left in the tree"
printf '\ncheck-install: the .deb and the luarocks routes passed\n'
