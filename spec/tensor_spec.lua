-- crun.tensor core: factories, shapes, views sharing storage, element access,
-- conversions, printing and the errors bad input gets.
local T = require "crun.tensor"
local each_raises = require("helpers.common").each_raises

local function flat(t) return t:contiguous():view(t:numel()):totable() end

describe("factories", function()
  it("zeros / ones / full / empty take a table or varargs shape and a dtype", function()
    local a = T.zeros({3, 4}, "float64")
    assert.same({3, 4}, a:size())
    assert.equal("float64", a:dtype())
    assert.equal(12, a:numel())
    assert.equal(2, a:dim())
    assert.same({1, 1}, T.ones(1, 2):totable()[1])
    assert.equal("float32", T.ones(1, 2):dtype())
    assert.same({{7, 7}}, T.full({1, 2}, 7, "int32"):totable())
    assert.same({2, 5}, T.empty(2, 5, "uint8"):size())
    assert.equal(0, T.zeros({0, 3}):numel())
  end)

  -- T.full(shape, 3) gave float32 where torch.full((2,), 3) gives int64 (and True bool)
  it("full without a dtype takes torch's: int64 for an integer value, bool for a boolean, float32 for a float", function()
    local i = T.full({2, 3}, -7)
    assert.equal("int64", i:dtype())
    assert.same({{-7, -7, -7}, {-7, -7, -7}}, i:totable())
    assert.equal("int64", T.full({2}, (1 << 53) + 1):dtype())
    assert.same({(1 << 53) + 1}, T.full({1}, (1 << 53) + 1):totable()) -- exact past 2^53
    local b = T.full({3}, true)
    assert.equal("bool", b:dtype())
    assert.same({true, true, true}, b:totable())
    assert.same({false, false}, T.full({2}, false):totable())
    assert.equal("float32", T.full({2}, -2.5):dtype())
    assert.equal("float32", T.full({2}, 3.0):dtype())          -- a Lua float, as torch's 3.0
    assert.equal("float64", T.full({2}, 3, "float64"):dtype()) -- a dtype still wins
    assert.equal("float64", T.full({2}, 3, {dtype = "float64"}):dtype())
    assert.equal("int64", T.full({2}, 3, {device = "cpu"}):dtype())
    assert.equal("float32", T.full_like(T.zeros({2}), 3):dtype())  -- full_like keeps the tensor's
  end)

  it("new builds from nested tables and rejects ragged ones", function()
    local b = T.new({{1, 2}, {3, 4}}, "int32")
    assert.same({{1, 2}, {3, 4}}, b:totable())
    assert.equal(3, b[2][1])
    assert.equal(3, b[2.0][1.0])
    assert.is_true(math.type(b[2][1]) == "integer")
    local ok, err = pcall(T.new, {{1, 2}, {3}})
    assert.is_false(ok)
    assert.matches("bad argument #1 to '[%w.]*new'", err)
    assert.matches("ragged", err)
    ok, err = pcall(T.new, {{1, "x"}})
    assert.matches("string, number expected", err)
    ok, err = pcall(T.zeros, {2}, "complex64")
    assert.matches("unknown dtype 'complex64'", err)
  end)

  -- a table whose length (#, a border) stops before its last entry made a
  -- shorter tensor without a word: {[1] = 1, [3] = 3} gave 1 element
  it("tensor infers torch.tensor's dtype from the data (new always takes float32)", function()
    local cases = {
      {{3, -1, 2}, "int64", {3}, {3, -1, 2}},
      {{{-4, 5}, {6, 7}}, "int64", {2, 2}, {{-4, 5}, {6, 7}}},
      {{1.5, -2}, "float32", {2}, {1.5, -2}},
      {{1.0, 2}, "float32", {2}, {1, 2}},           -- 1.0 is a float, as in Python
      {{{1, 2}, {3, 4.25}}, "float32", {2, 2}, {{1, 2}, {3, 4.25}}},
      {{true, false, true}, "bool", {3}, {true, false, true}},
      {{}, "float32", {0}, {}},
    }
    for _, c in ipairs(cases) do
      local t = T.tensor(c[1])
      assert.are.equal(c[2], t:dtype())
      assert.are.same(c[3], t:size())
      assert.are.same(c[4], t:totable())
    end
    local s = T.tensor(-7)
    assert.are.same({"int64", 0, -7}, {s:dtype(), s:dim(), s:item()})
    s = T.tensor(2.5)
    assert.are.same({"float32", 0, 2.5}, {s:dtype(), s:dim(), s:item()})
    assert.are.equal("bool", T.tensor(true):dtype())
    -- a dtype given wins, as a string or an option
    assert.are.equal("float64", T.tensor({1, 2}, "float64"):dtype())
    assert.are.equal("int32", T.tensor({1, 2}, {dtype = "int32"}):dtype())
    assert.are.equal("int64", T.tensor({1, 2}, {pin_memory = false}):dtype())
    -- from a tensor: a copy
    local src = T.new({1, 2}, "int64")
    local cp = T.tensor(src)
    cp[1] = 9
    assert.are.same({1, 2}, src:totable())
    assert.has_error(function() T.tensor({1, "x"}) end)
    assert.has_error(function() T.tensor({1, nil, 3}) end)
  end)

  it("new refuses a table with holes or a 0-based index, naming the missing entry", function()
    local function holes(n, set) -- entries 1..n but for those set[i] == nil
      local t = {}
      for i = 1, n do t[i] = i end
      for i = 1, n do if not set[i] then t[i] = nil end end
      return t
    end
    local cases = {
      {holes(3, {true, false, true}), "entry 2 at depth 1 is nil, but entry 3 is set"},
      {holes(6, {true, true, true, false, false, true}), "entry 4 at depth 1 is nil, but entry 6 is set"},
      {{[2] = 7}, "entry 1 at depth 1 is nil, but entry 2 is set"},
      {{{1, 2}, {3, 4}, [4] = {5, 6}}, "entry 3 at depth 1 is nil, but entry 4 is set"},
      {{{1, 2, 3}, holes(3, {true, false, true})}, "entry 2 at depth 2 is nil, but entry 3 is set"},
      {{{[3] = 1}}, "entry 1 at depth 2 is nil, but entry 3 is set"},
      {{[0] = 5, 6}, "index 0 at depth 1: a tensor is read from a sequence starting at index 1"},
      {{1, 2, [-1] = 3}, "index %-1 at depth 1"},
    }
    for i, c in ipairs(cases) do
      local ok, err = pcall(T.new, c[1], "int64")
      assert.is_false(ok, "case " .. i)
      assert.matches("^EINVAL: bad argument #1 to '[%w.]*new' %(", err)
      assert.matches(c[2], err, nil, false)
    end
    -- other keys are not positions: table.pack's n, names, fractional keys
    assert.same({1, 2, 3}, T.new(table.pack(1, 2, 3)):totable())
    assert.same({4, 5}, T.new({4, 5, name = "x", [2.5] = 1}, "int64"):totable())
    assert.same({0}, T.new({}):size())
  end)

  it("arange follows torch: [a, b) by step, int64 for integer bounds", function()
    assert.same({0, 1, 2, 3, 4}, T.arange(5):totable())
    assert.equal("int64", T.arange(5):dtype())
    assert.same({2, 4, 6}, T.arange(2, 8, 2):totable())
    assert.same({0, 0.25, 0.5, 0.75}, T.arange(0, 1, 0.25):totable())
    assert.equal("float64", T.arange(3, "float64"):dtype())
    assert.same({5, 4}, T.arange(5, 3, -1):totable())
    assert.equal(0, T.arange(0):numel())
  end)

  -- torch.linspace / torch.randperm had no crun counterpart
  it("linspace: steps values from start to stop as torch's, float32 by default, both ends exact", function()
    local f32 = function(x) return (string.unpack("f", string.pack("f", x))) end
    -- torch's formula: the first half up from start, the rest down from stop
    local function want(a, b, n, r)
      local step, out = n > 1 and r((b - a) / (n - 1)) or 0, {}
      for i = 0, n - 1 do out[i + 1] = i < n // 2 and r(a + r(step * i)) or r(b - r(step * (n - 1 - i))) end
      if n == 1 then out[1] = r(a) end
      return out
    end
    local t = T.linspace(-1.5, 2.25, 7)
    assert.equal("float32", t:dtype())
    assert.same(want(-1.5, 2.25, 7, f32), t:totable())
    assert.equal(-1.5, t[1]); assert.equal(2.25, t[7])
    local d = T.linspace(3, -0.7, 6, {dtype = "float64"})
    assert.equal("float64", d:dtype())
    assert.same(want(3, -0.7, 6, function(x) return x end), d:totable())
    assert.same({-0.7}, T.linspace(-0.7, 5, 1, {dtype = "float64"}):totable()) -- steps = 1 gives start
    assert.same({0}, T.linspace(-1, 1, 0):size())
    -- integers: computed in double, truncated toward zero (-1.67 -> -1)
    local i = T.linspace(-5, 5, 4, {dtype = "int64"})
    assert.equal("int64", i:dtype())
    assert.same({-5, -1, 1, 5}, i:totable())
    local ok, err = pcall(T.linspace, 0, 1, -2)
    assert.is_false(ok)
    assert.matches("^EINVAL: bad argument #3 to 'linspace' %(integer >= 0 expected, got %-2%)", err)
    ok, err = pcall(T.linspace, 0, 1, 3, {dtipe = "float64"})
    assert.matches("dtipe", err)
  end)

  it("randperm: a permutation of 1..n (1-based, as crun's indices), fixed by a seed", function()
    for _, n in ipairs({0, 1, 7, 100}) do
      local p = T.randperm(n, {seed = 11})
      assert.equal("int64", p:dtype())
      assert.same({n}, p:size())
      local seen = {}
      for _, v in ipairs(n > 0 and p:totable() or {}) do
        assert.is_true(v >= 1 and v <= n and not seen[v], "n = " .. n)
        seen[v] = true
      end
    end
    assert.same(T.randperm(50, {seed = 11}):totable(), T.randperm(50, {seed = 11}):totable())
    assert.is_false(T.randperm(50, {seed = 11}):equal(T.randperm(50, {seed = -12})))
    -- the same order as crun.data's seeded shuffle (0-based there)
    local perm, want = T.randperm(9, {seed = 5}):totable(), require("crun.data").permutation(9, 5)
    for k = 1, 9 do want[k] = want[k] + 1 end
    assert.same(want, perm)
    -- without a seed: from the default generator, so manual_seed repeats it
    T.manual_seed(-3)
    local a = T.randperm(40):totable()
    T.manual_seed(-3)
    assert.same(a, T.randperm(40):totable())
    assert.equal("int32", T.randperm(4, {dtype = "int32"}):dtype())
    -- shuffling rows: x:index_select(1, randperm(n)) moves whole rows
    local x = T.tensor({{1, -1}, {2, -2}, {3, -3}})
    local y = x:index_select(1, T.randperm(3, {seed = 2}))
    for r = 1, 3 do assert.equal(-y[r][1], y[r][2]) end
    local ok, err = pcall(T.randperm, -1)
    assert.matches("^EINVAL: bad argument #1 to 'randperm' %(integer >= 0 expected, got %-1%)", err)
  end)

  it("rand / randn are reproducible from a seed and differ across seeds", function()
    local a, b = T.randn({50}, {seed = 7}), T.randn({50}, {seed = 7})
    assert.is_true(a:equal(b))
    assert.is_false(a:equal(T.randn({50}, {seed = 8})))
    local u = T.rand({1000}, {seed = 1, dtype = "float64"})
    local lo, hi, sum = math.huge, -math.huge, 0
    for _, v in ipairs(u:totable()) do lo, hi, sum = math.min(lo, v), math.max(hi, v), sum + v end
    assert.is_true(lo >= 0 and hi < 1)
    assert.is_true(math.abs(sum / 1000 - 0.5) < 0.05)
    local g1, g2 = T.Generator(3), T.Generator(3)
    assert.is_true(T.rand({4}, {generator = g1}):equal(T.rand({4}, {generator = g2})))
    assert.equal(g1:random(), g2:random())
    local r = T.randint(-3, 3, {1000}, {seed = 4})
    assert.equal("int64", r:dtype())
    assert.same({-3, 2}, {r:min(), r:max()})
    assert.is_true(r:equal(T.randint(-3, 3, {1000}, {seed = 4})))
    -- torch's randint(high, size): low is 0
    assert.is_true(T.randint(7, {500}, {seed = 9}):equal(T.randint(0, 7, {500}, {seed = 9})))
    assert.same({0, 6}, {T.randint(7, {500}, {seed = 9}):min(), T.randint(7, {500}, {seed = 9}):max()})
    T.manual_seed(11); local x = T.randn(3)
    T.manual_seed(11); assert.is_true(x:equal(T.randn(3)))
  end)
end)

describe("element access", function()
  it("a[i][j] reads and writes with 1-based indices", function()
    local a = T.zeros({3, 4}, "float64")
    a[1][2] = 5
    assert.equal(5, a[1][2])
    a[{3, 4}] = -1
    assert.equal(-1, a[{3, 4}])
    assert.equal(3, #a)
    a[2] = 9 -- fills the row
    assert.same({9, 9, 9, 9}, a[2]:totable())
    a[3] = T.new({1, 2, 3, 4})
    assert.same({1, 2, 3, 4}, a[3]:totable())
  end)

  -- torch's (pred == y).sum().item(): crun's full reductions give a Lua
  -- number, and .item() on it was "attempt to index a number value"
  it("item() and tolist() on a full reduction's number give the number; other methods are EINVAL", function()
    local x = T.new({{1.5, -2.25, 3}, {-0.5, 4.75, -6}}, "float64")
    local pred, y = x:argmax(2), T.new({3, 1}, "int64")
    assert.equal(1, pred:eq(y):sum():item())
    assert.equal(math.type(1), math.type(pred:eq(y):sum():item()))
    assert.equal(0.5, x:sum():item())
    assert.equal(4.75, x:max():tolist())
    assert.equal(0.5 / 6, x:mean():item())
    local ok, err = pcall(function() return x:sum():numpy() end)
    assert.is_false(ok)
    assert.matches("^EINVAL: 0.5 is a Lua number, which has no method 'numpy' %(a reduction over every element", err)
  end)

  -- torch's x.all().item(): crun's all/any over every element give a Lua
  -- boolean, and .item() on it was "attempt to index a boolean value"
  it("item() and tolist() on all()'s and any()'s boolean give the boolean; other methods are EINVAL", function()
    local x = T.tensor({{1.5, -2.0}, {0.0, 3.25}})
    assert.is_false(x:all():item())
    assert.is_true(x:any():item())
    assert.is_true(x:ne(7):all():tolist())
    assert.is_false(T.zeros({3}):any():item())
    local ok, err = pcall(function() return x:all():numpy() end)
    assert.is_false(ok)
    assert.matches("^EINVAL: false is a Lua boolean, which has no method 'numpy'", err)
  end)

  it("out-of-range indices name the index and the size", function()
    local a = T.zeros({3, 4})
    local ok, err = pcall(function() return a[4] end)
    assert.is_false(ok)
    assert.matches("bad argument", err)
    assert.matches("index 4 out of range for dim 1 of size 3", err)
    ok, err = pcall(function() a[1][0] = 1 end)
    assert.matches("index 0 out of range for dim 1 of size 4", err)
    ok, err = pcall(function() return a[{1, 5}] end)
    assert.matches("index 5 out of range for dim 2 of size 4", err)
    ok, err = pcall(function() return a:narrow(2, 3, 3) end)
    assert.matches("bad argument #3 to 'narrow' %(length 3 from 3 exceeds dim 2 of size 4%)", err)
    ok, err = pcall(function() return a:size(3) end)
    assert.matches("dim 3 out of range for a 2%-d tensor", err)
  end)

  it("integer dtypes keep 64 bits", function()
    local t = T.zeros({1}, "int64")
    t[1] = (1 << 62) + 1
    assert.equal((1 << 62) + 1, t[1])
    assert.equal((1 << 62) + 1, t:clone()[1])
  end)
end)

describe("views", function()
  it("narrow, select, view, transpose share storage", function()
    local a = T.arange(12, "float32"):view(3, 4)
    local row, col, nar, tr = a[2], a:select(2, 3), a:narrow(2, 2, 2), a:t()
    assert.same({4, 5, 6, 7}, row:totable())
    assert.same({2, 6, 10}, col:totable())
    assert.same({{1, 2}, {5, 6}, {9, 10}}, nar:totable())
    assert.same({4, 3}, tr:size())
    assert.is_false(tr:is_contiguous())
    tr[4][1] = 100
    assert.equal(100, a[1][4])
    nar:fill(0)
    assert.same({0, 0, 0, 0, 0, 0}, flat(nar))
    assert.equal(0, a[3][3])
    assert.is_true(a:is_same_storage(tr))
    assert.same({2, 2, 3}, a:view(2, -1, 3):size())
    assert.same({12}, a:view({12}):size())
  end)

  -- torch's slice assignment t[1:3] = v / t[:, 2] = 0 is written through a
  -- view; copy_ (torch's name) was a nil method
  it("slice assignment through views: narrow(d, s, n):copy_(src), select(d, i):fill_(v) land in the base", function()
    local rows, cols = 4, 5
    local want, src = {}, {}
    for i = 1, rows do want[i] = {} for j = 1, cols do want[i][j] = (i * 7 - j * 3) * 0.5 - 1 end end
    local a = T.tensor(want, "float64")
    for i = 1, 2 do src[i] = {} for j = 1, cols do src[i][j] = -(i * 11 + j * j) * 0.25 end end
    assert.equal(a, a:narrow(1, 2, 2):copy_(T.tensor(src, "float64")) and a) -- torch's a[1:3] = src
    for i = 1, 2 do want[i + 1] = {table.unpack(src[i])} end
    a:select(2, 4):fill_(-2.75)                                      -- torch's a[:, 3] = -2.75
    for i = 1, rows do want[i][4] = -2.75 end
    a:narrow(2, 1, 2):narrow(1, 4, 1):copy_(T.tensor({9.5, -8.25}, "float64")) -- a[3:4, 0:2] = v (v broadcast)
    want[4][1], want[4][2] = 9.5, -8.25
    assert.same(want, a:totable())
    local at = a:t()                                                 -- through a transposed view
    at:select(1, 5):copy_(T.tensor({-1.5, 2.25, -3.125, 4.0625}, "float64"))
    for i, v in ipairs({-1.5, 2.25, -3.125, 4.0625}) do want[i][5] = v end
    assert.same(want, a:totable())
    local ok, err = pcall(function() return a:narrow(1, 1, 2):copy_(T.zeros({3}, "float64")) end)
    assert.is_false(ok)
    assert.matches("^EINVAL: copy_: ", err)
  end)

  -- torch's unsqueeze, squeeze, flatten, permute and detach were nil methods
  it("unsqueeze, squeeze, flatten, permute (every order of 3 and 4 dims) and detach, as torch's", function()
    local x = T.arange(24, "float64"):sub(7.5):view(2, 3, 4)
    assert.same({2, 3, 4, 1}, x:unsqueeze(-1):size())
    assert.same({2, 1, 3, 4}, x:unsqueeze(2):size())
    assert.same({1, 3, 1}, T.zeros({1, 3, 1}):squeeze(2):size())
    assert.same({3, 1}, T.zeros({1, 3, 1}):squeeze(1):size())
    assert.same({3}, T.zeros({1, 3, 1}):squeeze():size())
    assert.same({2, 12}, x:flatten(2):size())
    assert.same({6, 4}, T.flatten(x, 1, 2):size())
    local xt = x:transpose(1, 3)  -- 4x3x2, not contiguous
    local f = xt:flatten()
    for i = 1, 4 do for j = 1, 3 do for k = 1, 2 do
      assert.equal(x[k][j][i], f[(i - 1) * 6 + (j - 1) * 2 + k])
    end end end
    assert.is_true(x:unsqueeze(1):is_same_storage(x))
    assert.equal(x, x:detach())
    -- every permutation of 3 and of 4 dims, against the definition r[i...] = x[i at p]
    local function perms(n)
      local out = {}
      local function go(p, used)
        if #p == n then out[#out + 1] = {table.unpack(p)} return end
        for d = 1, n do if not used[d] then used[d] = true; p[#p + 1] = d; go(p, used); p[#p] = nil; used[d] = nil end end
      end
      go({}, {})
      return out
    end
    local y = T.arange(120, "float64"):mul(-0.5):add(3.25):view(2, 3, 4, 5)
    for _, src in ipairs({x, y}) do
      local n = src:dim()
      for _, p in ipairs(perms(n)) do
        local r = src:permute(p)
        for i = 1, n do assert.equal(src:size(p[i]), r:size(i)) end
        local flat = r:contiguous():view(r:numel())
        local idx, k = {}, 0
        local function walk(d)
          if d > n then
            k = k + 1
            local at = {}
            for i = 1, n do at[p[i]] = idx[i] end
            assert.equal(src[at], flat[k], table.concat(p, ","))
            return
          end
          for i = 1, r:size(d) do idx[d] = i; walk(d + 1) end
        end
        walk(1)
      end
    end
    each_raises{
      {function() return x:permute(1, 1, 2) end, "^EINVAL: permute: dim 1 repeated"},
      {function() return x:permute(1, 2) end, "^EINVAL: permute: 2 dims given for a tensor of 3"},
      {function() return x:unsqueeze(5) end, "^EINVAL: unsqueeze: dim 5 out of range 1..4"},
      {function() return x:flatten(3, 2) end, "^EINVAL: flatten: start dim 3 after end dim 2"},
    }
  end)

  -- torch's out.argmax(dim=1) and x.clamp(min=0) ported as keyword tables were
  -- "bad argument #1 to 'argmax' (number expected, got table)"
  it("reductions and clamp take torch's keywords as a table: argmax{dim=}, sum{dim=, keepdim=}, clamp{min=}", function()
    local x = T.new({{1.5, -2.25, 3}, {-0.5, 4.75, -6}}, "float64")
    assert.same({3, 2}, x:argmax{dim = 2}:totable())
    assert.same({{3}, {2}}, x:argmax{dim = 2, keepdim = true}:totable())
    assert.same({2, 3}, x:argmin{dim = 2}:totable())
    assert.same({1, 2, 1}, x:argmax{dim = 1}:totable())
    assert.same({2.25, -1.75}, x:sum{dim = 2}:totable())
    assert.same({{1, 2.5, -3}}, x:sum{dim = 1, keepdim = true}:totable())
    local v, i = x:max{dim = 2}
    assert.same({3, 4.75}, v:totable())
    assert.same({3, 2}, i:totable())
    assert.same({{1.5, 0, 3}, {0, 4.75, 0}}, x:clamp{min = 0}:totable())
    assert.same({{1.5, -2.25, 2}, {-0.5, 2, -6}}, x:clamp{max = 2}:totable())
    assert.same({{1.5, -1, 2}, {-0.5, 2, -1}}, x:clone():clamp_{min = -1, max = 2}:totable())
    each_raises{
      {function() return x:argmax{axis = 2} end, "^EINVAL: argmax: unknown option 'axis'"},
      {function() return x:clamp{} end, "^EINVAL: clamp: at least one of min and max is needed"},
    }
  end)

  -- x.all(), x.any() and x.norm() were nil methods
  it("all, any and norm, over every element and along a dim", function()
    local x = T.new({{1.5, 0, -3}, {-0.5, 4.75, -6}}, "float64")
    assert.is_false(x:all())
    assert.is_true(x:any())
    assert.is_true(x:ne(100):all())
    assert.is_false(T.zeros({2, 2}):any())
    assert.same({true, false, true}, x:all(1):totable())
    assert.same({false, true}, x:all(2):totable())
    assert.same({{true}, {true}}, x:any(2, true):totable())
    local ss = 0
    for _, v in ipairs({1.5, 0, -3, -0.5, 4.75, -6}) do ss = ss + v * v end
    assert.is_true(math.abs(x:norm() - math.sqrt(ss)) < 1e-12)
    assert.is_true(math.abs(x:norm(1) - 15.75) < 1e-12)
    assert.equal(6, x:norm("inf"))
    local r = x:norm(2, 2)
    assert.is_true(math.abs(r[1] - math.sqrt(1.5 ^ 2 + 9)) < 1e-12 and math.abs(r[2] - math.sqrt(0.25 + 4.75 ^ 2 + 36)) < 1e-12)
    assert.is_true(math.abs(x:norm(3) - (1.5 ^ 3 + 27 + 0.125 + 4.75 ^ 3 + 216) ^ (1 / 3)) < 1e-12)
    local ok, err = pcall(function() return T.new({1, 2}, "int64"):norm() end)
    assert.is_false(ok)
    assert.matches("^EINVAL: norm: a float tensor is expected, got int64", err)
  end)

  it("view of a non-contiguous tensor fails, reshape and contiguous copy", function()
    local a = T.arange(6, "float32"):view(2, 3)
    local ok, err = pcall(function() return a:t():view(6) end)
    assert.is_false(ok)
    assert.matches("not contiguous", err)
    assert.same({0, 3, 1, 4, 2, 5}, a:t():reshape(6):totable())
    local c = a:t():contiguous()
    assert.is_true(c:is_contiguous())
    assert.is_false(c:is_same_storage(a))
  end)
end)

describe("copies and conversions", function()
  it("copy converts dtypes and checks shapes", function()
    local f = T.new({{1.5, -2.5}, {300, 4}})
    local i = T.zeros({2, 2}, "int32"):copy(f)
    assert.same({{1, -2}, {300, 4}}, i:totable())
    assert.same({1, 254, 44, 4}, flat(f:int():byte())) -- int to int wraps, as torch's
    assert.matches("^EINVAL: convert float32 to uint8: element 2 %(%-2%.5%) does not fit uint8", select(2, pcall(f.byte, f)))
    local ok, err = pcall(function() T.zeros({3}):copy(f) end)
    assert.is_false(ok)
    assert.matches("EINVAL: copy: shape mismatch, destination is 3, source is 2x2", err)
  end)

  it("to / float / double / long / half, clone is deep", function()
    local f = T.new({0.1, 1e-3})
    assert.equal("float64", f:double():dtype())
    assert.equal("int64", f:long():dtype())
    local h = f:half()
    assert.equal("float16", h:dtype())
    assert.is_true(math.abs(h[1] - 0.1) < 1e-4)
    assert.is_true(h:allclose(f, 1e-3, 0))
    local c = f:clone(); c[1] = 9
    assert.is_true(math.abs(f[1] - 0.1) < 1e-7)
    assert.equal(f, f:to("float32"))
  end)

  it("equal and allclose compare shapes and values", function()
    local a, b = T.new({1, 2, 3}), T.new({1, 2, 3.00001})
    assert.is_false(a:equal(b))
    assert.is_true(a:allclose(b))
    assert.is_false(a:allclose(b, 0, 1e-9))
    assert.is_false(a:equal(T.new({{1, 2, 3}})))
    assert.is_true(a:equal(T.new({1, 2, 3}, "int64")))
  end)

  it("bytes round-trip through from_bytes", function()
    local a = T.randn({3, 2}, {seed = 2, dtype = "float64"})
    local b = T.from_bytes("float64", {3, 2}, a:bytes())
    assert.is_true(a:equal(b))
    local ok, err = pcall(T.from_bytes, "float64", {3, 3}, a:bytes())
    assert.matches("48 bytes given", err)
  end)

  it("cat and stack", function()
    local a, b = T.new({{1, 2}}), T.new({{3, 4}})
    assert.same({{1, 2}, {3, 4}}, T.cat({a, b}):totable())
    assert.same({{1, 2, 3, 4}}, T.cat({a, b}, 2):totable())
    assert.same({2, 1, 2}, T.stack({a, b}):size())
    local ok, err = pcall(T.cat, {a, T.zeros(1, 3)})
    assert.matches("tensor 2 has size 3 in dim 2", err)
  end)

  -- the result took the first tensor's dtype: cat({int64, float32}) truncated
  -- 2.5 to 2, stack({int8, int64}) wrapped 300 to 44
  it("cat and stack promote mixed dtypes as torch does", function()
    local c = T.cat({T.new({1}, "int64"), T.new({2.5})})
    assert.are.equal("float32", c:dtype())
    assert.same({1, 2.5}, c:totable())
    local s = T.stack({T.new({1}, "int8"), T.new({300}, "int64")})
    assert.are.equal("int64", s:dtype())
    assert.same({{1}, {300}}, s:totable())
    assert.are.equal("int16", T.cat({T.new({200}, "uint8"), T.new({-5}, "int8")}):dtype())
    assert.same({200, -5}, T.cat({T.new({200}, "uint8"), T.new({-5}, "int8")}):totable())
    assert.are.equal("float32", T.cat({T.new({1}, "float16"), T.new({2}, "bfloat16")}):dtype())
    assert.are.equal("int64", T.cat({T.new({true}, "bool"), T.new({5}, "int64")}):dtype())
    assert.are.equal("float64", T.cat({T.new({1}), T.new({2}, "float64"), T.new({3}, "int32")}):dtype())
  end)
end)

describe("printing and lifetime", function()
  it("tostring prints the values and a torch-like footer", function()
    local s = tostring(T.new({{1, 2, 3}, {4, 5, 6}}))
    assert.matches("^ 1  2  3\n 4  5  6\n%[crun.Tensor float32 of size 2x3%]$", s)
    assert.matches("0.5000", tostring(T.new({0.5, 1})))
    assert.matches("%(2,.,.%) =", tostring(T.zeros(2, 2, 2)))
  end)

  it("a closed tensor raises when used", function()
    local a = T.zeros(2)
    a:close()
    local ok, err = pcall(function() return a:numel() end)
    assert.is_false(ok)
    assert.matches("tensor is closed", err)
    assert.equal("crun.Tensor (closed)", tostring(a))
  end)
end)

describe("fill", function()
  -- every dtype, contiguous and strided (a transposed and a narrowed view), zero,
  -- negative zero and a non-zero value; the untouched elements must keep theirs
  local crun = require "crun"
  local T = crun.tensor
  local dtypes = {"int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64", "bool"}
  for _, dt in ipairs(dtypes) do
    it("writes every element of " .. dt .. " tensors and views, and nothing else", function()
      local v = dt == "bool" and true or (dt == "uint8" and 7 or -3)
      local base = 1
      if dt == "bool" then base = false end
      local t = T.full({37, 29}, base, dt)
      t:fill(v)
      for _, row in ipairs(t:totable()) do for _, x in ipairs(row) do assert.are.equal(v, x) end end
      t:fill(0)
      local zero = 0
      if dt == "bool" then zero = false end
      for _, row in ipairs(t:totable()) do
        for _, x in ipairs(row) do assert.are.equal(zero, x) end
      end
      local u = T.full({37, 29}, base, dt)
      local w = u:transpose(1, 2):narrow(1, 3, 20)   -- rows 3..22 of the transpose: columns of u
      w:fill(v)
      local tab = u:totable()
      for i = 1, 37 do
        for j = 1, 29 do
          local want = (j >= 3 and j <= 22) and v or base
          assert.are.equal(want, tab[i][j], string.format("%s element (%d,%d)", dt, i, j))
        end
      end
    end)
  end

  -- the value went through a double: 2^53 + 1 became 2^53, maxinteger became 2^63 - 1024
  it("writes an integer past 2^53 into int64 tensors exactly (full, fill, full_like)", function()
    local M, big = math.maxinteger, (1 << 53) + 1
    assert.are.same({M, M}, T.full({2}, M, "int64"):totable())
    assert.are.same({big, big}, T.full({2}, big, "int64"):totable())
    local t = T.zeros({3, 2}, "int64")
    t:transpose(1, 2):fill(-big)
    assert.are.same({{-big, -big}, {-big, -big}, {-big, -big}}, t:totable())
    assert.are.same({math.mininteger}, T.full_like(T.zeros({1}, "int64"), math.mininteger):totable())
    assert.are.same({9007199254740992.0}, T.full({1}, big, "float64"):totable())
  end)
end)

describe("tensor errors", function()
  -- Calls f and returns its error text (the call must fail).
  local function err_of(f, ...)
    local ok, err = pcall(f, ...)
    assert.is_false(ok)
    return tostring(err)
  end

  it("start with the status name, from the Lua checks and from the bindings' own checks", function()
    local a = T.zeros({3, 4})
    local cases = {
      {err_of(T.cat, {}), "^EINVAL: bad argument #1 to 'cat' %(non%-empty list of tensors expected%)$"},
      {err_of(T.cat, {7}), "^EINVAL: bad argument #1 to 'cat' %(entry 1 is a number, tensor expected%)$"},
      {err_of(T.cat, {a, T.zeros({3, 4, 1})}), "^EINVAL: bad argument #1 to 'cat' %(tensor 2 has 3 dims"},
      {err_of(T.cat, {a, T.zeros({2, 5})}, 1), "^EINVAL: bad argument #1 to 'cat' %(tensor 2 has size 5 in dim 2"},
      {err_of(T.cat, {a}, 3), "^EINVAL: bad argument #2 to 'cat' %(dim 3 out of range for 2%-d tensors%)$"},
      {err_of(T.stack, {a}, "x"), "^EINVAL: bad argument #2 to 'stack' %(integer dim expected, got x%)$"},
      {err_of(T.exp, "x"), "^EINVAL: bad argument #1 to 'exp' %(tensor expected, got string%)$"},
      {err_of(function() return a[4] end), "^EINVAL: bad argument #2 to 'index' %(index 4 out of range for dim 1"},
      {err_of(function() return a:narrow(2, 3, 3) end),
       "^EINVAL: bad argument #3 to 'narrow' %(length 3 from 3 exceeds dim 2 of size 4%)$"},
      {err_of(T.zeros, {2}, "complex64"), "^EINVAL: bad argument #2 to '[%w.]*zeros' %(unknown dtype 'complex64'%)$"},
      {err_of(T.new, {{1, 2}, {3}}), "^EINVAL: bad argument #1 to '[%w.]*new' %(ragged nested table"},
      -- the first dtype was dropped: to("int32", "float64") gave float64
      {err_of(function() return a:to("int32", "float64") end),
       "^EINVAL: bad argument #3 to 'to' %(two dtypes given %('int32' and 'float64'%)%)"},
      -- lauxlib-style type checks of the bindings carry the status too
      {err_of(function() return a:narrow("x", 1, 1) end), "^EINVAL: bad argument #1 to 'narrow' %(number expected, got string%)$"},
      {err_of(function() return a:narrow(1.5, 1, 1) end),
       "^EINVAL: bad argument #1 to 'narrow' %(number has no integer representation%)$"},
      {err_of(function() return a:add({}) end), "^EINVAL: bad argument #1 to 'add' %(number expected, got table%)$"},
      {err_of(function() return a.select({}, 1, 1) end), "^EINVAL: bad argument #1 to '[%w.?]*' %(crun.Tensor expected, got table%)$"},
      -- another crun userdata (metatables are recognised by address: bindings/check.c)
      {err_of(function() return a.select(T.Generator(1), 1, 1) end),
       "^EINVAL: bad argument #1 to '[%w.?]*' %(crun.Tensor expected, got crun.Generator%)$"},
      {err_of(function() return a.select(io.stdout, 1, 1) end),
       "^EINVAL: bad argument #1 to '[%w.?]*' %(crun.Tensor expected, got FILE%*%)$"},
      {err_of(T.rand, {2}, {generator = a}), "crun.Generator expected, got crun.Tensor"},
      {err_of(T.arange, "x"), "^EINVAL: bad argument #1 to '[%w.]*arange' %(number expected"},
    }
    for i, c in ipairs(cases) do
      assert.matches(c[2], c[1], nil, false, "case " .. i .. ": " .. c[1])
    end
  end)
end)

describe("random factories' options", function()
  it("reject unknown keys naming the accepted ones and take torch's inert ones", function()
    local ok, err = pcall(T.randn, {2, 3}, {sed = 1})
    assert.is_false(ok)
    assert.are.equal("EINVAL: tensor.randn: unknown option 'sed' (accepted: device, dtype, generator, layout, "
      .. "pin_memory, requires_grad, seed)", err)
    ok, err = pcall(T.randint, 0, 5, {4}, {dtyp = "int32"})
    assert.is_false(ok)
    assert.matches("^EINVAL: tensor.randint: unknown option 'dtyp'", err)
    ok, err = pcall(T.rand, 2, 3, {gen = 1})
    assert.is_false(ok)
    assert.matches("^EINVAL: tensor.rand: unknown option 'gen'", err)
    local a = T.randn({2, 3}, {seed = 4, dtype = "float64", device = "cpu", requires_grad = false})
    local b = T.randn({2, 3}, {seed = 4, dtype = "float64"})
    assert.are.same(b:totable(), a:totable())
    assert.are.equal("int32", T.randint(-3, 3, {5}, {seed = 1, dtype = "int32"}):dtype())
    assert.are.same(T.rand(2, 2, {seed = 9}):totable(), T.rand({2, 2}, {seed = 9}):totable())
  end)
end)

describe("libraries", function()
  -- cuBLAS is opened at the first GEMM on a device (runtime/cuda/gemm.cu):
  -- mapping it costs every process ~95 MiB of private memory and ~160 ms
  it("a CPU-only process maps OpenBLAS at its first matmul and never cuBLAS", function()
    local function mapped(name)
      for line in io.lines("/proc/self/maps") do
        if line:find(name, 1, true) then return true end
      end
      return false
    end
    local a = T.ones({8, 8})
    assert.are.equal(64 * 8, a:matmul(a):sum())
    assert.is_true(mapped("libopenblas"), "OpenBLAS should be mapped after a matmul")
    assert.is_false(mapped("libcublas"), "cuBLAS is mapped in a process that never used a GPU")
  end)
end)

describe("garbage collection", function()
  -- Lua sees a tensor as a small box; crun counts the storage's bytes as
  -- allocation debt (bindings/tensor.c), so a loop of big temporaries does
  -- not hold hundreds of dead ones before a cycle runs
  -- (in the incremental mode crun-lua runs; lua5.4's standalone interpreter
  -- turns on the generational mode, where a temporary still referenced at
  -- two collections becomes old and waits for a major one)
  it("paces Lua's collector by tensor bytes", function()
    local mode = collectgarbage("incremental")
    finally(function() collectgarbage(mode) end)
    collectgarbage("collect")
    local alive = setmetatable({}, {__mode = "k"})
    for i = 1, 200 do
      local tmp = T.full({256, 1024}, i, "float32") -- 1 MiB of float32
      alive[tmp] = true
    end
    local n = 0
    for _ in pairs(alive) do n = n + 1 end
    assert.is_true(n < 60, n .. " of 200 dead 1 MiB temporaries are still alive")
  end)
end)
