-- tensor_dtypes_spec.lua — int8, int16 and bool tensors: creation, totable,
-- fill, conversion (truncating from floats, where nan or a value out of
-- range is refused; wrapping from integers; a Lua number that does not fit
-- is refused, as torch refuses it), element-
-- wise ops and reductions, save/load and printing; bool as torch has it
-- (true / false in Lua, any non-zero converts to true, sum counts).
local tmpname = require("helpers.common").tmpname -- os.tmpname() under TMPDIR
local crun = require "crun"
local T = crun.tensor

describe("int8, int16 and bool tensors", function()
  it("hold signed values across their whole range", function()
    local a = T.new({-128, 127, -1, 5}, "int8")
    assert.are.same({-128, 127, -1, 5}, a:totable())
    assert.are.equal(3, a:sum())
    assert.are.equal(127, a:max())
    assert.are.equal(-128, a:min())
    assert.are.same({0, -2, -2, 10}, (a + a):totable()) -- wraps as C and torch do
    local s = T.new({-32768, 32767, -300}, "int16")
    assert.are.same({-32768, 32767, -300}, s:totable())
    assert.are.same({-7, -7, -7}, T.full({3}, -7, "int16"):totable())
    assert.are.equal("crun.CharTensor", a:type())
    assert.are.equal("crun.ShortTensor", s:type())
  end)

  it("convert from floats by truncating toward zero, from integers by wrapping", function()
    local c = T.zeros({4}, "int16")
    c:copy(T.new({1.9, -2.9, 32767.9, -32768.9}))
    assert.are.same({1, -2, 32767, -32768}, c:totable())
    assert.are.same({-56, 44}, T.new({200, 300}, "int32"):to("int8"):totable())
    assert.are.same({-128.0, 127.0}, T.new({-128, 127}, "int8"):to("float32"):totable())
    assert.are.same({0, 255, 0}, T.new({-0.9, 255.9, 0.5}):to("uint8"):totable())
    assert.are.same({math.mininteger, 9223372036854774784},
                    T.new({-2 ^ 63, 9223372036854774784.0}, "float64"):to("int64"):totable())
  end)

  -- torch leaves an out-of-range float-to-integer cast undefined (x86 gives
  -- INT64_MIN for 1e300 and nan in .long(), wraps in .byte()); crun saturated
  -- (1e300 -> 2^63 - 1024, nan -> 0) without a word. Now such a cast fails,
  -- naming the element, and writes nothing.
  it("refuse a float-to-integer conversion of nan, inf or a value out of range", function()
    local function refused(pattern, f)
      local ok, err = pcall(f)
      assert.is_false(ok, pattern)
      assert.matches(pattern, tostring(err))
    end
    local E = "^EINVAL: convert float64 to int64: element 2 %(1e%+300%) does not fit int64"
    refused(E, function() return T.new({-7.5, 1e300, 3}, "float64"):to("int64") end)
    refused(E, function() return T.new({-7.5, 1e300, 3}, "float64"):long() end)
    refused("element 1 %(%-1e%+300%) does not fit int64", function() return T.new({-1e300}, "float64"):long() end)
    refused("element 1 %(9%.2233720368548e%+18%) does not fit int64", function() return T.new({2 ^ 63}, "float64"):long() end)
    refused("element 3 %(%-?nan%) does not fit int32", function() return T.new({1, 2, 0 / 0}):int() end)
    refused("element 1 %(inf%) does not fit int16", function() return T.new({math.huge}):short() end)
    refused("element 1 %(%-inf%) does not fit int8", function() return T.new({-math.huge}):to("int8") end)
    refused("^EINVAL: convert float32 to uint8: element 4 %(256%) does not fit uint8 %[0, 255%]",
            function() return T.new({1, 2, 3, 256}):byte() end)
    refused("element 1 %(%-1%) does not fit uint8", function() return T.new({-1}):byte() end)
    refused("element 2 %(128%) does not fit int8", function() return T.new({1, 128}, "float16"):to("int8") end)
    refused("element 1 %(2147483648%) does not fit int32", function() return T.new({2 ^ 31}, "float64"):int() end)
    -- copy into an existing tensor, strided sources: the row-major position, nothing written
    local dst = T.new({{5, 6}, {7, 8}}, "int32")
    local src = T.new({{1, 1e10}, {3, 4}}, "float64"):t() -- element (1, 2) of the view is 3, (2, 1) is 1e10
    refused("^EINVAL: convert float64 to int32: element 3 %(10000000000%) does not fit int32", function() dst:copy(src) end)
    assert.are.same({{5, 6}, {7, 8}}, dst:totable())
    refused("element 2 %(%-?nan%)", function() local t = T.zeros({2, 2}, "int64"); t[1] = T.new({1, 0 / 0}) end)
  end)

  -- torch raises "value cannot be converted to type int8_t without overflow"
  -- for such a Python scalar; crun wrapped (integers) or saturated (floats)
  it("refuse a Lua number that does not fit an integer dtype, in new, full, fill and t[i] = v", function()
    local function refused(pattern, f)
      local ok, err = pcall(f)
      assert.is_false(ok, pattern)
      assert.matches(pattern, tostring(err))
    end
    refused("^EINVAL: bad argument #1 to 'new' %(value 300 does not fit int8 %[%-128, 127%]%)$",
            function() return T.new({1, 300}, "int8") end)
    refused("value %-129 does not fit int8", function() return T.new({-129}, "int8") end)
    refused("value 256 does not fit uint8", function() return T.new({256}, "uint8") end)
    refused("value %-1 does not fit uint8", function() return T.new({-1}, "uint8") end)
    refused("value 32768 does not fit int16", function() return T.new({{1}, {32768}}, "int16") end)
    refused("value 2147483648 does not fit int32", function() return T.new({2147483648}, "int32") end)
    refused("value 9.3e%+18 does not fit int64", function() return T.new({9.3e18}, "int64") end)
    refused("nan does not fit int32", function() return T.new({0 / 0}, "int32") end)
    refused("^EINVAL: bad argument #2 to 'full' %(value 40000 does not fit int16", function() return T.full({2}, 40000, "int16") end)
    refused("^EINVAL: bad argument #1 to 'fill' %(value 10000000000%.0 does not fit int32",
            function() return T.zeros({2}, "int32"):fill(1e10) end)
    refused("value 200 does not fit int8", function() local t = T.zeros({2}, "int8"); t[1] = 200 end)
    refused("value 200 does not fit int8", function() local t = T.zeros({2, 2}, "int8"); t[1] = 200 end)
    refused("value 200 does not fit int8", function() local t = T.zeros({2, 2}, "int8"); t[{1, 2}] = 200 end)
    -- what fits: the ends of each range, floats truncated toward zero, booleans
    assert.are.same({-128, 127, 127, -128}, T.new({-128, 127, 127.9, -128.9}, "int8"):totable())
    assert.are.same({0, 255}, T.new({0, 255}, "uint8"):totable())
    assert.are.same({math.mininteger, math.maxinteger}, T.new({math.mininteger, math.maxinteger}, "int64"):totable())
    assert.are.same({1, 0}, T.new({true, false}, "int8"):totable())
    assert.are.same({-2147483648, 2147483647}, T.new({-2147483648, 2147483647}, "int32"):totable())
  end)

  it("bool: true / false in Lua, non-zero is true, sum counts the true elements", function()
    local b = T.new({true, false, true}, "bool")
    assert.are.same({true, false, true}, b:totable())
    assert.are.equal(2, b:sum())
    assert.are.same({true, false, true, true}, T.new({1.5, 0, -0.25, 0 / 0}):to("bool"):totable())
    assert.are.same({1, 0, 1}, b:to("int8"):totable())
    assert.are.same({true, true}, T.zeros({2}, "bool"):fill(3):totable())
    assert.are.equal("crun.BoolTensor", b:type())
    local ok, err = pcall(function() return b:mean() end)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("bool", 1, true), err)
  end)

  it("save and load exactly, and print", function()
    local path = tmpname()
    local v = {a = T.new({-128, 127}, "int8"), b = T.new({true, false}, "bool"),
               c = T.new({-300, 300}, "int16")}
    crun.save(path, v)
    local l = crun.load(path)
    os.remove(path)
    for k, t in pairs(v) do
      assert.are.equal(t:dtype(), l[k]:dtype())
      assert.is_true(t:equal(l[k]), k)
    end
    local text = tostring(v.b)
    assert.is_truthy(text:find("true", 1, true) and text:find("false", 1, true), text)
    assert.is_truthy(text:find("[crun.Tensor bool of size 2]", 1, true), text)
    assert.is_truthy(tostring(v.a):find("-128", 1, true))
  end)
end)
