-- The shared-memory engine under crun.dist: crun-lua -n 1..4 on one host
-- attaches it to the cpu group (the INFO log says so), every collective
-- gives the reference result for every dtype and op over one-shot and
-- pipelined sizes, a late rank is reported as a timeout naming it, and no
-- segment is left in /dev/shm afterwards.
local tmpname = require("helpers.common").tmpname -- os.tmpname() under TMPDIR

local WORKER = [==[
local crun = require "crun"
local dist, T = crun.dist, crun.tensor
dist.init_process_group{backend = "cpu"}
local r, n = dist.get_rank(), dist.get_world_size()
print(string.format("PID %d %d", r, tonumber(io.open("/proc/self/stat"):read("l"):match("^(%d+)"))))
local FLOATS = {float32 = true, float64 = true, float16 = true, bfloat16 = true}
local function value(dt, op, q, i)
  if op == "product" then return (dt == "uint8" and {2, 1, 1, 1} or {-2, 2, 1, 1})[(q + i) % 4 + 1] end
  if op == "band" or op == "bor" or op == "bxor" then return (q * 37 + i * 11 + 5) % 256 end
  local k = (q * 7 + i * 3) % 11
  return dt == "uint8" and k or k - 5
end
local function expected(dt, op, i)
  local acc = value(dt, op, 0, i)
  for q = 1, n - 1 do
    local v = value(dt, op, q, i)
    if op == "sum" or op == "avg" then acc = acc + v
    elseif op == "product" then acc = acc * v
    elseif op == "min" then acc = math.min(acc, v)
    elseif op == "max" then acc = math.max(acc, v)
    elseif op == "band" then acc = acc & v
    elseif op == "bor" then acc = acc | v
    elseif op == "bxor" then acc = acc ~ v end
  end
  if op == "avg" then
    acc = acc / n
    if not FLOATS[dt] then acc = acc < 0 and math.ceil(acc) or math.floor(acc) end
  end
  if dt == "uint8" then acc = math.tointeger(acc) % 256 end
  return acc
end
local function check(what, got, want, dt, op, i)
  local tol = (op == "avg" and FLOATS[dt]) and 2e-2 * (math.abs(want) + 1) or 0
  if math.abs(got - want) > tol then
    error(string.format("%s %s %s rank %d element %d: got %s, expected %s", what, dt, op, r, i, got, want))
  end
end
local function filled(dt, op, q, count, base)
  local t = T.zeros({count}, dt)
  for i = 1, count do t[i] = value(dt, op, q, (base or 0) + i - 1) end
  return t
end

local dtypes = {"float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8"}
local ops = {"sum", "product", "min", "max", "avg", "band", "bor", "bxor"}
for _, dt in ipairs(dtypes) do
  for _, op in ipairs(ops) do
    if FLOATS[dt] and (op == "band" or op == "bor" or op == "bxor") then goto next end
    for _, count in ipairs({1, 7, 100003}) do
      local t = filled(dt, op, r, count)
      dist.all_reduce(t, op)
      for i = 1, count do check("all_reduce", t[i], expected(dt, op, i - 1), dt, op, i) end
    end
    ::next::
  end
end
for root = 0, n - 1 do
  for _, count in ipairs({7, 100003}) do
    local t = filled("float64", "sum", r == root and 100 or r, count)
    dist.broadcast(t, root)
    for i = 1, count do check("broadcast", t[i], value("float64", "sum", 100, i - 1), "float64", "", i) end
    t = filled("int32", "max", r, count)
    dist.reduce(t, root, "max")
    if r == root then
      for i = 1, count do check("reduce", t[i], expected("int32", "max", i - 1), "int32", "max", i) end
    end
  end
end
for _, count in ipairs({7, 100003}) do
  local list = {}
  for q = 1, n do list[q] = T.zeros({count}, "float32") end
  dist.all_gather(list, filled("float32", "sum", r, count))
  for q = 1, n do
    for i = 1, count, 97 do check("all_gather", list[q][i], value("float32", "sum", q - 1, i - 1), "float32", "", i) end
  end
  local ins = {}
  for q = 1, n do ins[q] = filled("float32", "sum", r, count, (q - 1) * count) end
  local out = T.zeros({count}, "float32")
  dist.reduce_scatter(out, ins, "sum")
  for i = 1, count do check("reduce_scatter", out[i], expected("float32", "sum", r * count + i - 1), "float32", "sum", i) end
end
-- gather and scatter from rank n-1; all_to_all with blocks of uneven lengths
local count = 30011
local t = filled("float32", "sum", r, count)
local list = nil
if r == n - 1 then
  list = {}
  for q = 1, n do list[q] = T.zeros({count}, "float32") end
end
dist.gather(t, list, n - 1)
if list then
  for q = 1, n do check("gather", list[q][count], value("float32", "sum", q - 1, count - 1), "float32", "", q) end
  for q = 1, n do list[q] = filled("float32", "sum", 40 + q - 1, count) end
end
dist.scatter(t, list, n - 1)
for i = 1, count, 101 do check("scatter", t[i], value("float32", "sum", 40 + r, i - 1), "float32", "", i) end
local function len(src, dst) return 1000 * (src + dst) + 7 end
local outs, ins = {}, {}
for q = 1, n do
  ins[q] = filled("float32", "sum", r * 16 + q - 1, len(r, q - 1))
  outs[q] = T.zeros({len(q - 1, r)}, "float32")
end
dist.all_to_all(outs, ins)
for q = 1, n do
  for i = 1, len(q - 1, r), 13 do
    check("all_to_all", outs[q][i], value("float32", "sum", (q - 1) * 16 + r, i - 1), "float32", "", i)
  end
end
for _ = 1, 50 do dist.barrier() end
print("DONE " .. r)
dist.destroy_process_group()
]==]

local LATE = [==[
local crun = require "crun"
local dist, T = crun.dist, crun.tensor
dist.init_process_group{backend = "cpu"}
local r = dist.get_rank()
dist.barrier()
if r == 2 then os.execute("sleep 2.5") os.exit(0) end
local ok, err = pcall(dist.all_reduce, T.ones({8}), "sum", {timeout = 1})
print("RESULT " .. r .. " " .. tostring(ok) .. " " .. tostring(err))
os.exit(0)
]==]

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  local ok, _, code = p:close()
  return ok and code == 0, out
end

local function launcher() return os.getenv("CRUN_LUA") or "build/crun-lua" end

local function have_launcher()
  local f = io.open(launcher(), "rb")
  if not f then return false end
  f:close()
  return (pcall(require, "crun.dist"))
end

local function run(n, script)
  local path = tmpname()
  local f = assert(io.open(path, "w"))
  f:write(script)
  f:close()
  local ok, out = sh(string.format("CRUN_DEBUG=INFO CRUN_DEBUG_SUBSYS=SHM timeout 120 %s -n %d --master-port 0 %s",
                                   launcher(), n, path))
  os.remove(path)
  return ok, out
end

local function shm_files_of(out)
  local left = {}
  for pid in out:gmatch("PID %d+ (%d+)") do
    local ok, ls = sh("ls /dev/shm")
    assert(ok, ls)
    for name in ls:gmatch("[^\n]+") do
      if name:find("crun%-shm%-" .. pid .. "%-") then left[#left + 1] = name end
    end
  end
  return left
end

describe("shm engine under crun.dist", function()
  if not have_launcher() then
    pending("needs crun-lua and crun.dist in this build")
    return
  end

  for n = 1, 4 do
    it("gives every collective's reference result on " .. n .. " rank(s)", function()
      local ok, out = run(n, WORKER)
      assert(ok, out)
      for r = 0, n - 1 do assert.is_truthy(out:find("DONE " .. r, 1, true), out) end
      if n > 1 then
        local _, attached = out:gsub("uses the shared%-memory engine", "")
        assert.are.equal(n, attached, out)
      end
      assert.are.same({}, shm_files_of(out))
    end)
  end

  it("reports a rank that never arrives as a timeout naming it", function()
    local ok, out = run(3, LATE)
    assert(ok, out)
    for r = 0, 1 do
      local line = out:match("RESULT " .. r .. " ([^\n]*)")
      assert.is_truthy(line, out)
      assert.is_truthy(line:find("^false ETIMEDOUT"), line)
      assert.is_truthy(line:find("rank 2", 1, true), line)
    end
  end)
end)
