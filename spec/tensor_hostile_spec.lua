-- tensor_hostile_spec.lua — sizes, offsets, dims and indices at the edges of
-- the integer range: each call raises a clear error (never a view past its
-- storage, a crash or a wrap-around), and a tensor bigger than the machine
-- is ENOMEM under crun-lua (shared heap) as it is under lua5.4.
local tmpname = require("helpers.common").tmpname -- os.tmpname() under TMPDIR
local T = require "crun.tensor"
local M, m = math.maxinteger, math.mininteger

describe("hostile tensor arguments", function()
  local a = T.zeros({4, 6})

  local cases = {
    {"narrow past the end by overflow", function() return a:narrow(1, 2, M) end, "length 9223372036854775807 from 2 exceeds dim 1 of size 4"},
    {"narrow from maxinteger", function() return a:narrow(1, M, 1) end, "start 9223372036854775807 out of range"},
    {"narrow from mininteger", function() return a:narrow(1, m, 2) end, "start %-9223372036854775808 out of range"},
    {"narrow by a negative length", function() return a:narrow(2, 2, m) end, "length %-9223372036854775808 from 2 exceeds"},
    {"narrow of a narrowed view", function() return a:narrow(2, 2, 4):narrow(2, 3, M - 1) end, "exceeds dim 2 of size 4"},
    {"select at maxinteger", function() return a:select(1, M) end, "index 9223372036854775807 out of range"},
    {"view whose product wraps", function() return a:view(1 << 62, 1 << 62) end, "^EINVAL: view: shape .* is invalid for a tensor of size 4x6"},
    {"view whose product wraps to zero", function() return a:view(1 << 32, 1 << 32, 0) end, "^EINVAL: view: shape"},
    {"view with -1 and maxinteger", function() return a:view(-1, M) end, "^EINVAL: view: shape"},
    -- an empty tensor fits any shape with a zero: the strides 2^62 * 2^62 overflowed
    {"view of an empty tensor to 0x2^62x2^62", function() return T.zeros({0}):view(0, 1 << 62, 1 << 62) end, "^EINVAL: view: shape too large"},
    {"reshape of an empty tensor to 2^62x0x2^62", function() return T.zeros({0, 3}):reshape(1 << 62, 0, 1 << 62) end, "^EINVAL: view: shape too large"},
    {"reshape to maxinteger", function() return a:reshape(M, 2) end, "^EINVAL: view: shape"},
    {"expand to maxinteger", function() return a:expand(M, 4, 6) end, "^EINVAL: expand: shape too large"},
    {"expand to 2^80 elements", function() return a:expand(1 << 40, 1 << 40, 4, 6) end, "^EINVAL: expand: shape too large"},
    {"transpose dim maxinteger", function() return a:transpose(M, 1) end, "dim 9223372036854775807 out of range for a 2%-d tensor"},
    {"zeros of maxinteger", function() return T.zeros({M}) end, "^EINVAL: tensor: shape too large"},
    {"zeros whose product wraps", function() return T.zeros({1 << 31, 1 << 31, 1 << 31}) end, "^EINVAL: tensor: shape too large"},
    {"full of 4 TiB", function() return T.full({1 << 40}, 1, "float32") end, "^ENOMEM: tensor: cannot allocate 4398046511104 bytes"},
    {"arange of maxinteger", function() return T.arange(M) end, "range too large"},
    {"index at maxinteger", function() return a[M] end, "index 9223372036854775807 out of range"},
    {"index at mininteger", function() return a[m] end, "index %-9223372036854775808 out of range"},
    {"store at maxinteger", function() a[M] = 1 end, "index 9223372036854775807 out of range"},
    {"table index at maxinteger", function() return a[{1, M}] end, "index 9223372036854775807 out of range for dim 2"},
    {"index_select at maxinteger", function() return a:index_select(1, T.new({M}, "int64")) end, "^ERANGE: index_select: index 9223372036854775807"},
    -- (int64_t)1e300: undefined, INT64_MIN on x86 (1e300, 1e301 and inf gave one stream)
    {"Generator seeded with 1e300", function() return T.Generator(1e300) end, "^EINVAL: bad argument #1 to .*seed out of the range of a 64%-bit integer"},
    -- the draws were stored wrapped: values such as -22 from randint(0, 1000) in int8
    {"randint(0, 1000) into int8", function() return T.randint(0, 1000, {4}, {dtype = "int8"}) end, "^EINVAL: bad argument #2 to .*%(range %[0, 1000%) does not fit int8 %[%-128, 127%]%)"},
    {"randint(-1, 5) into uint8", function() return T.randint(-1, 5, {4}, {dtype = "uint8"}) end, "^EINVAL: bad argument #2 to .*%(range %[%-1, 5%) does not fit uint8"},
    -- lo + (hi - lo) * u with an infinite width: inf and NaN elements
    {"uniform_ over [-inf, inf)", function() return T.zeros({4}):uniform_(-1 / 0, 1 / 0) end, "^EINVAL: uniform: the range %[%-inf, inf%) is not finite"},
    {"uniform_ over [-1e308, 1e308)", function() return T.zeros({4}):uniform_(-1e308, 1e308) end, "^EINVAL: uniform: the range .* is not finite"},
    {"manual_seed of inf", function() return T.manual_seed(1 / 0) end, "^EINVAL: bad argument #1 to .*seed"},
    -- mininteger - 1 (the 1-based base) overflowed: UBSan aborted the process
    {"index_select at mininteger", function() return a:index_select(1, T.new({m}, "int64")) end, "^ERANGE: index_select: index %-9223372036854775808"},
    {"gather at mininteger", function() return a:gather(2, T.new({{m}}, "int64")) end, "^ERANGE: gather: index %-9223372036854775808"},
    {"scatter_add_ at mininteger", function() return a:clone():scatter_add_(2, T.new({{m}}, "int64"), T.ones({1, 1})) end, "^ERANGE: scatter_add_: index %-9223372036854775808"},
  }

  for _, c in ipairs(cases) do
    it(c[1], function()
      local ok, err = pcall(c[2])
      assert.is_false(ok)
      assert.matches(c[3], tostring(err))
    end)
  end

  -- the count and the elements went through doubles: arange(2^62 + 1, 2^62 + 4)
  -- was empty, arange(2^53, 2^53 + 3) had 4 elements, arange(0, NaN) was empty
  it("arange with integer bounds past 2^53 counts and steps in integers", function()
    assert.are.same({(1 << 62) + 1, (1 << 62) + 2, (1 << 62) + 3}, T.arange((1 << 62) + 1, (1 << 62) + 4):totable())
    assert.are.same({1 << 53, (1 << 53) + 1, (1 << 53) + 2}, T.arange(1 << 53, (1 << 53) + 3):totable())
    assert.are.same({M - 2, M - 1}, T.arange(M - 2, M):totable())
    assert.are.same({m + 2, m + 1}, T.arange(m + 2, m, -1):totable())
    assert.are.same({m, -1, M - 1}, T.arange(m, M, M):totable())
    assert.are.same({10, 7, 4, 1, -2, -5, -8}, T.arange(10, -10, -3):totable())
    local ok, err = pcall(T.arange, 0, 0 / 0)
    assert.is_false(ok)
    assert.matches("^EINVAL: bad argument #1 to .*arange.* %(the bounds must be numbers, not NaN%)", err)
  end)

  -- the scalar went through a double: z + (2^53 + 1) added 2^53, z - maxinteger was ERANGE
  it("int64 arithmetic with a Lua integer past 2^53 is exact", function()
    local big = (1 << 53) + 1
    local z = T.zeros({2}, "int64")
    assert.are.same({big, big}, (z + big):totable())
    assert.are.same({big, big}, (big + z):totable())
    assert.are.same({-M, -M}, (z - M):totable())
    assert.are.same({M, M}, (M - z):totable())
    assert.are.same({big, big}, (T.ones({2}, "int64") * big):totable())
    local t = T.zeros({2, 3}, "int64")
    t:t():add_(big)
    assert.are.same({{big, big, big}, {big, big, big}}, t:totable())
    assert.are.same({true, false}, T.new({big, big - 1}, "int64"):eq(big):totable())
  end)

  -- a write into an expand()ed view stored every result in one element (copy
  -- of {1, 2, 3} kept 3, add_ added once), and fill over expand(2^40) wrote
  -- one element 2^40 times (minutes; not run here)
  it("refuses to write into an expanded view, and still reads one", function()
    local base = T.zeros({1})
    local e = base:expand(3)
    for name, f in pairs{fill = function() e:fill(2) end, copy = function() e:copy(T.ones({3})) end,
                         add = function() e:add_(1) end, uniform_ = function() e:uniform_(0, 1) end,
                         scatter_add_ = function() e:scatter_add_(1, T.new({1}, "int64"), T.ones({1})) end} do
      local ok, err = pcall(f)
      assert.is_false(ok, name)
      assert.matches("^EINVAL: [%w_]+: dim 1 of the destination repeats one element %d+ times", err)
    end
    assert.are.equal(0, base[1])
    assert.are.equal(3, (e + 1):sum())
    local row = T.zeros({1, 3})
    row:expand(1, 3):fill(4) -- a size-1 dim repeats nothing
    assert.are.equal(12, row:sum())
  end)

  it("leaves the neighbouring tensor alone", function()
    local x, y = T.zeros({8}), T.full({8}, 7, "float32")
    pcall(function() x:narrow(1, 2, M):fill(1) end)
    assert.is_true(y:equal(T.full({8}, 7, "float32")))
    assert.is_true(x:equal(T.zeros({8})))
  end)

  it("a tensor bigger than the machine is ENOMEM under crun-lua too (shared heap)", function()
    local crun_lua = os.getenv("CRUN_LUA")
    if not crun_lua then pending("CRUN_LUA is not set (run through ctest)") return end
    local path = tmpname()
    local f = assert(io.open(path, "w"))
    f:write([[
local T = require("crun").tensor
local mem = 0
for line in io.lines("/proc/meminfo") do
  local kb = line:match("^MemTotal:%s+(%d+)") or line:match("^SwapTotal:%s+(%d+)")
  if kb then mem = mem + tonumber(kb) * 1024 end
end
local n = (mem // 4) * 2  -- float32 elements: twice the machine
local ok, err = pcall(T.zeros, {n})
print("big", ok, err)
local ok2, t = pcall(T.zeros, {1 << 20})
print("small", ok2, ok2 and t:numel())
]])
    f:close()
    local p = io.popen("timeout -s KILL 60 " .. crun_lua .. " -n 2 --master-port 0 " .. path .. " 2>&1")
    local out = p:read("a")
    local _, _, code = p:close()
    os.remove(path)
    assert.are.equal(0, code, out)
    for r = 0, 1 do
      assert.matches("%[" .. r .. "%] big\tfalse\tENOMEM: tensor: cannot allocate", out)
      assert.matches("%[" .. r .. "%] small\ttrue\t1048576", out)
    end
  end)
end)
