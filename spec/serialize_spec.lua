-- crun.serialize: save/load round trips of plain values with tensors, atomic
-- writes, and clear errors for truncated or foreign files.
local tmpname = require("helpers.common").tmpname -- os.tmpname() under TMPDIR
local serialize = require "crun.serialize"
local each_raises = require("helpers.common").each_raises
local util = require "helpers.train_util"
local T = util.T()

describe("crun.save / crun.load", function()
  local dir
  setup(function() dir = util.tmpdir() end)
  teardown(function() os.execute("rm -rf " .. dir) end)

  it("round-trips nested tables of every plain type and tensors of every dtype", function()
    local v = {
      n = 42, f = 2.5, neg = -7, big = math.maxinteger, s = "bytes\0and\255", yes = true, no = false,
      list = {1, 2, {3, {4}}}, [7] = "seven", [2.5] = "float key", [true] = "bool key",
      tensors = {},
    }
    for _, dt in ipairs{"float32", "float64", "int32", "int64", "uint8", "float16", "bfloat16"} do
      v.tensors[dt] = T.arange(12, dt):view(3, 4)
    end
    v.tensors.empty = T.zeros({0, 5})
    v.tensors.view = T.arange(20, "float64"):view(4, 5):narrow(2, 2, 3) -- not contiguous
    local path = dir .. "/a.crun"
    serialize.save(path, v)
    local w = serialize.load(path)
    for _, k in ipairs{"n", "f", "neg", "big", "s", "yes", "no"} do assert.are.equal(v[k], w[k]) end
    assert.are.equal("integer", math.type(w.n))
    assert.are.equal("float", math.type(w.f))
    assert.are.same(v.list, w.list)
    assert.are.equal("seven", w[7]); assert.are.equal("float key", w[2.5]); assert.are.equal("bool key", w[true])
    for k, t in pairs(v.tensors) do
      local u = w.tensors[k]
      assert.are.equal(t:dtype(), u:dtype())
      assert.are.same(t:size(), u:size())
      assert.is_true(t:equal(u), k)
    end
  end)

  it("writes the same bytes for the same value (sorted keys)", function()
    local a = serialize.dumps({b = 1, a = 2, c = {z = 1, y = 2}})
    local b = serialize.dumps({c = {y = 2, z = 1}, a = 2, b = 1})
    assert.are.equal(a, b)
  end)

  it("replaces the file atomically and leaves no temporary behind", function()
    local path = dir .. "/b.crun"
    serialize.save(path, {epoch = 1})
    serialize.save(path, {epoch = 2})
    assert.are.equal(2, serialize.load(path).epoch)
    local p = io.popen("ls -a " .. dir)
    local names = p:read("a"); p:close()
    assert.is_nil(names:match("%.tmp%."))
  end)

  it("keeps the old file when a save fails half-way", function()
    local path = dir .. "/c.crun"
    serialize.save(path, {ok = true})
    assert.has_error(function() serialize.save(path, {ok = false, bad = print}) end,
      "EINVAL: crun.save: cannot save a function at value.bad")
    assert.is_true(serialize.load(path).ok)
    local ok, err = pcall(serialize.save, dir .. "/no/such/dir/x", 1)
    assert.is_false(ok)
    assert.matches("^E[A-Z]+: crun.save: ", err)
  end)

  it("refuses truncated, corrupt and foreign files with EPROTO", function()
    local path = dir .. "/d.crun"
    serialize.save(path, {w = T.ones({10, 10})})
    local f = io.open(path, "rb"); local bytes = f:read("a"); f:close()
    for _, cut in ipairs{#bytes - 1, #bytes // 2, 9, 3} do
      local ok, err = pcall(serialize.loads, bytes:sub(1, cut), "cut")
      assert.is_false(ok)
      assert.is_truthy(err:match("^EPROTO: crun.load: cut is"), err)
    end
    local bad = bytes:sub(1, 8) .. "Z" .. bytes:sub(10)
    local ok, err = pcall(serialize.loads, bad, "bad")
    assert.is_false(ok)
    assert.is_truthy(err:match("^EPROTO"))
    ok, err = pcall(serialize.load, dir .. "/missing.crun")
    assert.is_false(ok)
    assert.are.equal("ENOTFOUND: crun.load: cannot open " .. dir .. "/missing.crun (" .. dir
      .. "/missing.crun: No such file or directory)", err)
    assert.is_false(serialize.exists(dir .. "/missing.crun"))
    assert.is_true(serialize.exists(path))
  end)

  -- crun.load("/dev/zero") read until memory ran out ("not enough memory",
  -- or the machine's swap): a file is read whole only after its magic
  it("refuses an endless or big foreign file after its magic, without reading it whole", function()
    local real_open, reads = io.open, {}
    local fake = {read = function(_, n) reads[#reads + 1] = n; return n == "a" and "" or ("\0"):rep(n) end,
                  seek = function() return 0 end, close = function() end}
    io.open = function(path, ...) if path == "/fake/endless" then return fake end return real_open(path, ...) end
    local ok, err = pcall(serialize.load, "/fake/endless")
    io.open = real_open
    assert.is_false(ok)
    assert.matches("^EPROTO: crun.load: /fake/endless is not a crun save file %(bad magic%)", err)
    assert.are.same({8}, reads)
    ok, err = pcall(serialize.load, "/dev/zero")
    assert.is_false(ok)
    assert.matches("^EPROTO: crun.load: /dev/zero is not a crun save file", err)
  end)

  -- a fifo planted where a checkpoint is looked for (by another user in a
  -- shared directory) made crun.load and exists() block in open() forever,
  -- waiting for a writer; a pipe (/dev/stdin) is still read
  it("refuses a named fifo instead of waiting for a writer, and still reads a pipe", function()
    local dir = tmpname()
    os.remove(dir)
    assert(os.execute("mkdir " .. dir .. " && mkfifo " .. dir .. "/ckpt.crun"))
    local code = string.format([[local s = require "crun.serialize"
      local ok, err = pcall(s.load, %q); print(ok, err); print(s.exists(%q))]], dir .. "/ckpt.crun", dir .. "/ckpt.crun")
    local p = io.popen("timeout -s KILL 5 lua5.4 -e " .. string.format("%q", code) .. " 2>&1; echo rc=$?")
    local out = p:read("a")
    p:close()
    assert.is_truthy(out:find("false\tEINVAL: crun.load: " .. dir .. "/ckpt.crun is a fifo, not a save file", 1, true), out)
    assert.is_truthy(out:find("\nfalse\nrc=0", 1, true), out)
    local path = dir .. "/real.crun"
    serialize.save(path, {w = -2.5, n = 7})
    p = io.popen("timeout -s KILL 5 lua5.4 -e 'local v = require(\"crun.serialize\").load(\"/dev/stdin\"); "
                 .. "print(v.w, v.n)' < " .. path .. " 2>&1")
    out = p:read("a")
    p:close()
    os.execute("rm -rf " .. dir)
    assert.are.equal("-2.5\t7\n", out)
  end)

  it("refuses a tensor that claims more elements than its bytes before allocating them", function()
    -- a float32 tensor of 2^20 x 2^20 (4 TiB) carried by 11 bytes (found by tests/fuzz/checkpoint)
    local body = "CRUNSAV1" .. "X" .. string.pack("<s1<I1<i8<i8<s8", "float32", 2, 1 << 20, 1 << 20, "-1.5e3;7;-2")
    local ok, err = pcall(serialize.loads, body .. "END!" .. string.pack("<I8", #body), "huge")
    assert.is_false(ok)
    assert.is_truthy(err:match("^EPROTO: crun.load: huge is corrupt: EINVAL: .*11 bytes given"), err)
  end)

  it("refuses a table whose key is a table, a tensor or nil (save never writes one)", function()
    -- found by tests/fuzz/checkpoint: such a file loaded into a value save() refused
    for _, key in ipairs{"t" .. string.pack("<I4", 0), "n"} do
      local body = "CRUNSAV1" .. "t" .. string.pack("<I4", 1) .. key .. "i" .. string.pack("<i8", -3)
      local ok, err = pcall(serialize.loads, body .. "END!" .. string.pack("<I8", #body), "k")
      assert.is_false(ok)
      assert.is_truthy(err:match("^EPROTO: crun.load: k is corrupt: table key of type %a+ at byte 14"), err)
    end
  end)

  it("rejects cycles and unsupported values with the path of the value", function()
    local t = {a = {}}
    t.a.back = t
    assert.has_error(function() serialize.dumps(t) end, "EINVAL: crun.save: cycle in the value at value.a.back")
    assert.has_error(function() serialize.dumps({co = coroutine.create(print)}) end,
      "EINVAL: crun.save: cannot save a thread at value.co")
    assert.has_error(function() serialize.dumps({[{}] = 1}) end,
      "EINVAL: crun.save: table key of type table at value cannot be saved")
  end)

  -- torch.save(model) pickles the module and torch.load gives it back;
  -- crun.save(path, model) saved its fields and loaded a plain table that
  -- had lost its methods (and an __index's defaults) without a word
  it("refuses a table with a metatable, naming it and where it is", function()
    local Point = {__name = "my.Point"}
    Point.__index = Point
    local p = setmetatable({x = -2}, Point)
    assert.has_error(function() serialize.dumps({model = {layer = p}}) end,
      "EINVAL: crun.save: cannot save the table with a metatable (my.Point) at value.model.layer: it would load as "
      .. "a plain table without its methods; save a plain table such as its state_dict()")
    assert.has_error(function() serialize.dumps(setmetatable({}, {__index = function() return 5 end})) end,
      "EINVAL: crun.save: cannot save the table with a metatable at value: it would load as a plain table without "
      .. "its methods; save a plain table such as its state_dict()")
    local nn = require "crun.nn"
    local ok, err = pcall(serialize.dumps, nn.Linear(3, -(-2)))
    assert.is_false(ok)
    assert.is_truthy(err:match("^EINVAL: crun.save: cannot save the table with a metatable %(crun.nn.Linear%) at value:"),
      err)
    assert.is_truthy(serialize.loads(serialize.dumps(nn.Linear(3, 2):state_dict()))[1])
  end)

  -- dumps built the path string of every value ("value.1.1.1...") whatever
  -- happened: memory quadratic in the depth (0.9 GB for 30000 levels), then a
  -- bare "stack overflow" near 100000 levels
  it("saves deep nesting in memory linear in the depth and refuses more than 10000 levels", function()
    local function chain(n)
      local t = {}
      local c = t
      for _ = 2, n do c[1] = {}; c = c[1] end
      return t
    end
    local deep = chain(10000)
    collectgarbage("collect")
    collectgarbage("stop")
    local before = collectgarbage("count")
    local ok, bytes = pcall(serialize.dumps, deep)
    local used_kb = collectgarbage("count") - before
    collectgarbage("restart")
    assert.is_true(ok, tostring(bytes))
    assert.is_true(used_kb < 16 * 1024, string.format("dumps of 10000 levels allocated %.0f KiB", used_kb))
    local back, depth = serialize.loads(bytes), 1
    while back[1] do back, depth = back[1], depth + 1 end
    assert.are.equal(10000, depth)
    assert.has_error(function() serialize.dumps(chain(10001)) end,
      "EINVAL: crun.save: tables nest deeper than 10000 levels")
    local body = string.rep("t" .. string.pack("<I4", 1) .. "i" .. string.pack("<i8", 1), 10001) .. "n"
    local ok2, err = pcall(serialize.loads, "CRUNSAV1" .. body .. "END!" .. string.pack("<I8", 8 + #body))
    assert.is_false(ok2)
    assert.matches("^EPROTO: crun.load: string is corrupt: tables nest deeper than 10000 levels at byte", err)
  end)

  it("starts every error with its status name and checks torch's options", function()
    local cases = {
      {function() serialize.save(42, 1) end, "^EINVAL: crun.save: the path must be a string, got number$"},
      {function() serialize.load(nil) end, "^EINVAL: crun.load: the path must be a string, got nil$"},
      {function() serialize.load(dir) end, "^EINVAL: crun.load: cannot read " .. dir:gsub("%p", "%%%0")
        .. " %(Is a directory%)$"},
      {function() serialize.save(dir .. "/o.crun", 1, {protocol = 2}) end,
       "^EINVAL: crun.save: unknown option 'protocol' %(accepted: _use_new_zipfile_serialization, "
       .. "pickle_module, pickle_protocol%)$"},
      {function() serialize.load(dir .. "/o.crun", {map = "cpu"}) end,
       "^EINVAL: crun.load: unknown option 'map' %(accepted: map_location, mmap, pickle_module, weights_only%)$"},
      {function() serialize.save(dir, 1) end, "^EINVAL: crun.save: "},
    }
    each_raises(cases)
    local path = dir .. "/torch_opts.crun"
    serialize.save(path, {x = 1}, {pickle_protocol = 2})
    assert.are.same({x = 1}, serialize.load(path, {map_location = "cpu", weights_only = true}))
    if io.popen("id -u"):read("l") ~= "0" then -- root reads anything
      local f = io.open(dir .. "/locked.crun", "w"); f:write("x"); f:close()
      os.execute("chmod 000 " .. dir .. "/locked.crun")
      local ok, err = pcall(serialize.load, dir .. "/locked.crun")
      assert.is_false(ok)
      assert.matches("^EACCES: crun.load: cannot open ", err)
    end
  end)

  -- the C calls under save and load end a path at its first NUL: save wrote
  -- "<dir>/victim" for "<dir>/victim\0.crun" and returned as if it had succeeded
  it("refuses a path that holds a NUL byte or is empty, and touches no file", function()
    local victim = dir .. "/victim"
    for _, c in ipairs{{serialize.save, "crun.save"}, {serialize.load, "crun.load"}} do
      local ok, err = pcall(c[1], victim .. "\0.crun", {1})
      assert.is_false(ok)
      assert.matches("^EINVAL: " .. c[2] .. ": the path \".*\\0%.crun\" holds a NUL byte", err)
      ok, err = pcall(c[1], "", {1})
      assert.is_false(ok)
      assert.matches("^EINVAL: " .. c[2] .. ": the path is empty", err)
    end
    assert.is_nil(io.open(victim))
    serialize.save(victim, 1)
    assert.is_false(serialize.exists(victim .. "\0.crun"))
    assert.is_true(serialize.exists(victim))
  end)

  it("round-trips a model and optimizer checkpoint", function()
    local nn, optim = require "crun.nn", require "crun.optim"
    local m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    local o = optim.Adam(m, {lr = 0.1})
    m.modules[1].gradWeight:fill(0.5)
    o:step()
    local path = dir .. "/ckpt.crun"
    serialize.save(path, {model = m:state_dict(), optim = o:state_dict(), epoch = 3})
    local m2 = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    local o2 = optim.Adam(m2, {lr = 0.1})
    local ck = serialize.load(path)
    m2:load_state_dict(ck.model)
    o2:load_state_dict(ck.optim)
    local p1, p2 = m:parameters(), m2:parameters()
    for i = 1, #p1 do assert.is_true(p1[i]:equal(p2[i])) end
    assert.are.equal(1, o2.state[1].step)
    assert.are.equal(3, ck.epoch)
  end)
end)

describe("training job checkpoints", function()
  it("resume after a crash under crun-lua --max-restarts and end as an uninterrupted run", function()
    if not util.have_launcher() then pending("crun-lua / crun.dist not built") return end
    local dir = util.tmpdir()
    local args = "--epochs 4 --samples 2000 --quiet --no-resume --ckpt-dir "
    local ok, out = util.crun(2, "jobs/train.lua", args .. dir .. "/a --crash-at-epoch 2", "--max-restarts 1")
    assert(ok, out)
    assert.is_truthy(out:match("simulating a crash after epoch 2"), out)
    assert.is_truthy(out:match("resumed after epoch 2"), out)
    assert.is_nil(out:match("epoch 1/4 done.*resumed.*epoch 1/4 done"), "epoch 1 ran twice")
    local ok2, out2 = util.crun(2, "jobs/train.lua", args .. dir .. "/b")
    assert(ok2, out2)
    local final = out:match("final test accuracy ([%d.]+)%%")
    assert.is_truthy(final, out)
    assert.are.equal(out2:match("final test accuracy ([%d.]+)%%"), final)
    local ck = serialize.load(dir .. "/a/train.crun")
    assert.are.equal(4, ck.epoch)
    os.execute("rm -rf " .. dir)
  end)
end)

describe("examples/checkpoint.lua", function()
  it("resumes after the simulated crash instead of starting over", function()
    if not util.have_launcher() then pending("crun-lua / crun.dist not built") return end
    local dir = util.tmpdir()
    local ok, out = util.crun(2, "examples/checkpoint.lua", dir .. "/ex", "--max-restarts 1")
    assert(ok, out)
    assert.is_truthy(out:match("restart 1: resuming after epoch 3"), out)
    assert.is_truthy(out:match("done after 1 restart"), out)
    local _, n = out:gsub("epoch 2 loss", "")
    assert.are.equal(1, n)
    os.execute("rm -rf " .. dir)
  end)
end)
