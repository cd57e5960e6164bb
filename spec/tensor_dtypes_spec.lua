-- tensor_dtypes_spec.lua — int8, int16 and bool tensors: creation, totable,
-- fill, conversion (saturating from floats, wrapping from integers), element-
-- wise ops and reductions, save/load and printing; bool as torch has it
-- (true / false in Lua, any non-zero converts to true, sum counts).
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

  it("convert from floats by truncating and saturating, from integers by wrapping", function()
    local c = T.zeros({4}, "int16")
    c:copy(T.new({1.9, -2.9, 40000, -40000}))
    assert.are.same({1, -2, 32767, -32768}, c:totable())
    assert.are.same({-56, 44}, T.new({200, 300}, "int32"):to("int8"):totable())
    assert.are.same({-128.0, 127.0}, T.new({-128, 127}, "int8"):to("float32"):totable())
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
    local path = os.tmpname()
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
