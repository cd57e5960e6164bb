-- crun.tensor math: element-wise ops with broadcasting, unary functions,
-- matrix products, linear layers, indexing and softmax, each checked against
-- a straightforward Lua reference on float32 and float64.
local T = require "crun.tensor"

local function flat(t) return t:contiguous():view(t:numel()):totable() end

-- Asserts that tensor t matches the flat list ref within tol (relative + absolute).
local function assert_close(t, ref, tol, what)
  local got = flat(t)
  assert.equal(#ref, #got, (what or "") .. ": element count")
  for i = 1, #ref do
    local a, b = got[i], ref[i]
    if not (a == b or math.abs(a - b) <= tol * (1 + math.abs(b))) then
      error(string.format("%s: element %d is %.9g, expected %.9g", what or "values", i, a, b), 2)
    end
  end
end

local tol = {float32 = 2e-6, float64 = 1e-12}

for _, dt in ipairs({"float32", "float64"}) do
  describe("element-wise on " .. dt, function()
    local a = T.randn({3, 4}, {seed = 1, dtype = dt})
    local b = T.randn({3, 4}, {seed = 2, dtype = dt})
    local row = T.randn({4}, {seed = 3, dtype = dt})
    local col = T.randn({3, 1}, {seed = 4, dtype = dt})
    local A, B, R, Cl = flat(a), flat(b), flat(row), flat(col)

    local ops = {
      add = function(x, y) return x + y end, sub = function(x, y) return x - y end,
      mul = function(x, y) return x * y end, div = function(x, y) return x / y end,
      maximum = math.max, minimum = math.min,
    }
    for name, f in pairs(ops) do
      it(name .. " with a tensor, a row, a column and scalars", function()
        local same, r, c, s, rs = {}, {}, {}, {}, {}
        for i = 1, 12 do
          local j, k = (i - 1) % 4 + 1, (i - 1) // 4 + 1
          same[i], r[i], c[i] = f(A[i], B[i]), f(A[i], R[j]), f(A[i], Cl[k])
          s[i], rs[i] = f(A[i], 0.5), f(0.5, A[i])
        end
        assert_close(a[name](a, b), same, tol[dt], name)
        assert_close(a[name](a, row), r, tol[dt], name .. " row")
        assert_close(a[name](a, col), c, tol[dt], name .. " column")
        assert_close(a[name](a, 0.5), s, tol[dt], name .. " scalar")
        assert_close(T[name](a, 0.5), s, tol[dt], "T." .. name)
        local x = a:clone()
        x[name .. "_"](x, b)
        assert_close(x, same, tol[dt], name .. "_")
        if name == "sub" then assert_close(0.5 - a, rs, tol[dt], "reverse sub") end
        if name == "div" then assert_close(0.5 / a, rs, tol[dt], "reverse div") end
      end)
    end

    it("metamethods + - * / ^ and unary minus", function()
      local ref = {}
      for i = 1, 12 do ref[i] = -(A[i] + B[i]) * 2 - A[i] / 4 + (A[i] * A[i]) end
      assert_close(-(a + b) * 2 - a / 4 + a ^ 2, ref, 4 * tol[dt], "expression")
      assert.equal(dt, (2 * a):dtype())
    end)

    it("add with alpha and in place on a non-contiguous view", function()
      local x = a:clone()
      x:add_(b, -0.5)
      local ref = {}
      for i = 1, 12 do ref[i] = A[i] - 0.5 * B[i] end
      assert_close(x, ref, tol[dt], "add_ alpha")
      for i = 1, 12 do ref[i] = A[i] + 1.5 end
      assert_close(a:add(0.5, 3), ref, tol[dt], "add scalar alpha")
      local y = a:clone()
      y:t():mul_(3)
      for i = 1, 12 do ref[i] = A[i] * 3 end
      assert_close(y, ref, tol[dt], "mul_ on t()")
    end)

    local unary = {
      exp = math.exp, tanh = function(x) return (math.exp(2 * x) - 1) / (math.exp(2 * x) + 1) end,
      sigmoid = function(x) return 1 / (1 + math.exp(-x)) end, relu = function(x) return x > 0 and x or 0 end,
      abs = math.abs, neg = function(x) return -x end, square = function(x) return x * x end,
      sin = math.sin, cos = math.cos, floor = math.floor, ceil = math.ceil,
    }
    for name, f in pairs(unary) do
      it(name, function()
        local ref = {}
        for i = 1, 12 do ref[i] = f(A[i]) end
        assert_close(a[name](a), ref, 4 * tol[dt], name)
        local x = a:clone()
        x[name .. "_"](x)
        assert_close(x, ref, 4 * tol[dt], name .. "_")
      end)
    end

    it("log, sqrt, pow and clamp on positive values", function()
      local p = a:abs():add(0.1)
      local P, rl, rs, rp, rc = flat(p), {}, {}, {}, {}
      for i = 1, 12 do
        rl[i], rs[i], rp[i] = math.log(P[i]), math.sqrt(P[i]), P[i] ^ 1.5
        rc[i] = math.min(math.max(A[i], -0.5), 0.5)
      end
      assert_close(p:log(), rl, 4 * tol[dt], "log")
      assert_close(p:sqrt(), rs, 4 * tol[dt], "sqrt")
      assert_close(p:pow(1.5), rp, 8 * tol[dt], "pow")
      assert_close(a:clamp(-0.5, 0.5), rc, 0, "clamp")
      local lo = {}
      for i = 1, 12 do lo[i] = math.max(A[i], 0) end
      assert_close(a:clamp(0), lo, 0, "clamp min only")
    end)

    it("matmul of 2-d, transposed views, 1-d and batched 3-d", function()
      local m = T.randn({5, 3}, {seed = 5, dtype = dt})
      local function ref_mm(x, y)
        local xt, yt, out = x:totable(), y:totable(), {}
        for i = 1, #xt do
          for j = 1, #yt[1] do
            local s = 0
            for k = 1, #yt do s = s + xt[i][k] * yt[k][j] end
            out[#out + 1] = s
          end
        end
        return out
      end
      assert_close(a:matmul(a:t()), ref_mm(a, a:t()), 4 * tol[dt], "a a^T")
      assert_close(m:matmul(a:narrow(2, 1, 3):t():contiguous()), ref_mm(m, a:narrow(2, 1, 3):t()), 4 * tol[dt], "m (a_3)^T")
      assert_close(a:t():matmul(b), ref_mm(a:t(), b), 4 * tol[dt], "a^T b")
      assert_close(a:narrow(2, 2, 3):matmul(m:t()), ref_mm(a:narrow(2, 2, 3), m:t()), 4 * tol[dt], "narrowed")
      local v = T.randn({4}, {seed = 6, dtype = dt})
      assert_close(a:matmul(v), ref_mm(a, v:view(4, 1)), 4 * tol[dt], "matrix-vector")
      local dot = 0
      for i, x in ipairs(flat(v)) do dot = dot + x * x end
      assert.is_true(math.abs(v:matmul(v) - dot) < 1e-5 * (1 + dot))
      local ba, bb = T.randn({2, 3, 4}, {seed = 7, dtype = dt}), T.randn({2, 4, 2}, {seed = 8, dtype = dt})
      local out = ba:matmul(bb)
      assert.same({2, 3, 2}, out:size())
      for i = 1, 2 do assert_close(out[i], ref_mm(ba[i], bb[i]), 4 * tol[dt], "batch " .. i) end
      local ok, err = pcall(function() return a:matmul(a) end)
      assert.is_false(ok)
      assert.matches("cannot multiply 3x4 by 3x4", err)
    end)

    it("linear, linear_backward and addmm", function()
      local W, bias = T.randn({2, 4}, {seed = 9, dtype = dt}), T.randn({2}, {seed = 10, dtype = dt})
      local y = T.linear(a, W, bias)
      local ref = {}
      local at, wt, bt = a:totable(), W:totable(), flat(bias)
      for i = 1, 3 do
        for o = 1, 2 do
          local s = bt[o]
          for k = 1, 4 do s = s + at[i][k] * wt[o][k] end
          ref[#ref + 1] = s
        end
      end
      assert_close(y, ref, 4 * tol[dt], "linear")
      assert_close(T.addmm(bias, a, W:t()), ref, 4 * tol[dt], "addmm")
      local gy = T.randn({3, 2}, {seed = 11, dtype = dt})
      local gx, gW, gb = T.linear_backward(a, W, gy)
      assert_close(gx, flat(gy:matmul(W)), 4 * tol[dt], "grad x")
      assert_close(gW, flat(gy:t():matmul(a)), 4 * tol[dt], "grad W")
      assert_close(gb, flat(gy:sum(1)), 4 * tol[dt], "grad b")
      local c = T.zeros({3, 2}, dt)
      c:addmm_(a, W:t())
      assert_close(c, flat(a:matmul(W:t())), 4 * tol[dt], "addmm_")
    end)

    it("softmax and log_softmax are stable along any dim", function()
      local big = a * 1000
      local Bg = big:totable()
      for _, d in ipairs({1, 2}) do
        local ref, lref = {}, {}
        for i = 1, 3 do
          for j = 1, 4 do
            local mx, s = -math.huge, 0
            local n = d == 2 and 4 or 3
            local function at(k) if d == 2 then return Bg[i][k] else return Bg[k][j] end end
            for k = 1, n do mx = math.max(mx, at(k)) end
            for k = 1, n do s = s + math.exp(at(k) - mx) end
            ref[#ref + 1] = math.exp(Bg[i][j] - mx) / s
            lref[#lref + 1] = Bg[i][j] - mx - math.log(s)
          end
        end
        assert_close(big:softmax(d), ref, 4 * tol[dt], "softmax dim " .. d)
        assert_close(big:log_softmax(d), lref, 4 * tol[dt], "log_softmax dim " .. d)
      end
      for _, v in ipairs(flat(big:softmax(2))) do assert.is_true(v == v) end
    end)
  end)
end

describe("indexing", function()
  local a = T.arange(12, "float32"):view(3, 4)

  it("index_select with a tensor or a list of 1-based indices", function()
    assert.same({{8, 9, 10, 11}, {0, 1, 2, 3}, {8, 9, 10, 11}}, a:index_select(1, T.new({3, 1, 3}, "int64")):totable())
    assert.same({{1, 3}, {5, 7}, {9, 11}}, a:index_select(2, {2, 4}):totable())
    local ok, err = pcall(function() return a:index_select(1, {1, 4}) end)
    assert.is_false(ok)
    assert.matches("index 4 %(entry 2%) out of range for dim 1 of size 3", err)
  end)

  it("gather and scatter_add_ (torch semantics, 1-based)", function()
    local idx = T.new({{4, 1}, {2, 2}, {1, 3}}, "int64")
    assert.same({{3, 0}, {5, 5}, {8, 10}}, a:gather(2, idx):totable())
    local z = T.zeros({3, 4})
    z:scatter_add_(2, idx, T.ones(3, 2))
    assert.same({{1, 0, 0, 1}, {0, 2, 0, 0}, {1, 0, 1, 0}}, z:totable())
    local ok, err = pcall(function() return a:gather(2, T.new({{5}}, "int64")) end)
    assert.matches("index 5", err)
    ok, err = pcall(function() z:scatter_add_(2, T.new({{1, 9}}, "int64"), T.ones(1, 2)) end)
    assert.is_false(ok)
    assert.same({1, 0, 0, 1}, z[1]:totable()) -- nothing applied on error
  end)

  -- src = the tensor itself was read after the adds wrote it: 5, 4, 4
  it("scatter_add_ with src sharing the tensor's storage adds the values from before", function()
    local v = T.new({1, 2, 3}, "float64")
    v:scatter_add_(1, T.new({3, 2, 1}, "int64"), v)
    assert.same({4, 4, 4}, v:totable())
    local w = T.new({1, 2, 3, 4}, "float64")
    w:narrow(1, 2, 3):scatter_add_(1, T.new({3, 1, 2}, "int64"), w:narrow(1, 1, 3))
    assert.same({1, 4, 6, 5}, w:totable())
  end)
end)

describe("dtype rules", function()
  it("integer tensors support add/sub/mul/comparisons, not float math in place", function()
    local i = T.new({1, 2, 3}, "int64")
    assert.same({2, 4, 6}, (i + i):totable())
    assert.same({3, 6, 9}, (i * 3):totable())
    assert.same({false, true, true}, i:gt(1):totable())
    assert.equal("bool", i:eq(2):dtype())
    local ok, err = pcall(function() return i:div_(2) end)
    assert.is_false(ok)
    assert.matches("^EINVAL: div_: result type float32 can't be cast to int64", err)
    ok, err = pcall(function() return i:exp_() end)
    assert.matches("^EINVAL: exp_: result type float32 can't be cast to int64", err)
    ok, err = pcall(function() return i:mul_(0.5) end)
    assert.matches("non%-integral scalar", err)
  end)

  it("mismatched dtypes and shapes are named", function()
    local ok, err = pcall(function() return T.ones(2, "int32"):add_(T.ones(2, "float64")) end)
    assert.matches("add_: result type float64 can't be cast to int32", err)
    ok, err = pcall(function() return T.ones(2, 3) + T.ones(2) end)
    assert.matches("shapes 2x3 and 2 cannot be broadcast", err)
    ok, err = pcall(function() T.ones(3):add_(T.ones(2, 3)) end)
    assert.matches("output has shape 3, expected 2x3", err)
  end)
end)

describe("set_flush_denormal", function()
  it("flushes denormal float32 and float64 inputs and results to zero only while on (off by default, as torch)", function()
    local crun = require "crun"
    local T = crun.tensor
    local x32, x64 = T.new({1e-39, -3e-40, 1.5}, "float32"), T.new({4e-310, 2.0}, "float64")
    local tiny = T.new({1e-30}, "float32")
    local before = (x32 * 1):totable()
    assert.is_true(before[1] > 0 and before[2] < 0, "denormals kept by default")
    assert.is_true((tiny * 1e-10):totable()[1] > 0, "a denormal result kept by default")
    if not crun.set_flush_denormal(true) then pending("this CPU has no flush-to-zero mode") return end
    local on32, on64 = (x32 * 1):totable(), (x64 * 1):totable()
    local r = (tiny * 1e-10):totable()[1]
    crun.set_flush_denormal(false)
    assert.are.same({0.0, 0.0, 1.5}, {on32[1], math.abs(on32[2]), on32[3]})
    assert.are.same({0.0, 2.0}, on64)
    assert.are.equal(0.0, r)
    assert.are.same(before, (x32 * 1):totable())
  end)
end)

-- An in-place op whose other operand is a view of the same storage that
-- overlaps the result without being it: every element must come from the
-- operands as they were before the op (as if the operand were cloned), not
-- from elements the op already wrote (a running sum instead of a shift).
describe("in-place ops on overlapping views", function()
  for _, dt in ipairs{"float32", "float64", "int64"} do
    it("read the inputs before writing (" .. dt .. ")", function()
      local x = T.arange(10, dt)
      x:narrow(1, 2, 9):add_(x:narrow(1, 1, 9))  -- x[2..10] += x[1..9]
      assert.are.same({0, 1, 3, 5, 7, 9, 11, 13, 15, 17}, flat(x))
      local m = T.arange(12, dt):view(3, 4)
      m:add_(m:narrow(1, 1, 1))                  -- every row += row 1 (broadcast block)
      assert.are.same({0, 2, 4, 6, 4, 6, 8, 10, 8, 10, 12, 14}, flat(m))
      local r = T.arange(12, dt):view(3, 4)
      r:narrow(1, 2, 2):sub_(r:narrow(1, 1, 2))  -- rows 2..3 -= rows 1..2
      assert.are.same({0, 1, 2, 3, 4, 4, 4, 4, 4, 4, 4, 4}, flat(r))
      local f = T.arange(10, dt)
      f:narrow(1, 1, 8):mul_(f:narrow(1, 3, 8))  -- x[1..8] *= x[3..10] (reads ahead)
      assert.are.same({0, 3, 8, 15, 24, 35, 48, 63, 8, 9}, flat(f))
      local s = T.arange(6, dt)
      s:add_(s)                                  -- the same elements: no copy needed
      assert.are.same({0, 2, 4, 6, 8, 10}, flat(s))
    end)
  end
end)

-- What a program ported from torch computes the same way here (dims 1-based).
describe("torch parity", function()
  -- Sum along 1-based dim d of the nested table v (shape s), flattened.
  local function sums_along(v, s, d)
    local out, idx = {}, {}
    local function at(t, k) for i = 1, #k do t = t[k[i]] end return t end
    local function walk(level)
      if level > #s then
        if idx[d] ~= 1 then return end
        local k, acc = {}, 0
        for i = 1, #s do k[i] = idx[i] end
        for j = 1, s[d] do k[d] = j; acc = acc + at(v, k) end
        out[#out + 1] = acc
        return
      end
      for i = 1, s[level] do idx[level] = i; walk(level + 1) end
    end
    walk(1)
    return out
  end

  it("softmax / log_softmax without a dim take torch's implicit dim (1 for 1-d and 3-d, else 2) and warn once", function()
    for _, shape in ipairs({{5}, {3, 4}, {2, 3, 4}, {2, 3, 2, 2}}) do
      local n = 1
      for _, s in ipairs(shape) do n = n * s end
      local x = (T.arange(n, "float64") * 0.37 - 1.3):pow(3):view(shape)
      local want = (#shape == 1 or #shape == 3) and 1 or 2
      local p = x:softmax()
      for i, v in ipairs(sums_along(p:totable(), shape, want)) do
        assert.is_true(math.abs(v - 1) < 1e-12, #shape .. "-d: sum " .. i .. " along dim " .. want .. " is " .. v)
      end
      assert.same(x:softmax(want):totable(), p:totable())
      assert.same(x:log_softmax(want):totable(), x:log_softmax():totable())
      assert.same(x:softmax(want):totable(), T.softmax(x):totable())
    end
    local p = io.popen([[lua5.4 -e 'local T = require "crun.tensor"
      local x = T.ones(2, 3, 4)
      x:softmax(); x:log_softmax(); T.softmax(x); x:softmax(3)' 2>&1]])
    local out = p:read("a")
    p:close()
    assert.equal(1, select(2, out:gsub("implicit dim", "")), out)
    assert.matches("softmax: implicit dim choice is deprecated", out)
  end)

  it("reductions of a 0-d tensor accept dim 1 and -1 (torch's 0 and -1) and give 0-d tensors", function()
    local s = T.tensor(-2.75, "float64")
    for _, d in ipairs({1, -1}) do
      for _, op in ipairs({"sum", "mean", "prod", "max", "min"}) do
        local v, ix = s[op](s, d)
        assert.equal(0, v:dim(), op)
        assert.equal(-2.75, v:item(), op)
        if op == "max" or op == "min" then assert.equal(1, ix:item(), op) end
        assert.equal(0, s[op](s, d, true):dim(), op .. " keepdim")
      end
      for _, op in ipairs({"argmax", "argmin"}) do
        assert.equal(0, s[op](s, d):dim(), op)
        assert.equal(1, s[op](s, d):item(), op)
      end
      assert.equal(1, s:softmax(d):item())
      assert.equal(0, s:log_softmax(d):item())
      assert.equal(0, s:softmax(d):dim())
    end
    assert.equal(1, s:softmax():item())
    assert.equal("int64", T.tensor(7, "int32"):sum(1):dtype())
    local ok, err = pcall(function() return s:sum(2) end)
    assert.is_false(ok)
    assert.matches("^EINVAL: .*dim 2 out of range for a 0%-d tensor", err)
    ok, err = pcall(function() return s:softmax(0) end)
    assert.matches("^EINVAL: .*dim 0 out of range for a 0%-d tensor", err)
  end)
  it("an integer or bool tensor with a Lua float scalar computes in float32, as torch's", function()
    local vals = {1000000000, -7, 3, -123457}
    local a = T.tensor(vals, "int32")
    local cases = {
      {a * 4.0, function(v) return v * 4 end},
      {a + 0.5, function(v) return v + 0.5 end},
      {2.25 - a, function(v) return 2.25 - v end},
      {a:mul(-1.5), function(v) return v * -1.5 end},
    }
    for i, c in ipairs(cases) do
      assert.equal("float32", c[1]:dtype(), "case " .. i)
      local want = {}
      for j, v in ipairs(vals) do want[j] = string.unpack("f", string.pack("f", c[2](v))) end
      assert.same(want, c[1]:totable(), "case " .. i)
    end
    assert.same({false, true, false, true}, a:lt(2.5):totable()) -- as floats: 3 < 2.5 is false
    assert.same({3 * 2.0 ^ 62}, (T.tensor({3}) * 2.0 ^ 62):totable()) -- int64 wrapped to -2^62
    assert.same({1.25, 0.25}, (T.tensor({true, false}) + 0.25):totable())
    assert.same({2000000000, -14, 6, -246914}, (a * 2):totable()) -- a Lua integer keeps int32
    assert.equal("int32", (a * 2):dtype())
    local ok, err = pcall(function() return a:clone():add_(0.5) end) -- in place keeps int32, as torch refuses
    assert.is_false(ok)
    assert.matches("^ENOTSUP: add: int32 tensor with non%-integral scalar 0.5", err)
  end)
  it("/ and div of integer tensors are true division in float32 (float64 beside a float64), as torch's", function()
    local f32 = function(x) return (string.unpack("f", string.pack("f", x))) end
    local av, bv = {7, -7, 5, -5, 0}, {2, 2, -3, -3, 6}
    local a, b = T.tensor(av, "int32"), T.tensor(bv, "int64")
    local q, q4, r9, qd = {}, {}, {}, {}
    for i = 1, #av do
      q[i], q4[i] = f32(av[i] / bv[i]), f32(av[i] / 4)
      r9[i] = av[i] ~= 0 and f32(9 / av[i]) or math.huge
      qd[i] = av[i] / (bv[i] + 0.5)
    end
    assert.equal("float32", (a / b):dtype())
    assert.same(q, (a / b):totable())
    assert.same(q, a:div(b):totable())
    assert.same(q4, (a / 4):totable())
    assert.same(r9, (9 / a):totable())
    assert.same(qd, (a / (b:double() + 0.5)):totable())
    assert.equal("float64", (a / T.tensor(bv, "float64")):dtype())
    local z = (T.tensor({5, -5, 0}, "int16") / 0):totable()
    assert.same({math.huge, -math.huge}, {z[1], z[2]})
    assert.is_true(z[3] ~= z[3])
    local ok, err = pcall(function() return a:clone():div_(2) end)
    assert.is_false(ok) -- (torch refuses to write the float quotient into an int tensor)
    assert.matches("^EINVAL: div_: result type float32 can't be cast to int32", err)
  end)
  it("comparisons give bool tensors, whose elements are Lua booleans; bool with bool: add = or, mul = and", function()
    local a, b = T.tensor({3.5, -2, 7.25, 0}), T.tensor({1, -2, 9, -0.5})
    local m = a:gt(b)
    assert.equal("bool", m:dtype())
    assert.same({true, false, false, true}, m:totable())
    assert.is_false(a:lt(b)[1]) -- (a uint8 0 here was truthy in Lua)
    assert.is_false(T.tensor(-3):gt(0):item())
    assert.same({false, true, false, false}, a:eq(-2):totable())
    assert.equal("bool", T.tensor({4, -1}, "int32"):le(2):dtype())
    local n = a:ge(b)
    assert.same({true, true, false, true}, (m + n):totable())
    assert.same({true, false, false, true}, (m * n):totable())
    assert.same({false, true, false, false}, m:ne(n):totable())
    assert.equal(2, m:sum())
    assert.same({1, 0, 0, 1}, m:float():totable())
    assert.same({3, 0, 0, 3}, (m * 3):totable()) -- a Lua integer: int64, as torch's
    assert.equal("int64", (m * 3):dtype())
    assert.same({false, false, false, false}, m:eq(2):totable())
    local ok, err = pcall(function() return m - n end)
    assert.is_false(ok)
    assert.matches("^ENOTSUP: sub is not supported on bool tensors", err)
  end)
  it("div with torch's rounding_mode floor / trunc rounds the quotient (integers stay integers)", function()
    local av, bv = {-7.5, 7.25, 2.125, -9, 0}, {2, -2, 0.5, 4, -3}
    local x, y = T.tensor(av), T.tensor(bv)
    local fl, tr = {}, {}
    for i = 1, #av do
      local q = av[i] / bv[i]
      fl[i], tr[i] = math.floor(q) + 0.0, (q < 0 and math.ceil(q) or math.floor(q)) + 0.0
    end
    assert.same(fl, x:div(y, {rounding_mode = "floor"}):totable())
    assert.same(tr, x:div(y, {rounding_mode = "trunc"}):totable())
    assert.same(tr, T.div(x, y, {rounding_mode = "trunc"}):totable())
    assert.same(fl, x:clone():div_(y, {rounding_mode = "floor"}):totable())
    local a = T.tensor({-7, 7, -9, 12}, "int32")
    local r = a:div(T.tensor({2, -2, 4, 5}, "int32"), {rounding_mode = "trunc"})
    assert.equal("int32", r:dtype())
    assert.same({-3, -3, -2, 2}, r:totable())
    assert.same({-7 // 2, 7 // 2, -9 // 2, 12 // 2}, a:div(2, {rounding_mode = "floor"}):totable())
    assert.same({-4, 3, -5, 6}, a:clone():div_(2, {rounding_mode = "floor"}):totable())
    assert.same({-3.75, -3.625, 4.25, -2.25, -0.0}, x:div(y, {}):totable())
    local ok, err = pcall(function() return x:div(2, {rounding_mode = "round"}) end)
    assert.is_false(ok)
    assert.matches("^EINVAL: div: rounding_mode must be 'floor', 'trunc' or nil, got round", err)
    ok, err = pcall(function() return a:div(0, {rounding_mode = "trunc"}) end)
    assert.matches("^EINVAL: div_trunc: integer division by zero", err)
  end)

  it("round with decimals rounds to that many digits, half to even, as torch's round(x, decimals=)", function()
    local f32 = function(x) return (string.unpack("f", string.pack("f", x))) end
    local function half_even(y)
      local f = math.floor(y)
      if y - f ~= 0.5 then return math.floor(y + 0.5) end
      return f % 2 == 0 and f or f + 1
    end
    local vals = {1.2345, -2.3456, 3.5, 0.125, -0.375, 1234.5, 125, -135}
    for _, dt in ipairs({"float64", "float32"}) do
      local cast = dt == "float32" and f32 or function(v) return v end
      local x = T.tensor(vals, dt)
      for _, d in ipairs({2, 1, -1, 0}) do
        local p, want = cast(10.0 ^ math.abs(d)), {}
        for i, v in ipairs(vals) do
          v = cast(v)
          want[i] = d >= 0 and cast(half_even(cast(v * p)) / p) or cast(half_even(cast(v / p)) * p)
        end
        assert.same(want, x:round(d):totable(), dt .. " decimals " .. d)
        assert.same(want, x:round({decimals = d}):totable(), dt .. " {decimals} " .. d)
        assert.same(want, x:clone():round_(d):totable(), dt .. " round_ " .. d)
      end
    end
    local ok, err = pcall(function() return T.ones(2):round(1.5) end)
    assert.is_false(ok)
    assert.matches("^EINVAL: round: decimals must be an integer, got 1.5", err)
  end)
  it("reductions and softmax take torch's dtype= and keepdim= options instead of ignoring them", function()
    local vals = {1, -2, 16777217, 3}
    local x = T.tensor(vals, "int32")
    local s64 = 0
    for _, v in ipairs(vals) do s64 = s64 + v end
    assert.equal("float64", x:sum(1, false, "float64"):dtype())
    assert.equal(s64, x:sum(1, false, "float64"):item())
    assert.equal(s64, x:sum(1, {dtype = "float64"}):item())
    assert.same({s64}, x:sum(1, {keepdim = true, dtype = "float64"}):totable())
    assert.equal(s64 / 4, x:mean(1, false, {dtype = "float64"}):item())
    assert.equal(0, x:max(1, {keepdim = false}):dim())
    assert.equal(1, x:max(1, {keepdim = true}):dim())
    assert.same({3}, x:argmax(1, {keepdim = true}):totable())
    local y = T.tensor({0.1, -0.7, 2.3})
    local p64 = y:double():softmax(1)
    assert.same(p64:totable(), y:softmax(1, "float64"):totable())
    assert.same(p64:totable(), y:softmax(1, {dtype = "float64"}):totable())
    assert.same(y:double():log_softmax(1):totable(), y:log_softmax(1, "float64"):totable())
    for _, bad in ipairs({0, 1, "yes"}) do
      local ok, err = pcall(function() return x:sum(1, bad) end)
      assert.is_false(ok)
      assert.matches("^EINVAL: sum: keepdim must be true or false", err)
    end
  end)
  it("clamp with a nan bound is EINVAL (torch gives nan everywhere, crun ignored the bound)", function()
    local x = T.tensor({1.5, -2.25, 0.75})
    for _, b in ipairs({{0 / 0, 1}, {-1, 0 / 0}, {0 / 0}}) do
      local ok, err = pcall(function() return x:clamp(b[1], b[2]) end)
      assert.is_false(ok)
      assert.matches("^EINVAL: clamp: m[ai][nx] is nan", err)
      ok, err = pcall(function() return x:clone():clamp_(b[1], b[2]) end)
      assert.matches("^EINVAL: clamp: m[ai][nx] is nan", err)
    end
    local y = T.tensor({1.5, 0 / 0, -2.25})
    local c = y:clamp(-1, 1):totable()
    assert.same({1, -1}, {c[1], c[3]})
    assert.is_true(c[2] ~= c[2]) -- a nan element stays nan, as torch's
  end)
  it("tensors of two dtypes meet in torch's promoted dtype (a 0-d one only when of a higher kind)", function()
    local f32 = function(x) return (string.unpack("f", string.pack("f", x))) end
    local i32 = T.tensor({2147483647, -5}, "int32")
    local r = i32 + T.tensor({1, -3})
    assert.equal("int64", r:dtype())
    assert.same({2147483648, -8}, r:totable())
    r = T.tensor({200}, "uint8") + T.tensor({-100}, "int8")
    assert.equal("int16", r:dtype())
    assert.same({100}, r:totable())
    r = T.tensor({true, false}) + T.tensor({5, -6}, "int32")
    assert.equal("int32", r:dtype())
    assert.same({6, -6}, r:totable())
    r = T.tensor({0.1, -0.3}, "float32") * T.tensor({3, 7}, "float64")
    assert.equal("float64", r:dtype())
    assert.same({f32(0.1) * 3, f32(-0.3) * 7}, r:totable())
    r = T.tensor({7, -2}, "int32") - T.tensor({0.25, 1.5})
    assert.equal("float32", r:dtype())
    assert.same({6.75, -3.5}, r:totable())
    -- a 0-d operand: its dtype wins only when of a higher kind (bool < integer < float)
    r = T.tensor({7, -3}, "int32") + T.tensor(2.5, "float64")
    assert.equal("float64", r:dtype())
    assert.same({9.5, -0.5}, r:totable())
    r = T.tensor({0.1, -0.7}) + T.tensor(0.2, "float64")
    assert.equal("float32", r:dtype())
    assert.same({f32(f32(0.1) + f32(0.2)), f32(f32(-0.7) + f32(0.2))}, r:totable())
    assert.equal("int32", (T.tensor({7}, "int32") + T.tensor(2)):dtype())
    assert.equal("int64", (T.tensor(7, "int32") + T.tensor(2)):dtype())
    assert.same({true, false}, T.tensor({7, 8}, "int32"):lt(T.tensor({7.5, 7.5}, "float64")):totable())
    assert.same({2.5, 3}, T.tensor({1, 3}, "int8"):maximum(T.tensor({2.5, -1})):totable())
    -- in place: computed in the promoted dtype, cast into the tensor's
    assert.same({-2147483648 + 1}, T.tensor({2147483647}, "int32"):add_(T.tensor({2})):totable())
  end)
  it("floor_divide, remainder (// and %) round toward -inf and fmod toward 0, as torch's", function()
    local av, bv = {7, -7, 7, -7, 0, 13, -1, 2147483647}, {3, 3, -3, -3, -5, 4, 6, -2}
    for _, dt in ipairs({"int32", "int64", "float32", "float64"}) do
      local a, b = T.tensor(av, dt), T.tensor(bv, dt)
      local fd, rm, fm = {}, {}, {}
      for i = 1, #av do
        local x, y = av[i], bv[i]
        if dt:find("float") then x, y = x + 0.0, y + 0.0 end
        fd[i], rm[i], fm[i] = x // y, x % y, math.fmod(x, y)
        if dt == "float32" then fd[i], rm[i], fm[i] = (string.unpack("f", string.pack("f", fd[i]))), rm[i], fm[i] end
      end
      if dt == "float32" then -- 2147483647 is 2147483648 in float32
        fd[8], rm[8], fm[8] = -1073741824.0, 0.0, 0.0
      end
      assert.same(fd, a:floor_divide(b):totable(), dt .. " floor_divide")
      assert.same(fd, (a // b):totable(), dt .. " //")
      assert.same(rm, a:remainder(b):totable(), dt .. " remainder")
      assert.same(rm, (a % b):totable(), dt .. " %")
      assert.same(fm, a:fmod(b):totable(), dt .. " fmod")
      assert.equal(dt, (a % b):dtype())
    end
    local a = T.tensor({17, -17, 5}, "int32")
    assert.same({17 // 3, -17 // 3, 5 // 3}, (a // 3):totable())
    assert.same({17 % 3, -17 % 3, 5 % 3}, (a % 3):totable())
    assert.same({29 % 17, 29 % -17, 29 % 5}, (29 % a):totable())
    assert.same({math.fmod(17, 3), math.fmod(-17, 3), math.fmod(5, 3)}, a:fmod(3):totable())
    assert.same({math.fmod(17, 3), math.fmod(-17, 3), math.fmod(5, 3)}, T.fmod(a, 3):totable())
    assert.same({17 % 2.5, -17 % 2.5, 5 % 2.5}, (a % 2.5):totable()) -- a Lua float: float32
    assert.same({math.mininteger}, (T.tensor({math.mininteger}) // -1):totable()) -- wraps, as torch's
    local ok, err = pcall(function() return a // T.tensor({1, 0, 2}, "int32") end)
    assert.is_false(ok)
    assert.matches("^EINVAL: floor_divide: integer division by zero", err)
    ok, err = pcall(function() return a % 0 end)
    assert.matches("^EINVAL: remainder: integer division by zero", err)
    local z = T.tensor({1.5, -1.5}) // 0
    assert.same({math.huge, -math.huge}, z:totable())
    local r = T.tensor({1.5}):remainder(0):item()
    assert.is_true(r ~= r)
  end)
  it("max / min with a tensor argument are maximum / minimum, as torch.max(a, b)", function()
    local a, b = T.tensor({1.5, -2, 0 / 0, 4}), T.tensor({-3, 5, 1, 0 / 0})
    local mx, mn = a:max(b):totable(), T.min(a, b):totable()
    assert.same({1.5, 5}, {mx[1], mx[2]})
    assert.same({-3, -2}, {mn[1], mn[2]})
    assert.is_true(mx[3] ~= mx[3] and mx[4] ~= mx[4] and mn[3] ~= mn[3] and mn[4] ~= mn[4]) -- nan wins
    assert.same({3, 5}, T.tensor({3, -1}, "int32"):max(T.tensor({2, 5})):totable())
  end)
  it("neg, abs and sign of integer tensors, wrapping as torch's (abs of the minimum is the minimum)", function()
    local vals = {7, -3, 0, -2147483648, 2147483647}
    local a = T.tensor(vals, "int32")
    local neg, abs, sign = {}, {}, {}
    for i, v in ipairs(vals) do
      neg[i] = v == -2147483648 and v or -v
      abs[i] = v < 0 and neg[i] or v
      sign[i] = v > 0 and 1 or v < 0 and -1 or 0
    end
    for _, r in ipairs({{a:neg(), neg}, {-a, neg}, {T.neg(a), neg}, {a:abs(), abs}, {a:sign(), sign},
                        {a:clone():neg_(), neg}, {a:clone():abs_(), abs}, {a:clone():sign_(), sign}}) do
      assert.equal("int32", r[1]:dtype())
      assert.same(r[2], r[1]:totable())
    end
    local u = T.tensor({0, 5, 255}, "uint8")
    assert.same({0, 251, 1}, (-u):totable())
    assert.same({0, 5, 255}, u:abs():totable())
    assert.same({0, 1, 1}, u:sign():totable())
    assert.same({-5, 9}, (-T.tensor({5, -9}, "int8")):totable())
    local ok, err = pcall(function() return -T.tensor({true}) end)
    assert.is_false(ok)
    assert.matches("^ENOTSUP: neg needs a float32 or float64 tensor, got bool", err)
  end)
  it("in-place ops with another dtype compute in the promoted dtype and cast back, as torch's", function()
    local f32 = function(x) return (string.unpack("f", string.pack("f", x))) end
    local a = T.tensor({1.5, -2.25})
    a:add_(T.tensor({1, 2}, "int64"))
    assert.same({2.5, -0.25}, a:totable())
    a:mul_(T.tensor({0.1, 3}, "float64"))
    assert.same({f32(2.5 * 0.1), -0.75}, a:totable())
    assert.equal("float32", a:dtype())
    local i = T.tensor({7, -9}, "int32")
    i:add_(T.tensor({(1 << 32) + 1, -3}))
    assert.same({8, -12}, i:totable())
    local g = T.tensor({1.5, -2, 0})
    g:gt_(0)
    assert.same({1, 0, 0}, g:totable())
    local e = T.tensor({3, -4}, "int64")
    e:eq_(T.tensor({3, 4}, "int32"))
    assert.same({1, 0}, e:totable())
    local k = T.tensor({0, 1, -2}, "int32")
    k:gt_(0.5) -- compared as floats, as torch's
    assert.same({0, 1, 0}, k:totable())
    for _, c in ipairs({
      {function() T.tensor({1, 2}, "int32"):add_(T.tensor({0.5, 1})) end, "result type float32 can't be cast to int32"},
      {function() T.tensor({1, 2}, "int32"):div_(T.tensor({2, 2}, "int32")) end, "result type float32 can't be cast to int32"},
      {function() T.tensor({true}):add_(T.tensor({1})) end, "result type int64 can't be cast to bool"},
    }) do
      local ok, err = pcall(c[1])
      assert.is_false(ok)
      assert.matches("^EINVAL: %a+_: " .. c[2], err)
    end
  end)
  it("var and std default to the unbiased estimate (correction 1), as torch's", function()
    local rows = {{2.5, -1.25, 7, 0.5, -3.75}, {1, 4.5, -2, 9.25, 0.125}}
    local x = T.tensor(rows, "float64")
    local function var_of(v, c)
      local m, s = 0, 0
      for _, e in ipairs(v) do m = m + e end
      m = m / #v
      for _, e in ipairs(v) do s = s + (e - m) * (e - m) end
      return s / (#v - c)
    end
    local function near(a, b, what) assert.is_true(math.abs(a - b) <= 1e-12 * (1 + math.abs(b)), what .. ": " .. a .. " vs " .. b) end
    local all = {}
    for _, r in ipairs(rows) do for _, e in ipairs(r) do all[#all + 1] = e end end
    near(x:var(), var_of(all, 1), "var()")
    near(x:std(), math.sqrt(var_of(all, 1)), "std()")
    near(x:var(nil, false), var_of(all, 0), "var(nil, false)")
    near(x:var(nil, {correction = 0}), var_of(all, 0), "var{correction=0}")
    local v2 = x:var(2)
    assert.same({2}, v2:size())
    for i = 1, 2 do near(v2[i], var_of(rows[i], 1), "var(2) row " .. i) end
    local s1 = x:std(1, {keepdim = true})
    assert.same({1, 5}, s1:size())
    for j = 1, 5 do near(s1[1][j], math.sqrt(var_of({rows[1][j], rows[2][j]}, 1)), "std(1) col " .. j) end
    near(x:std(-1, false)[2], math.sqrt(var_of(rows[2], 0)), "std(-1, false)")
    local one = T.tensor({3.5}):var()
    assert.is_true(one ~= one) -- one element, unbiased: nan, as torch's
    local ok, err = pcall(function() return T.tensor({1, 2}):var() end)
    assert.is_false(ok)
    assert.matches("^ENOTSUP: var needs a float tensor, got int64", err)
  end)
  it("cumsum and cumprod along a dim; integers and bools accumulate in int64, as torch's", function()
    local rows = {{3, -1, 4, -1, 5}, {-9, 2, 6, -5, 3}}
    local function scan(v, prod)
      local out, acc = {}, prod and 1 or 0
      for i, e in ipairs(v) do acc = prod and acc * e or acc + e; out[i] = acc end
      return out
    end
    for _, dt in ipairs({"int32", "float64", "int8"}) do
      local x = T.tensor(rows, dt)
      local c2, p2 = x:cumsum(2), x:cumprod(-1)
      assert.equal(dt:find("int") and "int64" or dt, c2:dtype())
      assert.same({scan(rows[1]), scan(rows[2])}, c2:totable())
      assert.same({scan(rows[1], true), scan(rows[2], true)}, p2:totable())
      local c1 = x:cumsum(1):totable()
      assert.same(rows[1], c1[1])
      for j = 1, 5 do assert.equal(rows[1][j] + rows[2][j], c1[2][j]) end
    end
    assert.same({100, 200, 300}, T.tensor({100, 100, 100}, "int8"):cumsum(1):totable()) -- int64: no wrap
    assert.same({1, 1, 2}, T.tensor({true, false, true}):cumsum(1):totable())
    assert.same({0.5, 1.75}, T.tensor({0.5, 1.25}):cumsum(1, "float64"):totable())
    assert.equal("float64", T.tensor({0.5, 1.25}):cumsum(1, {dtype = "float64"}):dtype())
    local c = T.tensor({1.5, 0 / 0, 2}):cumsum(1):totable()
    assert.is_true(c[1] == 1.5 and c[2] ~= c[2] and c[3] ~= c[3])
    assert.equal(-2.5, T.tensor(-2.5):cumsum(1):item())
    assert.same({0, 3}, T.zeros(0, 3):cumsum(1):size())
    local ok, err = pcall(function() return T.ones(2):cumsum() end)
    assert.is_false(ok)
    assert.matches("dim", err)
  end)
  it("sort, argsort and topk: nan is the largest, equal values keep their order (torch's stable sort)", function()
    local nan = 0 / 0
    local v = {3, 1, nan, 1, 3, -0.5, 0.25, -math.huge, 1}
    local x = T.tensor(v, "float64")
    -- the expected order: by value (nan last), then by position
    local order = {}
    for i = 1, #v do order[i] = i end
    local function key(e) return e ~= e and math.huge * 2 or e end
    local function before(i, j)
      local a, b = v[i], v[j]
      if a ~= a and b ~= b then return i < j end
      if a ~= a then return false end
      if b ~= b then return true end
      if a ~= b then return a < b end
      return i < j
    end
    table.sort(order, before)
    local vals, idx = x:sort()
    assert.same(order, idx:totable())
    for k, i in ipairs(order) do
      local got = vals[k]
      assert.is_true(got == v[i] or (got ~= got and v[i] ~= v[i]), "sorted value " .. k)
    end
    local desc = {}
    table.sort(order, function(i, j)
      local a, b = v[i], v[j]
      if (a ~= a) ~= (b ~= b) then return a ~= a end
      if a == b or (a ~= a and b ~= b) then return i < j end
      return a > b
    end)
    local dv, di = x:sort(1, true)
    assert.same(order, di:totable())
    assert.same(order, x:argsort(1, true):totable())
    assert.same(order, select(2, x:sort{descending = true}):totable())
    local tv, ti = x:topk(4)
    assert.same({order[1], order[2], order[3], order[4]}, ti:totable())
    assert.equal(3, tv[2])
    local lv, li = x:topk(3, 1, false)
    assert.same({8, 6, 7}, li:totable())
    assert.same({-math.huge, -0.5, 0.25}, lv:totable())
    local m = T.tensor({{3, -1, 2}, {0, 5, -4}}, "int32")
    local sv, si = m:sort(1)
    assert.same({{0, -1, -4}, {3, 5, 2}}, sv:totable())
    assert.same({{2, 1, 2}, {1, 2, 1}}, si:totable())
    assert.same({{3, 2}, {5, 0}}, (m:topk(2)):totable())
    assert.same({{1, 3}, {2, 1}}, select(2, m:topk(2, {dim = 2})):totable())
    assert.same({{3, 5, 2}}, m:topk(1, 1):totable())
    local big = T.tensor({math.maxinteger, math.maxinteger - 1})
    assert.same({math.maxinteger - 1, math.maxinteger}, (big:sort()):totable()) -- int64 compared exactly
    local ok, err = pcall(function() return m:topk(4) end)
    assert.is_false(ok)
    assert.matches("^EINVAL: topk: k 4 out of range for dim 2 of size 3", err)
  end)
  it("expand takes -1 for a dim it keeps, as torch's", function()
    local x = T.tensor({{1.5}, {-2}, {7}})
    assert.same({{1.5, 1.5, 1.5, 1.5}, {-2, -2, -2, -2}, {7, 7, 7, 7}}, x:expand(-1, 4):totable())
    assert.same({2, 3, 2}, x:expand({2, -1, 2}):size())
    local ok, err = pcall(function() return x:expand(-1, 4, 2) end)
    assert.is_false(ok) -- -1 for a new leading dim has no size to keep
    assert.matches("^EINVAL: expand: %-1 for new dim 1", err)
  end)
  it("clamp of integer tensors, in their dtype (float bounds: float32, as torch's)", function()
    local vals = {-7, 3, 12, 0, -1}
    local a = T.tensor(vals, "int32")
    local want, half = {}, {}
    for i, v in ipairs(vals) do
      want[i] = math.min(math.max(v, -2), 5)
      half[i] = math.min(math.max(v, -1.5), 4.5)
    end
    assert.equal("int32", a:clamp(-2, 5):dtype())
    assert.same(want, a:clamp(-2, 5):totable())
    assert.same(want, a:clone():clamp_(-2, 5):totable())
    assert.same(want, T.clamp(a, -2, 5):totable())
    local h = a:clamp(-1.5, 4.5)
    assert.equal("float32", h:dtype())
    assert.same(half, h:totable())
    local lo = {}
    for i, v in ipairs(vals) do lo[i] = math.max(v, 1) end
    assert.same(lo, a:clamp(1):totable())
    local ok, err = pcall(function() return a:clone():clamp_(0.5, 2) end)
    assert.is_false(ok)
    assert.matches("^EINVAL: clamp_: result type float32 can't be cast to int32", err)
    ok, err = pcall(function() return a:clamp(5, -2) end)
    assert.matches("^EINVAL: clamp: min 5 > max %-2", err)
  end)
  it("float math of integer and bool tensors computes in float32; floor/ceil/round/relu/square keep integers, as torch's", function()
    local f32 = function(x) return (string.unpack("f", string.pack("f", x))) end
    local vals = {4, 9, -1, 0, 2}
    local a = T.tensor(vals, "int64")
    local s = a:sqrt()
    assert.equal("float32", s:dtype())
    local got = s:totable()
    for i, v in ipairs(vals) do
      if v < 0 then assert.is_true(got[i] ~= got[i]) else assert.equal(f32(math.sqrt(v)), got[i]) end
    end
    assert.same({f32(math.exp(4)), f32(math.exp(9))}, {a:exp()[1], a:exp()[2]})
    assert.equal("float32", T.tensor({true, false}):sigmoid():dtype())
    assert.equal(f32(1 / 9), a:reciprocal()[2])
    for _, name in ipairs({"floor", "ceil", "round"}) do
      assert.equal("int64", a[name](a):dtype(), name)
      assert.same(vals, a[name](a):totable(), name)
    end
    assert.same({4, 9, 0, 0, 2}, a:relu():totable())
    assert.equal("int64", a:relu():dtype())
    local sq = T.tensor({46341, -3}, "int32"):square()
    assert.equal("int32", sq:dtype())
    assert.same({46341 * 46341 - (1 << 32), 9}, sq:totable()) -- wraps, as torch's
    local ok, err = pcall(function() return a:clone():sqrt_() end)
    assert.is_false(ok)
    assert.matches("^EINVAL: sqrt_: result type float32 can't be cast to int64", err)
  end)
  it("an integer tensor to a non-negative integer power stays integer and wraps, as torch's", function()
    local vals = {3, -2, 0, 7, -1}
    local a = T.tensor(vals, "int32")
    for _, k in ipairs({0, 1, 2, 5, 13}) do
      local want = {}
      for i, v in ipairs(vals) do
        local p = 1
        for _ = 1, k do p = p * v end
        want[i] = (p + (1 << 31)) % (1 << 32) - (1 << 31) -- int32 wrap
      end
      local r = a:pow(k)
      assert.equal("int32", r:dtype())
      assert.same(want, r:totable(), "k = " .. k)
      assert.same(want, (a ^ k):totable(), "^ " .. k)
      assert.same(want, a:clone():pow_(k):totable(), "pow_ " .. k)
    end
    assert.equal("float32", a:pow(0.5):dtype())
    local ok, err = pcall(function() return a:pow(-1) end)
    assert.is_false(ok)
    assert.matches("^EINVAL: pow: integers to negative integer powers are not allowed", err)
  end)
end)
