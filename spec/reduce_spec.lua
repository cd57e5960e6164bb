-- Reductions along a dim and over all elements (sum, mean, prod, max, min,
-- argmax, argmin) against straightforward Lua references, on every dim of a
-- 3-d tensor, with keepdim, integer dtypes, empty dims and nan.
local T = require "crun.tensor"

local function flat(t) return t:contiguous():view(t:numel()):totable() end

-- Reference reduction of nested table x (shape s) along dim d (1-based):
-- returns a flat list of values and of 1-based positions (for max / min).
local function ref_reduce(x, s, d, op)
  local vals, pos = {}, {}
  local function get(i, j, k) return x[i][j][k] end
  local ranges = {s[1], s[2], s[3]}
  local n = ranges[d]
  ranges[d] = 1
  for i = 1, ranges[1] do
    for j = 1, ranges[2] do
      for k = 1, ranges[3] do
        local acc, at
        for m = 1, n do
          local idx = {i, j, k}
          idx[d] = m
          local v = get(idx[1], idx[2], idx[3])
          if m == 1 then acc, at = v, 1
          elseif op == "sum" or op == "mean" then acc = acc + v
          elseif op == "prod" then acc = acc * v
          elseif op == "max" then if v > acc then acc, at = v, m end
          elseif op == "min" then if v < acc then acc, at = v, m end end
        end
        if op == "mean" then acc = acc / n end
        vals[#vals + 1], pos[#pos + 1] = acc, at
      end
    end
  end
  return vals, pos
end

local function assert_close(got, want, tol, what)
  assert.equal(#want, #got, what)
  for i = 1, #want do
    if math.abs(got[i] - want[i]) > tol * (1 + math.abs(want[i])) then
      error(string.format("%s: element %d is %.9g, expected %.9g", what, i, got[i], want[i]), 2)
    end
  end
end

for _, dt in ipairs({"float32", "float64", "int32", "int64"}) do
  describe("reductions on " .. dt, function()
    local shape = {3, 4, 5}
    local src = T.randn(shape, {seed = 5, dtype = "float64"}):mul(3)
    if dt:find("int") then src = src:round() end
    local x = src:to(dt)
    local xt = x:totable()
    local ops = {"sum", "prod", "max", "min"}
    if not dt:find("int") then ops[#ops + 1] = "mean" end
    local tol = dt == "float32" and 1e-5 or 1e-12

    for _, op in ipairs(ops) do
      it(op .. " along every dim, with and without keepdim", function()
        for d = 1, 3 do
          local want, wpos = ref_reduce(xt, shape, d, op)
          local v, pos = x[op](x, d)
          local expect_shape = {table.unpack(shape)}
          table.remove(expect_shape, d)
          assert.same(expect_shape, v:size())
          assert_close(flat(v), want, tol, op .. " dim " .. d)
          if op == "max" or op == "min" then
            assert.same(wpos, flat(pos))
            assert.equal("int64", pos:dtype())
            local argf = op == "max" and x.argmax or x.argmin
            assert.same(wpos, flat(argf(x, d)))
          end
          local kept = x[op](x, d, true)
          expect_shape = {table.unpack(shape)}
          expect_shape[d] = 1
          assert.same(expect_shape, kept:size())
        end
      end)
    end

    it("no dim reduces every element to a number", function()
      local all = flat(x)
      local s, mx, amax = 0, -math.huge, 0
      for i, v in ipairs(all) do
        s = s + v
        if v > mx then mx, amax = v, i end
      end
      assert.is_true(math.abs(x:sum() - s) <= tol * (1 + math.abs(s)))
      assert.equal(mx, x:max())
      assert.equal(amax, x:argmax())
      if dt:find("int") then
        assert.equal("integer", math.type(x:sum()))
        assert.equal("int64", x:sum(1):dtype())
      else
        assert.is_true(math.abs(x:mean() - s / #all) <= tol * (1 + math.abs(s)))
      end
    end)
  end)
end

describe("reduction edge cases", function()
  it("negative dims count from the end", function()
    local x = T.arange(6, "float64"):view(2, 3)
    assert.same({3, 12}, x:sum(-1):totable())
    assert.same({3, 5, 7}, x:sum(-2):totable())
  end)

  -- torch: mean over no elements is 0/0 = nan (crun raised EINVAL "no identity")
  it("empty dims: sum is 0, prod is 1, mean is nan, max raises", function()
    local e = T.zeros({2, 0})
    assert.same({0, 0}, e:sum(2):totable())
    assert.same({1, 1}, e:prod(2):totable())
    assert.equal(0, e:sum())
    local ok, err = pcall(function() return e:max(2) end)
    assert.is_false(ok)
    assert.matches("max over an empty dim", err)
    -- argmax named the reduction under it ("max over an empty dim")
    assert.matches("^EINVAL: argmax over an empty dim", select(2, pcall(e.argmax, e, 2)))
    assert.matches("^EINVAL: argmin over an empty dim", select(2, pcall(e.argmin, e)))
    assert.same({0}, T.zeros({0, 2}):argmax(2):size()) -- nothing to reduce into: empty, no error
    for _, dt in ipairs({"float32", "float64", "float16", "bfloat16"}) do
      local m = T.zeros({2, 0, 3}, dt)
      local v = m:mean(2)
      assert.same({2, 3}, v:size())
      assert.equal(dt, v:dtype())
      for _, x in ipairs(flat(v)) do assert.is_true(x ~= x, dt .. ": mean over an empty dim is nan") end
      assert.same({2, 1, 3}, m:mean(2, true):size())
      assert.same({0, 3}, m:mean(1):size()) -- nothing to reduce into: empty
      assert.is_true(m:mean() ~= m:mean(), dt .. ": mean of no elements is nan")
    end
  end)

  -- torch: x.sum(dim=None, keepdim=True) is a tensor of x's rank with every
  -- size 1; crun dropped keepdim there and returned a number
  it("no dim with keepdim gives a tensor of size 1 in every dim", function()
    local x = T.new({{1.5, -2}, {3, 4.25}, {-7, 0.5}}, "float64")
    local s = 0
    for _, v in ipairs(flat(x)) do s = s + v end
    for op, want in pairs({sum = s, mean = s / 6, prod = 1.5 * -2 * 3 * 4.25 * -7 * 0.5, max = 4.25, min = -7}) do
      local v = x[op](x, nil, true)
      assert.is_true(T.is_tensor(v), op)
      assert.same({1, 1}, v:size(), op)
      assert.is_true(math.abs(v[1][1] - want) < 1e-12, op)
    end
    local am = x:argmax(nil, true)
    assert.same({1, 1}, am:size())
    assert.equal(4, am[1][1]) -- row-major position of 4.25
    assert.equal(5, x:argmin(nil, true)[1][1])
    assert.equal("number", type(x:sum(nil, false)))
  end)

  it("nan wins max and min, and its position is reported", function()
    local x = T.new({1, 0 / 0, 3})
    assert.is_true(x:max() ~= x:max())
    assert.equal(2, x:argmax())
    assert.equal(2, x:argmin())
  end)

  it("mean of an integer tensor and bad dims are clear errors", function()
    local ok, err = pcall(function() return T.ones({2}, "int32"):mean() end)
    assert.matches("^ENOTSUP: mean needs a float tensor, got int32", err)
    ok, err = pcall(function() return T.ones({2, 2}):sum(3) end)
    assert.matches("bad argument #1 to 'sum' %(dim 3 out of range for a 2%-d tensor%)", err)
  end)

  it("a large float32 sum accumulates in double", function()
    local x = T.full({1000003}, 0.1)
    local want = 1000003 * 0.10000000149011612 -- 0.1 rounded to float32
    assert.is_true(math.abs(x:sum() - want) < 1e-6 * want)
  end)
end)
