-- crun.store across OS processes: 8 lua5.4 children race add and
-- compare_set on one TCP store and on one file store; counts must be exact
-- and every compare_set slot must have exactly one winner that everyone saw.
-- Also: a client whose server process dies gets an error, not a hang.
local crun = require "crun"
local S = crun.store

local WORKERS, ADDS, SLOTS = 8, 300, 10
local LUA = os.getenv("LUA_INTERP") or "lua5.4"
local HELPER = "spec/helpers/store_worker.lua"

local C = require "helpers.common"
local q = C.q

--- Starts every worker at once (io.popen does not wait) and collects them.
local function run_workers(kind, where)
  local procs = {}
  for i = 0, WORKERS - 1 do
    local cmd = string.format("WORKERS=%d timeout 120 %s %s %s %s %d %d %d 2>&1", WORKERS, LUA,
                              HELPER, kind, q(where), i, ADDS, SLOTS)
    procs[i] = io.popen(cmd, "r")
  end
  for i = 0, WORKERS - 1 do
    local out = procs[i]:read("a")
    local ok, how, code = procs[i]:close()
    assert.is_true(ok, string.format("worker %d exited %s %s:\n%s", i, how, code, out))
    assert.is_truthy(out:match("OK " .. i), out)
  end
end

--- Asserts exact counts and one consistent winner per slot.
local function check_results(s)
  assert.are.equal(tostring(WORKERS * ADDS), s:get("counter"))
  for slot = 0, SLOTS - 1 do
    local winner = s:get("slot" .. slot)
    local w = tonumber(winner)
    assert.is_true(w ~= nil and w >= 0 and w < WORKERS, "slot " .. slot .. " holds " .. winner)
    local seen = s:get("seen" .. slot)
    local n = 0
    for v in seen:gmatch("([^,]*),") do
      n = n + 1
      assert.are.equal(winner, v, "a worker saw another winner of slot " .. slot)
    end
    assert.are.equal(WORKERS, n)
  end
  local finals = {}
  for i = 0, WORKERS - 1 do finals[#finals + 1] = "done/" .. i end
  local vals = s:multi_get(finals)
  local max = 0
  for _, v in ipairs(vals) do max = math.max(max, tonumber(v)) end
  assert.are.equal(WORKERS * ADDS, max) -- the last add of some worker saw the total
end

describe("crun.store with 8 processes", function()
  it("TCP store: racing add and compare_set lose nothing", function()
    local s = S.tcp{host = "127.0.0.1", port = 0, is_master = true, timeout = 60}
    run_workers("tcp", s:port())
    check_results(s)
    s:close()
  end)

  it("file store: racing add and compare_set lose nothing", function()
    local path = os.tmpname()
    os.remove(path)
    local s = S.file(path)
    run_workers("file", path)
    check_results(s)
    s:close()
    os.remove(path)
  end)

  it("a client whose server process dies gets ECONNRESET, not a hang", function()
    local portfile = os.tmpname()
    local script = string.format([[
      local s = require("crun").store.tcp{host="127.0.0.1", port=0, is_master=true}
      local f = io.open(%q, "w"); f:write(s:port()); f:close()
      os.execute("sleep 0.5")
      os.exit(0)]], portfile)
    local child = io.popen(LUA .. " -e " .. q(script) .. " 2>&1", "r")
    local port = C.wait_for(function() return tonumber(C.slurp(portfile) or "") end, 20)
    assert.is_number(port, "the server child never wrote its port")
    local c = S.tcp{host = "127.0.0.1", port = port, timeout = 30}
    local t0 = crun.clock()
    local ok, err = pcall(c.get, c, "never-set")
    assert.is_false(ok)
    assert.is_truthy(tostring(err):match("^ECONNRESET: .*never%-set"), err)
    assert.is_true(crun.clock() - t0 < 10)
    child:read("a")
    child:close()
    -- later calls fail fast too
    ok, err = pcall(c.set, c, "k", "v")
    assert.is_false(ok)
    assert.is_truthy(tostring(err):match("^ECONNREFUSED"), err)
    c:close()
    os.remove(portfile)
  end)

  it("a master with world_size waits until every client joined", function()
    local probe = S.server{host = "127.0.0.1"}
    local port = probe:port()
    probe:stop()
    local script = string.format([[
      local s = require("crun").store.tcp{host="127.0.0.1", port=%d, world_size=3,
                                          timeout=20, connect_timeout=20}
      s:get("go")]], port)
    local kids = {}
    for i = 1, 2 do kids[i] = io.popen(LUA .. " -e " .. q(script) .. " 2>&1", "r") end
    local m = S.tcp{host = "127.0.0.1", port = port, is_master = true, world_size = 3, timeout = 20}
    m:set("go", "1") -- reached only once both children joined
    for i = 1, 2 do
      local out = kids[i]:read("a")
      assert.is_true(kids[i]:close(), out)
    end
    m:close()
    local err = select(2, pcall(S.tcp, {host = "127.0.0.1", port = 0, is_master = true,
                                         world_size = 2, timeout = 0.2}))
    assert.is_truthy(tostring(err):match("^ETIMEDOUT: .*world_size=2"), err)
  end)

  it("from_env builds a client from MASTER_ADDR / MASTER_PORT", function()
    local m = S.tcp{host = "127.0.0.1", port = 0, is_master = true, timeout = 10}
    local script = [[
      local crun = require "crun"
      local s = crun.store.from_env{timeout = 10}
      s:set("rank" .. os.getenv("RANK"), "hi")
      print(s:port())]]
    local cmd = string.format("MASTER_ADDR=127.0.0.1 MASTER_PORT=%d RANK=1 %s -e %s 2>&1",
                              m:port(), LUA, q(script))
    local p = io.popen(cmd, "r")
    local out = p:read("a")
    assert.is_true(p:close(), out)
    assert.are.equal(tostring(m:port()), out:match("%d+"))
    assert.are.equal("hi", m:get("rank1"))
    -- without MASTER_PORT: a clear error
    p = io.popen("env -u MASTER_PORT " .. LUA .. " -e " .. q([[require("crun").store.from_env()]]) .. " 2>&1", "r")
    out = p:read("a")
    assert.is_falsy(p:close())
    assert.is_truthy(out:match("MASTER_PORT is not set"), out)
    m:close()
  end)
end)
