-- crun.store across OS processes: 8 lua5.4 children race add and
-- compare_set on one TCP store and on one file store; counts must be exact
-- and every compare_set slot must have exactly one winner that everyone saw.
-- Also: a client whose server process dies gets an error, not a hang.
local tmpname = require("helpers.common").tmpname -- os.tmpname() under TMPDIR
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
    local path = tmpname()
    os.remove(path)
    local s = S.file(path)
    run_workers("file", path)
    check_results(s)
    s:close()
    os.remove(path)
  end)

  it("a client whose server process dies gets ECONNRESET, not a hang", function()
    local portfile = tmpname()
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
    -- MASTER_PORT that is no number: said so, not "not set"
    p = io.popen("MASTER_PORT=abc " .. LUA .. " -e " .. q([[require("crun").store.from_env()]]) .. " 2>&1", "r")
    out = p:read("a")
    assert.is_falsy(p:close())
    assert.is_truthy(out:match("EINVAL: crun.store.from_env: MASTER_PORT is 'abc', not a port number"), out)
    -- CRUN_STORE_TIMEOUT that is no number of seconds: said so (it fell back to the default)
    for _, bad in ipairs({"30s", "-1", "nan"}) do
      p = io.popen(string.format("MASTER_ADDR=127.0.0.1 MASTER_PORT=%d RANK=1 CRUN_STORE_TIMEOUT=%s %s -e %s 2>&1",
                                 m:port(), bad, LUA, q([[require("crun").store.from_env()]])), "r")
      out = p:read("a")
      assert.is_falsy(p:close(), out)
      assert.is_truthy(out:find("EINVAL: crun.store.from_env: CRUN_STORE_TIMEOUT is '" .. bad ..
                                "', not a number of seconds >= 0", 1, true), out)
    end
    m:close()
  end)
end)

-- Queues across processes, and the file store's users (world_size).
local QHELPER = "spec/helpers/store_queue_worker.lua"

local function hex(v) return (v:gsub(".", function(c) return string.format("%02x", c:byte()) end)) end
local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

--- Opens a fresh store of `kind` in this process; returns it and the
-- address children use (port or path), and a cleanup.
local function queue_store(kind)
  if kind == "tcp" then
    local s = S.tcp{host = "127.0.0.1", port = 0, is_master = true, timeout = 60}
    return s, s:port(), function() end
  end
  local path = tmpname()
  os.remove(path)
  return S.file(path), path, function() os.remove(path) end
end

local function child(...)
  local words = {LUA, QHELPER}
  for _, w in ipairs({...}) do words[#words + 1] = q(w) end
  return io.popen("timeout 120 " .. table.concat(words, " ") .. " 2>&1", "r")
end

describe("crun.store queues across processes", function()
  for _, kind in ipairs({"tcp", "file"}) do
    it(kind .. ": a blocked pop is woken by a push from another process", function()
      local s, where, cleanup = queue_store(kind)
      local value = "\0\255woken-" .. (-7919 * 13)
      local p = child("push", kind, where, "0.4", hex(value))
      local t0 = crun.clock()
      local got = s:queue_pop("wake", 30)
      local dt = crun.clock() - t0
      local out = p:read("a")
      assert.is_true(p:close(), out)
      assert.are.equal(value, got)
      assert.is_true(dt >= 0.3 and dt < 20, "the pop returned after " .. dt .. " s") -- it did block
      assert.are.equal(0, s:queue_len("wake"))
      s:close(); cleanup()
    end)

    it(kind .. ": 6 concurrent poppers each get distinct items, none lost", function()
      local s, where, cleanup = queue_store(kind)
      local POPPERS, N = 6, 600
      local procs = {}
      for i = 1, POPPERS do procs[i] = child("pop", kind, where, i) end
      for _ = 1, POPPERS do s:queue_pop("ready", 60) end -- every popper is connected
      local want = {}
      for i = 1, N do
        local v = string.pack("<i8", (i % 2 == 0 and -1 or 1) * (i * i * 31 + 7)) .. "\0" .. i
        want[hex(v)] = true
        s:queue_push("work", v)
      end
      for _ = 1, POPPERS do s:queue_push("work", "\0END") end
      local seen, total, busy = {}, 0, 0
      for i = 1, POPPERS do
        local out = procs[i]:read("a")
        assert.is_true(procs[i]:close(), out)
        assert.is_truthy(out:match("OK"), out)
        local mine = 0
        for h in out:gmatch("ITEM (%x*)") do
          assert.is_true(want[h], "popped an item never pushed: " .. h)
          assert.is_nil(seen[h], "item popped twice: " .. h)
          seen[h] = i
          mine = mine + 1
        end
        total = total + mine
        if mine > 0 then busy = busy + 1 end
      end
      assert.are.equal(N, total)
      assert.is_true(busy >= 2, "only " .. busy .. " popper(s) got items")
      assert.are.equal(0, s:queue_len("work"))
      s:close(); cleanup()
    end)
  end
end)

describe("crun.store.file with world_size", function()
  local function fresh_path()
    local path = tmpname()
    os.remove(path)
    return path
  end

  it("removes the file at the last close, once world_size users closed, not before", function()
    local path = fresh_path()
    local a = S.file(path, {world_size = 2})
    a:set("k", "v")
    a:close()
    assert.is_true(exists(path), "removed after 1 of 2 users closed")
    local b = S.file(path, 2) -- torch's FileStore(path, world_size) form
    assert.are.equal("v", b:get("k"), "the second user sees the first one's keys")
    local c = S.file(path, {world_size = 2})
    b:close()
    assert.is_true(exists(path), "removed while a user still has it open")
    c:close()
    assert.is_false(exists(path), "not removed after the last close")
    -- without world_size the file is never removed
    local d = S.file(path)
    d:close()
    assert.is_true(exists(path))
    os.remove(path)
    local ok, err = pcall(S.file, path, {world_size = -1})
    assert.is_false(ok)
    assert.is_truthy(tostring(err):match("^EINVAL"), err)
    ok, err = pcall(S.file, path, {worldsize = 2})
    assert.is_truthy(tostring(err):match("^EINVAL: crun.store.file: unknown option 'worldsize'"), err)
    os.remove(path)
  end)

  it("counts users of several processes (close and collection), and the last one out removes it", function()
    local path = fresh_path()
    local WS = 5
    local me = S.file(path, {world_size = WS})
    local procs = {}
    for i = 1, WS - 1 do procs[i] = child("user", path, WS, i % 2 == 0 and "close" or "gc") end
    assert.is_truthy(C.wait_for(function() return me:get("open") == tostring(WS - 1) end, 60),
                     "the children never all opened the store")
    assert.is_true(exists(path))
    me:set("go", "1")
    for i = 1, WS - 1 do
      local out = procs[i]:read("a")
      assert.is_true(procs[i]:close(), out)
      assert.is_truthy(out:match("OK"), out)
    end
    assert.is_true(exists(path), "removed while this process still has it open")
    me:close()
    assert.is_false(exists(path), "the last user out did not remove it")
  end)

  it("a user that dies without closing stays counted: the file is left (documented)", function()
    local path = fresh_path()
    local me = S.file(path, {world_size = 2})
    local p = child("user", path, 2, "crash")
    assert.is_truthy(C.wait_for(function() return me:check{"open"} end, 60))
    me:set("go", "1")
    local out = p:read("a")
    assert.is_true(p:close(), out)
    me:close()
    assert.is_true(exists(path), "the dead user was counted out")
    os.remove(path)
  end)

  it("many processes opening and closing with world_size 1 race without errors", function()
    local path = fresh_path()
    local script = string.format([[
      local crun = require "crun"
      for i = 1, 60 do
        local s = crun.store.file(%q, {world_size = 1})
        s:add("n", 1)
        s:queue_push("q", tostring(i))
        s:close()
      end
      print("OK")]], path)
    local procs = {}
    for i = 1, 6 do procs[i] = io.popen("timeout 120 " .. LUA .. " -e " .. q(script) .. " 2>&1", "r") end
    for i = 1, 6 do
      local out = procs[i]:read("a")
      assert.is_true(procs[i]:close(), out)
      assert.is_truthy(out:match("OK"), out)
    end
    assert.is_false(exists(path), "the last of the 360 users did not remove it")
  end)
end)
