-- install_spec.lua — `cmake --install` into a temporary prefix, then, against
-- that prefix only: a C program built with pkg-config, a CMake project with
-- find_package(crun CONFIG) (shared and static), and lua5.4 with the installed
-- module. The C programs run as a 2-rank job and check their own results.
local tmpname = require("helpers.common").tmpname -- os.tmpname() under TMPDIR
local build = os.getenv("CRUN_BUILD_DIR")
local src = os.getenv("CRUN_SOURCE_DIR")

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
  local out = p:read("a")
  p:close()
  local rc = tonumber(out:match("rc=(%d+)%s*$"))
  return rc, out
end

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- Runs a C example as ranks 0 and 1 on a free port; returns rc, output.
-- The port is below Linux's ephemeral range (32768-60999), where the
-- connections and port-0 listeners of the tests running beside this one
-- take theirs: a port taken there made rank 0 fail to listen and rank 1
-- retry until the 30 s kill (seen once under ctest -j2 with other load).
local function two_ranks(exe)
  local port = 20000 + math.random(0, 12000)
  local env = "WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" .. port
  return sh(string.format("(RANK=1 %s timeout -s KILL 30 %s & RANK=0 %s timeout -s KILL 30 %s; r=$?; wait $! && exit $r)",
                          env, q(exe), env, q(exe)))
end

describe("an installed crun", function()
  if not build or not src then
    pending("CRUN_BUILD_DIR / CRUN_SOURCE_DIR not set (run through ctest)")
    return
  end
  local prefix = tmpname()
  os.remove(prefix)
  local rc, out = sh("cmake --install " .. q(build) .. " --prefix " .. q(prefix))

  teardown(function() os.execute("rm -rf " .. q(prefix)) end)

  it("installs the library, header, Lua module, pkg-config file and CMake package", function()
    assert.are.equal(0, rc, out)
    for _, f in ipairs{"include/crun.h", "lib/pkgconfig/crun.pc", "lib/cmake/crun/crunConfig.cmake",
                       "lib/cmake/crun/crunConfigVersion.cmake", "share/lua/5.4/crun/init.lua",
                       "lib/lua/5.4/crun/core.so", "bin/crun-lua"} do
      local h = io.open(prefix .. "/" .. f)
      assert.is_truthy(h, "missing " .. f)
      h:close()
    end
  end)

  it("builds examples/c/allreduce.c with pkg-config --cflags --libs crun, and it runs on 2 ranks", function()
    local pc = "PKG_CONFIG_PATH=" .. q(prefix .. "/lib/pkgconfig")
    local rc2, ver = sh(pc .. " pkg-config --modversion crun")
    assert.are.equal(0, rc2, ver)
    local crun_lua = require "crun"
    assert.are.equal(crun_lua.version, ver:match("^(%S+)"))
    local exe = prefix .. "/allreduce_pc"
    local rc3, o3 = sh(string.format("cc -o %s %s $(%s pkg-config --cflags --libs crun) -Wl,-rpath,%s",
                                     q(exe), q(src .. "/examples/c/allreduce.c"), pc, q(prefix .. "/lib")))
    assert.are.equal(0, rc3, o3)
    local rc4, o4 = two_ranks(exe)
    assert.are.equal(0, rc4, o4)
    assert.is_truthy(o4:find("rank 0 of 2: all_reduce ok", 1, true), o4)
    assert.is_truthy(o4:find("rank 1 of 2: all_reduce ok", 1, true), o4)
    local _, deps = sh("ldd " .. q(exe))
    assert.is_truthy(deps:find(prefix .. "/lib/libcrunrt.so", 1, true), "linked the installed library: " .. deps)
  end)

  it("builds a CMake project with find_package(crun CONFIG) against crun::crunrt and crun::crunrt_static", function()
    local dir = prefix .. "/cmake_user"
    os.execute("mkdir -p " .. q(dir))
    local f = assert(io.open(dir .. "/CMakeLists.txt", "w"))
    f:write("cmake_minimum_required(VERSION 3.20)\nproject(user C)\n",
            "find_package(crun 0.1 CONFIG REQUIRED)\n",
            "add_executable(ex_shared " .. src .. "/examples/c/allreduce.c)\n",
            "target_link_libraries(ex_shared PRIVATE crun::crunrt)\n",
            "add_executable(ex_static " .. src .. "/examples/c/allreduce.c)\n",
            "target_link_libraries(ex_static PRIVATE crun::crunrt_static)\n")
    f:close()
    local rc2, o2 = sh(string.format("cmake -S %s -B %s/b -DCMAKE_PREFIX_PATH=%s && cmake --build %s/b",
                                     q(dir), q(dir), q(prefix), q(dir)))
    assert.are.equal(0, rc2, o2)
    for _, name in ipairs{"ex_shared", "ex_static"} do
      local rc3, o3 = two_ranks(dir .. "/b/" .. name)
      assert.are.equal(0, rc3, name .. ": " .. o3)
      assert.is_truthy(o3:find("rank 1 of 2: all_reduce ok", 1, true), o3)
    end
    local _, deps = sh("ldd " .. q(dir .. "/b/ex_static"))
    assert.is_falsy(deps:find("libcrunrt", 1, true), "static: no libcrunrt.so: " .. deps)
  end)

  it("runs a script with the installed module from the system lua5.4", function()
    local env = string.format("LUA_PATH=%s LUA_CPATH=%s", q(prefix .. "/share/lua/5.4/?.lua;" .. prefix .. "/share/lua/5.4/?/init.lua"),
                              q(prefix .. "/lib/lua/5.4/?.so"))
    local rc2, o2 = sh(env .. " lua5.4 -e " .. q([[
      local crun = require "crun"
      local t = crun.tensor.arange(1, 5) * 2
      local s = crun.store.hash(); s:set("k", "v")
      print(package.searchpath("crun.core", package.cpath), crun.version, t:sum(), s:get("k"))]]))
    assert.are.equal(0, rc2, o2)
    assert.is_truthy(o2:find(prefix .. "/lib/lua/5.4/crun/core.so", 1, true), o2)
    assert.is_truthy(o2:find("20", 1, true), o2)
  end)

  it("installs crun-lua(1), the man page help2man made from --help", function()
    local made = io.open(build .. "/man/crun-lua.1")
    if not made then
      pending("no build/man/crun-lua.1: configured without help2man (apt-get install help2man)")
      return
    end
    made:close()
    local f = io.open(prefix .. "/share/man/man1/crun-lua.1")
    assert.is_truthy(f, "missing share/man/man1/crun-lua.1")
    local page = f:read("a")
    f:close()
    assert.is_truthy(page:find(".TH CRUN-LUA \"1\"", 1, true), page:sub(1, 200))
    assert.is_truthy(page:find("nproc", 1, true), "the options are in it")
  end)

  it("runs the installed crun-lua on the installed Lua files (<bindir>/../share/lua/5.4)", function()
    local script = prefix .. "/where.lua"
    local f = assert(io.open(script, "w"))
    f:write('local crun = require "crun"\n',
            'print("from " .. package.searchpath("crun", package.path), crun.version)\n')
    f:close()
    local rc2, o2 = sh("timeout -s KILL 60 " .. q(prefix .. "/bin/crun-lua") .. " -n 1 --master-port 0 --no-prefix " .. q(script))
    assert.are.equal(0, rc2, o2)
    assert.is_truthy(o2:find("from " .. prefix .. "/bin/../share/lua/5.4/crun/init.lua", 1, true), o2)
  end)
end)
