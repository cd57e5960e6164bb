-- crun.cuda and tensors on a device: copies host<->device<->device (strided,
-- non-contiguous, pinned), streams and events, memory figures, error texts.
--
-- It runs on a real GPU when one is present, and in CI through the test
-- double of the CUDA runtime (ctest gpudouble.cuda: build/gpudouble/, two
-- "devices" of host memory, CRUN_GPU_DOUBLE=1). Without a device ctest
-- reports spec.cuda skipped with the reason (tests/gpu_double/gpu_gate.lua);
-- run directly, every test is pending with that reason.
local crun = require "crun"
local T = crun.tensor
local cuda = crun.cuda
local C = require "helpers.common"

local DOUBLE = os.getenv("CRUN_GPU_DOUBLE") == "1"
local NDEV = cuda.device_count()

-- Runs a Lua chunk in a fresh lua5.4 (same LUA_PATH / LUA_CPATH) with an
-- env prefix; returns its stdout+stderr and exit code.
local function run_lua(code, env)
  local dir = C.tmpdir("cuda")
  C.write(dir .. "/x.lua", code)
  local p = io.popen(string.format("%s timeout -s KILL 60 lua5.4 %s 2>&1; echo \"rc=$?\"", env or "",
                                   C.q(dir .. "/x.lua")))
  local out = p:read("a")
  p:close()
  C.rmrf(dir)
  local rc = tonumber(out:match("rc=(%d+)%s*$"))
  return out:gsub("rc=%d+%s*$", ""), rc
end

-- Signed, non-periodic values: v(i) = (-1)^i * (i * 7919 mod 1009) / 8
-- (exact in every float dtype used below up to i = 2^11; ints take floor).
local function value(i, is_int)
  local v = ((i * 7919) % 1009) / 8 * (i % 2 == 0 and 1 or -1)
  if is_int then return math.floor(v) end
  return v
end

-- A host tensor of `shape` and dtype filled with value(linear index).
local function filled(shape, dtype)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  local is_int = dtype:find("int") ~= nil
  local flat = {}
  for i = 1, n do
    local v = value(i, is_int)
    if dtype == "uint8" then v = math.abs(v) % 256 end
    if dtype == "int8" then v = v % 128 end
    if dtype == "bool" then v = (i % 3 == 0) end
    flat[i] = v
  end
  local t = T.new(flat, dtype)
  return t:view(shape), flat
end

-- Flattens a nested table (row-major).
local function flatten(tbl, out)
  out = out or {}
  if type(tbl) ~= "table" then out[#out + 1] = tbl; return out end
  for _, v in ipairs(tbl) do flatten(v, out) end
  return out
end

local avail = cuda.is_available()
local reason = cuda.unavailable_reason()
local it_gpu = avail and it or function(name) pending(name .. " (skipped: " .. tostring(reason) .. ")") end

describe("crun.cuda devices", function()
  it_gpu("reports the devices and switches between them", function()
    assert.is_true(NDEV >= 1)
    if DOUBLE then assert.equals(2, NDEV) end
    local before = cuda.current_device()
    cuda.set_device(NDEV - 1)
    assert.equals(NDEV - 1, cuda.current_device())
    local z = T.zeros({3}, {device = "cuda"})
    assert.equals("cuda:" .. (NDEV - 1), z:device())
    cuda.set_device(before)
    local ok, err = pcall(cuda.set_device, NDEV)
    assert.is_false(ok)
    assert.matches("^EINVAL: set_device: device cuda:" .. NDEV .. " does not exist %(" .. NDEV .. " device", err)
  end)

  it_gpu("picks LOCAL_RANK modulo the count, and CRUN_CUDA_DEVICE over it", function()
    local code = 'print("dev=" .. require("crun").cuda.current_device())'
    local out = run_lua(code, "LOCAL_RANK=3")
    assert.matches("dev=" .. (3 % NDEV), out)
    out = run_lua(code, "LOCAL_RANK=3 CRUN_CUDA_DEVICE=0")
    assert.matches("dev=0", out)
  end)

  it_gpu("gives each crun-lua worker the device of its LOCAL_RANK", function()
    local dir = C.tmpdir("cuda")
    C.write(dir .. "/job.lua", [[
      local crun = require "crun"
      local x = crun.tensor.zeros({4}, {device = "cuda"})
      print(string.format("rank %s local %s device %d tensor %s", os.getenv("RANK"), os.getenv("LOCAL_RANK"),
                          crun.cuda.current_device(), x:device()))
    ]])
    local r = C.run("-n 2 --master-port 0 " .. C.q(dir .. "/job.lua"), {timeout = 60})
    C.rmrf(dir)
    assert.equals(0, r.code, r.err)
    for lr = 0, 1 do
      local d = lr % NDEV
      assert.matches("local " .. lr .. " device " .. d .. " tensor cuda:" .. d, r.out)
    end
  end)
end)

describe("device tensors", function()
  local dtypes = {"float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "int8", "int16", "bool"}

  it_gpu("round-trip host -> device -> host in every dtype and size", function()
    for _, dt in ipairs(dtypes) do
      for _, shape in ipairs({{0}, {1}, {1023}, {17, 65}, {3, 0, 5}}) do
        local h = filled(shape, dt)
        local d = h:cuda()
        assert.is_true(d:is_cuda())
        assert.equals("cuda:" .. cuda.current_device(), d:device())
        assert.equals(dt, d:dtype())
        assert.same(h:size(), d:size())
        local back = d:cpu()
        assert.is_false(back:is_cuda())
        assert.equals("cpu", back:device())
        assert.same(h:totable(), back:totable(), dt)
      end
    end
    local s = T.new({{-2.5}}, "float64"):view({}):cuda() -- 0-d
    assert.equals(-2.5, s:item())
  end)

  it_gpu("copies non-contiguous views both ways and between devices", function()
    local h, flat = filled({6, 7, 5}, "float32")
    -- a permuted host view (innermost stride 35) to the device
    local p = h:transpose(1, 3) -- 5x7x6
    local d = p:cuda()
    local expect = {}
    for a = 1, 5 do for b = 1, 7 do for c = 1, 6 do
      expect[#expect + 1] = flat[(c - 1) * 35 + (b - 1) * 5 + a]
    end end end
    assert.same(expect, flatten(d:cpu():totable()))
    -- a narrowed device view (rows 2..4 of dim 2, every element of the rest) to the host
    local dv = h:cuda():narrow(2, 2, 3)
    assert.is_false(dv:is_contiguous())
    local got = flatten(dv:cpu():totable())
    local want = {}
    for a = 1, 6 do for b = 2, 4 do for c = 1, 5 do want[#want + 1] = flat[(a - 1) * 35 + (b - 1) * 5 + c] end end end
    assert.same(want, got)
    -- a device view into a device view of another shape (copy with strides on both sides)
    local dst = T.zeros({5, 3, 6}, "float32", {device = "cuda"})
    dst:copy(dv:transpose(1, 3))
    assert.same(flatten(dv:transpose(1, 3):cpu():totable()), flatten(dst:cpu():totable()))
    -- a broadcast (stride 0) source
    local row = T.new({1.5, -2, 3.25}, "float64")
    local e = row:view({1, 3}):expand({4, 3}):cuda()
    assert.same({1.5, -2, 3.25, 1.5, -2, 3.25, 1.5, -2, 3.25, 1.5, -2, 3.25}, flatten(e:cpu():totable()))
    -- device to device
    if NDEV >= 2 then
      local other = d:cuda(1)
      assert.equals("cuda:1", other:device())
      assert.same(expect, flatten(other:cpu():totable()))
      local back = dv:to("cuda:1"):to(0)
      assert.equals("cuda:0", back:device())
      assert.same(want, flatten(back:cpu():totable()))
    end
  end)

  it_gpu("copy converts dtypes across devices; to() takes a device, a dtype or both", function()
    local h = filled({9, 13}, "float64")
    local d = h:to("cuda")
    local f = T.zeros({9, 13}, "float32")
    f:copy(d)
    assert.same(h:float():totable(), f:totable())
    local di = d:to("int32")
    assert.equals("int32", di:dtype())
    assert.is_true(di:is_cuda())
    assert.same(h:to("int32"):totable(), di:cpu():totable())
    -- a float-to-integer cast on a device refuses nan / out of range as on the host
    -- (the cast kernel saturated: 1e300 -> 2^63 - 1024, nan -> 0)
    local bad = T.new({{1.5, 0 / 0}, {1e300, -2}}, "float64"):cuda()
    local ok, err = pcall(bad.to, bad, "int64")
    assert.is_false(ok)
    assert.matches("^EINVAL: convert float64 to int64: element 2 %(%-?nan%) does not fit int64", err)
    ok, err = pcall(function() return T.zeros({2, 2}, "int32"):cuda():copy(bad) end)
    assert.is_false(ok)
    assert.matches("^EINVAL: convert float64 to int32: element 2", err)
    assert.same({{1, -3}}, T.new({{1.5, -3.9}}, "float64"):cuda():to("int16"):cpu():totable())
    local both = h:to("cuda:0", "float16")
    assert.equals("float16", both:dtype())
    assert.equals("cuda:0", both:device())
    assert.equals(d, d:to("cuda:0")) -- nothing to do: the same tensor
    assert.equals(h, h:cpu())
    local c = d:clone()
    assert.is_true(c:is_cuda())
    assert.is_false(c:is_same_storage(d))
    assert.is_true(c:equal(h))
    assert.is_true(T.zeros_like(d):is_cuda())
  end)

  it_gpu("makes tensors on a device from the factories", function()
    local z = T.zeros({2, 3}, {device = "cuda", dtype = "int64"})
    assert.equals("int64", z:dtype())
    assert.same({{0, 0, 0}, {0, 0, 0}}, z:totable())
    assert.same({{7, 7}, {7, 7}}, T.full({2, 2}, 7, "int32", {device = "cuda:0"}):totable())
    assert.same({-1.5, 2}, T.new({-1.5, 2}, {device = "cuda"}):totable())
    assert.same({1, 1}, T.ones(2, {device = 0}):totable())
    assert.same({0, 1, 2}, T.arange(3, {device = "cuda"}):totable())
    local r1 = T.randn({5}, {seed = 4, device = "cuda"})
    assert.is_true(r1:is_cuda())
    assert.same(T.randn({5}, {seed = 4}):totable(), r1:totable())
    local e = T.empty({4}, {device = "cuda"})
    e:fill(-3.5)
    assert.same({-3.5, -3.5, -3.5, -3.5}, e:totable())
    e:zero()
    assert.same({0, 0, 0, 0}, e:totable())
  end)

  it_gpu("prints through a host copy and names the device", function()
    local h = T.new({{1.25, -2}, {3, 4.5}}, "float32")
    local s = tostring(h:cuda())
    assert.equals((tostring(h):gsub("%]$", " on cuda:" .. cuda.current_device() .. "]")), s)
    assert.matches("on cuda:%d%]$", tostring(T.zeros({0}, {device = "cuda"})))
  end)

  it_gpu("pins host memory; pinned copies run on the current stream", function()
    local h = filled({4096}, "float32")
    local p = h:pin_memory()
    assert.is_true(p:is_pinned())
    assert.is_false(h:is_pinned())
    assert.equals(p, p:pin_memory())
    local pz = T.zeros({3}, {pin_memory = true})
    assert.is_true(pz:is_pinned())
    local s = cuda.Stream()
    cuda.set_stream(s)
    local d = p:cuda() -- asynchronous on s
    s:synchronize()
    cuda.set_stream(cuda.default_stream())
    assert.is_true(d:equal(h))
    local ok, err = pcall(function() return d:pin_memory() end)
    assert.is_false(ok)
    assert.matches("^EINVAL: pin_memory: the tensor is on cuda:%d, only host tensors can be pinned", err)
  end)
end)

describe("streams and events", function()
  it_gpu("orders work across streams through events", function()
    local n = 4 * 1024 * 1024 -- 16 MB: the copy on s1 is still running when s2 is told to wait
    local src = T.full({n}, -1.25, "float32", {device = "cuda"})
    cuda.synchronize()
    local s1, s2 = cuda.Stream(), cuda.Stream()
    local mid = T.zeros({n}, "float32", {device = "cuda"})
    local dst = T.zeros({n}, "float32", {device = "cuda"})
    cuda.synchronize()
    cuda.set_stream(s1)
    mid:copy(src)
    local e = s1:record_event()
    cuda.set_stream(s2)
    s2:wait_event(e)
    dst:copy(mid)
    local done = cuda.Event():record(s2)
    cuda.set_stream(cuda.default_stream())
    done:synchronize()
    assert.is_true(done:query())
    assert.is_true(s1:query() and s2:query())
    local h = dst:narrow(1, n - 2, 2):cpu()
    assert.same({-1.25, -1.25}, h:totable())
    assert.equals(-1.25, dst:narrow(1, 1, 1):cpu():item())
  end)

  it_gpu("wait_stream orders a stream after another's queued work", function()
    local n = 2 * 1024 * 1024
    local src = T.full({n}, 3.5, "float64", {device = "cuda"})
    local a = T.zeros({n}, "float64", {device = "cuda"})
    local b = T.zeros({n}, "float64", {device = "cuda"})
    cuda.synchronize()
    local s1, s2 = cuda.Stream(), cuda.Stream()
    cuda.set_stream(s1)
    a:copy(src)
    s2:wait_stream(s1)
    cuda.set_stream(s2)
    b:copy(a)
    cuda.set_stream(cuda.default_stream())
    s2:synchronize()
    assert.equals(3.5, b:narrow(1, n, 1):cpu():item())
  end)

  it_gpu("measures elapsed time between timing events and refuses the others", function()
    local e0 = cuda.Event{enable_timing = true}
    local e1 = cuda.Event{enable_timing = true}
    local ok, err = pcall(function() return e0:elapsed_time(e1) end)
    assert.is_false(ok)
    assert.matches("^ESTATE: Event:elapsed_time: the start event was never recorded", err)
    e0:record()
    T.zeros({1 << 20}, {device = "cuda"}):fill(2)
    e1:record()
    e1:synchronize()
    local ms = e0:elapsed_time(e1)
    assert.is_true(ms >= 0 and ms < 60000, tostring(ms))
    local plain = cuda.Event():record()
    plain:synchronize()
    ok, err = pcall(function() return e0:elapsed_time(plain) end)
    assert.is_false(ok)
    assert.matches("^EINVAL: Event:elapsed_time: both events need timing", err)
    assert.is_true(cuda.Event():query()) -- never recorded: complete
    ok, err = pcall(cuda.Event, {enable_timing = true, colour = 1})
    assert.is_false(ok)
    assert.matches("^EINVAL: cuda.Event: unknown option 'colour'", err)
  end)

  it_gpu("keeps a current stream per device; the default one is shared", function()
    local def = cuda.current_stream()
    assert.equals(cuda.default_stream(), def)
    local s = cuda.Stream()
    cuda.set_stream(s)
    assert.equals(s, cuda.current_stream())
    assert.are_not.equal(def, cuda.current_stream())
    cuda.set_stream(def)
    assert.equals(def, cuda.current_stream())
    assert.matches("^crun.cuda.Stream%(device=cuda:%d", tostring(s))
  end)
end)

describe("device memory figures", function()
  it_gpu("counts allocated, reserved and peak bytes; empty_cache returns the cache", function()
    collectgarbage(); collectgarbage()
    collectgarbage("stop") -- no other tensor is freed while the figures are read
    cuda.synchronize()
    cuda.empty_cache()
    local a0 = cuda.memory_allocated()
    cuda.reset_peak_memory_stats()
    assert.equals(a0, cuda.max_memory_allocated())
    local x = T.empty({1000, 3}, "float64", {device = "cuda"}) -- 24000 bytes
    assert.equals(a0 + 24000, cuda.memory_allocated())
    local y = T.zeros({77}, "int16", {device = "cuda"})    -- 154 bytes
    assert.equals(a0 + 24154, cuda.memory_allocated())
    assert.equals(a0 + 24154, cuda.max_memory_allocated())
    assert.is_true(cuda.memory_reserved() >= cuda.memory_allocated())
    x, y = nil, nil
    collectgarbage(); collectgarbage()
    assert.equals(a0, cuda.memory_allocated())
    assert.equals(a0 + 24154, cuda.max_memory_allocated()) -- the peak stays
    local stats = cuda.memory_stats()
    assert.equals(a0, stats.allocated)
    local before = cuda.memory_reserved()
    cuda.empty_cache()
    local after = cuda.memory_reserved()
    assert.is_true(after <= before)
    assert.is_true(after >= cuda.memory_allocated())
    if DOUBLE then assert.equals(a0, after) end -- the double's pool keeps nothing after a trim
    cuda.reset_peak_memory_stats()
    assert.equals(a0, cuda.max_memory_allocated())
    collectgarbage("restart")
  end)
end)

describe("device errors", function()
  it_gpu("a host-only op on a device tensor names the op and the device", function()
    local d = T.new({1, -2, 3}, {device = "cuda"})
    local dev = cuda.current_device()
    for _, case in ipairs({
      -- (arithmetic, reductions, softmax and matmul run on the device: spec/cuda_math_spec.lua)
      {"uniform_", function() return d:uniform_() end},
      {"index_select", function() return d:index_select(1, T.new({1}, "int64")) end},
      {"set element", function() d[1] = 5 end},
    }) do
      local ok, err = pcall(case[2])
      assert.is_false(ok, case[1])
      assert.matches("^ENOTSUP: [%w_ ]+: not implemented for a tensor on cuda:" .. dev ..
                     " %(copy it to the host with :cpu%(%) first%)", err, 1, false, case[1])
      assert.is_truthy(err:find(case[1], 1, true), err)
    end
    local h = T.new({1, 2, 3})
    local ok, err = pcall(function() return h + d end)
    assert.is_false(ok)
    assert.matches("^EINVAL: add: operands on different devices %(cpu and cuda:" .. dev, err)
  end)

  it_gpu("rejects unknown and missing devices", function()
    local h = T.new({1, 2})
    local ok, err = pcall(function() return h:to("cuda:" .. NDEV) end)
    assert.is_false(ok)
    assert.matches("^EINVAL: to: device cuda:" .. NDEV .. " does not exist %(" .. NDEV .. " device", err)
    ok, err = pcall(T.zeros, {2}, {device = NDEV + 5})
    assert.is_false(ok)
    assert.matches("^EINVAL: tensor: device cuda:" .. (NDEV + 5) .. " does not exist", err)
    ok, err = pcall(T.zeros, {2}, {device = "gpu"})
    assert.is_false(ok)
    assert.matches("^EINVAL: bad argument #2 to '[%w.]*zeros' %(tensor: unknown device 'gpu'", err)
    ok, err = pcall(T.zeros, {2}, {device = "cuda", pin_memory = true})
    assert.is_false(ok)
    assert.matches("pin_memory applies to host tensors, not cuda:%d", err)
    ok, err = pcall(function() return h:to("cuda:x") end)
    assert.is_false(ok) -- not a device: taken for a dtype
    assert.matches("unknown dtype 'cuda:x'", err)
  end)

  it_gpu("reports out-of-memory with the figures (test double only)", function()
    if not DOUBLE then return pending("needs the double's CRUN_CUDA_DOUBLE_MEM") end
    local out, rc = run_lua([[
      local T = require("crun").tensor
      local a = T.zeros({1000}, "float64", {device = "cuda"})
      local ok, err = pcall(T.zeros, {200}, "float64", {device = "cuda"})
      print(ok, err)
    ]], "CRUN_CUDA_DOUBLE_MEM=9000")
    assert.equals(0, rc, out)
    assert.matches("false\tENOMEM: cuda alloc: cudaMallocAsync failed on cuda:0: cudaErrorMemoryAllocation " ..
                   "%(out of memory%); asked for 1600 bytes, 8000 allocated, 8000 reserved", out)
  end)

  it_gpu("says why there is no device (test double only)", function()
    if not DOUBLE then return pending("needs the double's CRUN_CUDA_DOUBLE_DEVICES") end
    local out, rc = run_lua([[
      local crun = require "crun"
      print("avail", crun.cuda.is_available(), crun.cuda.device_count())
      print("why", crun.cuda.unavailable_reason())
      print(pcall(crun.tensor.zeros, {2}, {device = "cuda"}))
      print(pcall(crun.cuda.Stream))
    ]], "CRUN_CUDA_DOUBLE_DEVICES=0")
    assert.equals(0, rc, out)
    assert.matches("avail\tfalse\t0", out)
    assert.matches("why\tENOTSUP: no CUDA device %(cudaGetDeviceCount: cudaErrorNoDevice, no CUDA%-capable device is detected%)", out)
    assert.matches("false\tENOTSUP: no CUDA device", out)
  end)
end)
