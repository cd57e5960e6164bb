-- crun as a LuaRocks package: `luarocks make` in a clone builds with CMake and
-- installs the Lua module (crun, crun.core) and the launcher crun-lua into the
-- luarocks tree (`luarocks make --local`, or --tree DIR). Needs the C
-- dependencies of the CMake build: scripts/setup.sh installs them on Debian.
rockspec_format = "3.0"
package = "crun"
version = "0.1.0-1"
source = {
  -- `luarocks make` builds the working tree it runs in; no release is
  -- published yet, so this URL only names the repository's layout
  url = "git+file:///crun",
  tag = "v0.1.0",
}
description = {
  summary = "torch.distributed as a C11 runtime, scripted in Lua 5.4",
  detailed = [[
    libcrunrt (TCP/hash/file stores, process groups, collectives over TCP,
    shared memory and MPI, DDP/FSDP/ZeRO training pieces) with its Lua 5.4
    module `crun` and the torchrun-like launcher crun-lua.]],
  license = "not chosen yet: the repository has no LICENSE file",
  labels = {"distributed", "collectives", "training"},
}
dependencies = {"lua >= 5.4, < 5.5"}
build = {
  type = "command",
  build_command = [[cmake -S . -B build.luarocks -DCMAKE_BUILD_TYPE=Release -DCRUN_BUILD_TESTS=OFF \
    -DCMAKE_INSTALL_PREFIX="$(PREFIX)" -DCRUN_INSTALL_LMOD="$(LUADIR)" -DCRUN_INSTALL_CMOD="$(LIBDIR)" \
    && cmake --build build.luarocks -j 2]],
  install_command = [[cmake --install build.luarocks --component lua]],
}
