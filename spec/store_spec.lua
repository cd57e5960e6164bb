-- crun.store: every operation on every store kind (hash, file, prefix over
-- hash, prefix over file, tcp), torch's test_store cases, deadlines, misuse.
local crun = require "crun"
local S = crun.store

local TMP = require("helpers.common").TMP
local tmpn = 0
local function tmpfile()
  tmpn = tmpn + 1
  return string.format("%s/crun_store_spec_%d_%d_%d", TMP, os.time(), math.random(1, 1e9), tmpn)
end

--- Each kind: a constructor returning a fresh store and a cleanup function.
local kinds = {
  hash = function() return S.hash(), function() end end,
  file = function()
    local p = tmpfile()
    return S.file(p), function() os.remove(p) end
  end,
  prefix_hash = function() return S.prefix("pre", S.hash()), function() end end,
  prefix_file = function()
    local p = tmpfile()
    return S.prefix("a/b", S.file(p)), function() os.remove(p) end
  end,
  tcp = function() return S.tcp{port = 0, is_master = true, timeout = 10}, function() end end,
  tcp_async_set = function() return S.tcp{port = 0, is_master = true, timeout = 10, async_set = true}, function() end end,
  tcp_acked = function() return S.tcp{port = 0, is_master = true, timeout = 10, async_set = false}, function() end end,
  prefix_tcp = function()
    return S.prefix("t", S.tcp{port = 0, is_master = true, timeout = 10}), function() end
  end,
}

--- n queue items: signed, non-periodic integers packed with binary bytes
-- (NUL, 0xff), one of them empty, lengths varying.
local function queue_items(n, salt)
  local items = {}
  for i = 1, n do
    local v = (i % 2 == 0 and -1 or 1) * (i * i * 7919 + salt * 104729 + 13)
    items[i] = string.pack("<i8", v) .. string.char(i % 251, 0, 255) .. string.rep("x", (i * 37) % 23) .. v
  end
  items[(n + 1) // 3] = ""
  return items
end

local function expect_error(pat, f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok, "expected an error matching " .. pat)
  assert.is_truthy(tostring(err):match(pat), "error '" .. tostring(err) .. "' does not match " .. pat)
  return err
end

for _, name in ipairs({"hash", "file", "prefix_hash", "prefix_file", "tcp", "tcp_async_set", "tcp_acked", "prefix_tcp"}) do
  describe("crun.store " .. name, function()
    local s, cleanup
    before_each(function() s, cleanup = kinds[name]() end)
    after_each(function() s:close(); cleanup() end)

    it("sets and gets binary-safe values", function()
      s:set("key0", "value0")
      assert.are.equal("value0", s:get("key0"))
      s:set("key0", "value1")
      assert.are.equal("value1", s:get("key0"))
      local bin = "a\0b\255\0"
      s:set("bin", bin)
      assert.are.equal(bin, s:get("bin"))
      s:set("empty", "")
      assert.are.equal("", s:get("empty"))
      s:set("num", 42) -- numbers are stored as their text, like any Lua string
      assert.are.equal("42", s:get("num"))
    end)

    it("adds, creating the key at 0, and stores decimal text", function()
      assert.are.equal(5, s:add("cnt", 5))
      assert.are.equal(-2, s:add("cnt", -7))
      assert.are.equal("-2", s:get("cnt"))
      assert.are.equal(0, s:add("zero", 0))
      assert.is_true(s:check{"zero"})
      s:set("text", "abc")
      expect_error("^EINVAL: .*text", s.add, s, "text", 1)
    end)

    it("compare_set follows torch", function()
      -- missing key, non-empty expected: returns expected, stores nothing
      assert.are.equal("x", s:compare_set("cs", "x", "y"))
      assert.is_false(s:check{"cs"})
      -- missing key, empty expected: sets desired
      assert.are.equal("first", s:compare_set("cs", "", "first"))
      -- mismatch: returns the current value
      assert.are.equal("first", s:compare_set("cs", "wrong", "second"))
      assert.are.equal("second", s:compare_set("cs", "first", "second"))
      assert.are.equal("second", s:get("cs"))
    end)

    it("appends", function()
      s:append("ap", "ab")
      s:append("ap", "c\0d")
      assert.are.equal("abc\0d", s:get("ap"))
    end)

    it("multi_set and multi_get", function()
      s:multi_set({"m1", "m2", "m3"}, {"one", "two", ""})
      assert.are.same({"one", "two", ""}, s:multi_get{"m1", "m2", "m3"})
      assert.are.same({}, s:multi_get{})
      expect_error("3 values for 2 keys", s.multi_set, s, {"a", "b"}, {"1", "2", "3"})
    end)

    it("checks, waits, deletes and counts keys", function()
      local n0 = s:num_keys()
      s:set("k1", "v")
      s:set("k2", "v")
      assert.is_true(s:check{"k1", "k2"})
      assert.is_true(s:check("k1"))
      assert.is_false(s:check{"k1", "nope"})
      s:wait{"k1", "k2"}
      s:wait({"k1"}, 0.5)
      assert.are.equal(n0 + 2, s:num_keys())
      assert.is_true(s:delete_key("k1"))
      assert.is_false(s:delete_key("k1"))
      assert.is_false(s:check{"k1"})
      assert.are.equal(n0 + 1, s:num_keys())
    end)

    it("fails get, wait and multi_get on missing keys at the deadline", function()
      s:set_timeout(0.2)
      assert.are.equal(0.2, s:timeout())
      local t0 = crun.clock()
      expect_error("^ETIMEDOUT: .*missing", s.get, s, "missing")
      local dt = crun.clock() - t0
      assert.is_true(dt >= 0.19 and dt < 3, "get took " .. dt)
      t0 = crun.clock()
      expect_error("^ETIMEDOUT: .*w1'", s.wait, s, {"w1", "w2"}, 0.1)
      dt = crun.clock() - t0
      assert.is_true(dt >= 0.09 and dt < 3, "wait took " .. dt)
      s:set("here", "1")
      expect_error("^ETIMEDOUT", s.multi_get, s, {"here", "missing"})
      -- the store stays usable after a timeout
      s:set("after", "ok")
      assert.are.equal("ok", s:get("after"))
    end)

    it("queues are FIFO, binary-safe and apart from plain keys", function()
      local items = queue_items(40, 1)
      assert.are.equal(0, s:queue_len("jobs"))
      for i, v in ipairs(items) do
        s:queue_push("jobs", v)
        assert.are.equal(i, s:queue_len("jobs"))
      end
      s:set("jobs", "plain") -- a plain key of the same name is another thing
      assert.are.equal(40, s:queue_len("jobs"))
      assert.are.equal(0, s:queue_len("other"))
      for i, v in ipairs(items) do
        assert.are.equal(v, s:queue_pop("jobs"), "item " .. i)
        assert.are.equal(#items - i, s:queue_len("jobs"))
      end
      assert.are.equal("plain", s:get("jobs"))
      s:queue_push("jobs", "kept")
      assert.is_true(s:delete_key("jobs")) -- deletes the plain key only
      assert.is_false(s:check{"jobs"})
      assert.are.equal("kept", s:queue_pop("jobs", {block = false}))
    end)

    it("queues stay FIFO across many interleaved pushes and pops", function()
      local items = queue_items(1500, 2)
      local pushed, popped = 0, 0
      for round = 1, 30 do -- push 50, pop a varying number: the queue grows and shrinks
        for _ = 1, 50 do
          pushed = pushed + 1
          s:queue_push("big", items[pushed])
        end
        local take = (round * 17) % 61
        for _ = 1, math.min(take, pushed - popped) do
          popped = popped + 1
          assert.are.equal(items[popped], s:queue_pop("big", 5), "item " .. popped)
        end
        assert.are.equal(pushed - popped, s:queue_len("big"))
      end
      while popped < pushed do
        popped = popped + 1
        assert.are.equal(items[popped], s:queue_pop("big", 5), "item " .. popped)
      end
      assert.are.equal(0, s:queue_len("big"))
    end)

    it("pops on an empty queue: ENOTFOUND without blocking, ETIMEDOUT at the deadline", function()
      local t0 = crun.clock()
      expect_error("^ENOTFOUND: .*'[%w/]*empty_q' is empty", s.queue_pop, s, "empty_q", {block = false})
      assert.is_true(crun.clock() - t0 < 1)
      t0 = crun.clock()
      expect_error("^ETIMEDOUT: .*empty_q", s.queue_pop, s, "empty_q", 0.3)
      local dt = crun.clock() - t0
      assert.is_true(dt >= 0.29 and dt < 3, "pop with timeout 0.3 took " .. dt)
      t0 = crun.clock()
      expect_error("^ETIMEDOUT", s.queue_pop, s, "empty_q", {timeout = 0.2, block = true})
      dt = crun.clock() - t0
      assert.is_true(dt >= 0.19 and dt < 3, "pop with {timeout = 0.2} took " .. dt)
      s:set_timeout(0.2) -- no timeout given: the store's
      t0 = crun.clock()
      expect_error("^ETIMEDOUT", s.queue_pop, s, "empty_q")
      dt = crun.clock() - t0
      assert.is_true(dt >= 0.19 and dt < 3, "pop with the store's timeout 0.2 took " .. dt)
      -- the store and the queue stay usable
      s:queue_push("empty_q", "late")
      assert.are.equal(1, s:queue_len("empty_q"))
      assert.are.equal("late", s:queue_pop("empty_q", 1))
      expect_error("bad argument", s.queue_pop, s, "q", -1)
      expect_error("bad argument", s.queue_pop, s, "q", {timeout = 0})
      expect_error("bad argument", s.queue_pop, s, "q", {block = "no"})
      expect_error("^EINVAL: queue_pop: unknown option 'blocking' %(accepted: block, timeout%)",
                   s.queue_pop, s, "q", {blocking = false})
      expect_error("bad argument", s.queue_push, s, "q", {})
      expect_error("bad argument", s.queue_len, s, nil)
    end)

    it("list_keys returns the plain keys, sorted, without the queues", function()
      assert.are.same({}, s:list_keys())
      s:set("b", "1")
      s:set("a", "2")
      s:add("c\1x", 3)
      s:set("", "empty key")
      s:multi_set({"m2", "m1"}, {"x", "y"})
      s:queue_push("qonly", "item")
      s:queue_push("a", "a queue named like a key")
      assert.are.same({"", "a", "b", "c\1x", "m1", "m2"}, s:list_keys())
      assert.is_true(s:delete_key("b"))
      assert.are.same({"", "a", "c\1x", "m1", "m2"}, s:list_keys())
      assert.are.equal(1, s:queue_len("qonly"))
    end)

    it("raises ECLOSED once closed, and closing twice is fine", function()
      s:close()
      s:close()
      expect_error("^ECLOSED", s.get, s, "k")
      expect_error("^ECLOSED", s.set, s, "k", "v")
      assert.is_truthy(tostring(s):match("closed"))
      s, cleanup = kinds[name]() -- for after_each
    end)

    it("rejects bad arguments with bad argument errors", function()
      expect_error("bad argument", s.set, s, "k", {})
      expect_error("bad argument", s.get, s, nil)
      expect_error("bad argument", s.add, s, "k", 1.5)
      expect_error("bad argument", s.wait, s, {"k", 3})
      expect_error("bad argument", s.wait, s, {"k"}, -1)
      expect_error("bad argument", s.set_timeout, s, 0)
      -- the binding's own checks start with the status name
      expect_error("^EINVAL: bad argument #3 to '%?' %(timeout must be > 0 seconds%)$", s.wait, s, {"k"}, -1)
      expect_error("^EINVAL: bad argument #2 to '%?' %(string expected, got no value%)$", s.queue_pop, s)
      expect_error("^EINVAL: bad argument #3 to '%?' %(timeout must be > 0 seconds%)$", s.queue_pop, s, "q", -1)
      expect_error("^EINVAL: bad argument #2 to '%?' %(string expected, got table%)$", s.queue_len, s, {})
      expect_error("bad argument", s.get, {}, "k")
    end)

    -- wait with a NaN timeout never ended (its deadline compared false with
    -- the clock); set_timeout(inf) stored a negative timeout (every blocking
    -- call failed at once instead of waiting)
    it("rejects a NaN wait timeout, and caps an infinite one and set_timeout", function()
      expect_error("^EINVAL: store wait 'never': timeout %-?nan s is not a number of seconds", s.wait, s, {"never"}, 0 / 0)
      s:set("there", "1")
      s:wait({"there"}, 1 / 0) -- inf: the longest timeout, as set_timeout takes it
      s:set_timeout(1 / 0)
      assert.is_true(math.abs(s:timeout() - 1e9) < 1, tostring(s:timeout()))
      s:set_timeout(0.2)
      expect_error("^ETIMEDOUT", s.wait, s, {"never"})
    end)
  end)
end

describe("crun.store kinds", function()
  it("prefix stores write '<prefix>/<key>' into the inner store", function()
    local h = S.hash()
    local p = S.prefix("job", h)
    p:set("k", "v")
    assert.are.equal("v", h:get("job/k"))
    assert.is_false(h:check{"k"})
    assert.are.equal("prefix", p:kind())
    h:close() -- the prefix store keeps its own reference
    assert.are.equal("v", p:get("k"))
    p:close()
  end)

  for _, inner_kind in ipairs({"hash", "file", "tcp"}) do
    it("prefix stores over " .. inner_kind .. " list and queue only their own keys", function()
      local inner, cleanup = kinds[inner_kind]()
      local a, b = S.prefix("a", inner), S.prefix("b", inner)
      inner:set("top", "0")
      a:set("k1", "1")
      a:set("k0", "0")
      b:set("k2", "2")
      a:queue_push("q", "from a")
      assert.are.same({"k0", "k1"}, a:list_keys())
      assert.are.same({"k2"}, b:list_keys())
      assert.are.same({"a/k0", "a/k1", "b/k2", "top"}, inner:list_keys())
      assert.are.equal(1, a:queue_len("q"))
      assert.are.equal(0, b:queue_len("q"))
      assert.are.equal(1, inner:queue_len("a/q"))
      expect_error("^ENOTFOUND", b.queue_pop, b, "q", {block = false})
      assert.are.equal("from a", inner:queue_pop("a/q", 1))
      a:close(); b:close(); inner:close(); cleanup()
    end)
  end

  it("two file stores on one path share keys", function()
    local path = tmpfile()
    local a, b = S.file(path), S.file(path)
    a:set("k", "v")
    assert.are.equal("v", b:get("k"))
    assert.are.equal(1, b:add("n", 1))
    assert.are.equal(2, a:add("n", 1))
    a:close(); b:close()
    os.remove(path)
  end)

  it("a file that is not a store is refused", function()
    local path = tmpfile()
    local f = io.open(path, "w"); f:write("hello world\n"); f:close()
    expect_error("^EPROTO: .*not a crun store", S.file, path)
    os.remove(path)
  end)

  it("tcp port 0 picks a port; a second client sees the same keys", function()
    local m = S.tcp{port = 0, is_master = true, timeout = 5}
    local port = m:port()
    assert.is_true(port > 0)
    local c = S.tcp{host = "127.0.0.1", port = port, timeout = 5}
    m:set("k", "v")
    assert.are.equal("v", c:get("k"))
    assert.are.equal(port, c:port())
    assert.are.equal("tcp", c:kind())
    c:close(); m:close()
  end)

  it("tcp reports EADDRINUSE naming host:port", function()
    local m = S.tcp{host = "127.0.0.1", port = 0, is_master = true, timeout = 5}
    local err = expect_error("^EADDRINUSE", S.tcp, {host = "127.0.0.1", port = m:port(), is_master = true})
    assert.is_truthy(err:find("127.0.0.1:" .. m:port(), 1, true))
    m:close()
  end)

  it("tcp connect to nothing fails with ECONNREFUSED at the connect deadline", function()
    local srv = S.server{host = "127.0.0.1"}
    local port = srv:port()
    srv:stop()
    local t0 = crun.clock()
    expect_error("^ECONNREFUSED: .*127.0.0.1:" .. port, S.tcp,
                 {host = "127.0.0.1", port = port, connect_timeout = 0.3})
    assert.is_true(crun.clock() - t0 < 3)
  end)

  it("tcp needs a port and a table", function()
    expect_error("port", S.tcp, {host = "127.0.0.1"})
    expect_error("^EINVAL: crun.store.tcp: an options table is expected, got string$", S.tcp, "127.0.0.1")
    expect_error("^EINVAL: crun.store.file: the path must be a string, got nil$", S.file)
    expect_error("^EINVAL: crun.store.barrier: world_size must be an integer >= 1, got 0$",
                 S.barrier, S.hash(), "b", 0, 0)
    expect_error("^EINVAL", S.tcp, {port = 0}) -- port 0 only on the master
    -- NaN / inf came back as "ETIMEDOUT: ... sent no greeting" at once
    expect_error("^EINVAL: bad argument #1 to 'tcp' %(field 'timeout' is %-?nan, not a number of seconds up to 1e9%)$",
                 S.tcp, {port = 0, is_master = true, timeout = 0 / 0})
    expect_error("^EINVAL: bad argument #1 to 'tcp' %(field 'connect_timeout' is inf,",
                 S.tcp, {port = 0, is_master = true, connect_timeout = 1 / 0})
  end)

  it("a standalone server serves clients until stopped", function()
    local srv = S.server{host = "127.0.0.1", port = 0}
    local c = S.tcp{host = "127.0.0.1", port = srv:port(), timeout = 5}
    c:set("k", "v")
    assert.are.equal("v", c:get("k"))
    srv:stop()
    expect_error("^ECONN", c.get, c, "k")
    expect_error("^ECLOSED", srv.port, srv)
    c:close()
  end)

  it("barrier releases when every rank arrived, and can be reused", function()
    local s = S.hash()
    s:add("barrier/b/count", 2) -- two other ranks already arrived
    S.barrier(s, "b", 3, 0, 1)
    s:add("barrier/b/count", 2)
    S.barrier(s, "b", 3, 0, 1) -- second generation
    local err = expect_error("^ETIMEDOUT: barrier 'b' on rank 0: 1 of 3", S.barrier, s, "b", 3, 0, 0.2)
    assert.is_truthy(err)
  end)
end)
