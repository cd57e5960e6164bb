-- crun.tensor's element-wise selection: T.where, masked_fill(_), unique.
-- Expected values come from plain Lua loops over the same inputs.
local T = require "crun.tensor"

local nan, inf = 0 / 0, math.huge

-- a[i] or b[i] by c[i], over Lua lists (nan compared as "nan").
local function pick(c, a, b)
  local r = {}
  for i = 1, #c do r[i] = c[i] and a[i] or b[i] end
  return r
end

-- A list with nan and inf written as strings, so that assert.same can compare them.
local function shown(list)
  local r = {}
  for i, v in ipairs(list) do r[i] = v ~= v and "nan" or v == inf and "inf" or v == -inf and "-inf" or v end
  return r
end

describe("T.where", function()
  -- torch.where(cond, a, b) had no crun counterpart; a * c + b * (1 - c)
  -- turns inf and nan into nan where they are not picked
  it("picks a or b by a bool condition, keeping inf and nan (a select, not arithmetic)", function()
    local cv = {true, false, false, true, true, false, true}
    local av = {1.5, nan, -inf, -2.25, inf, 7.125, 0.0}
    local bv = {-3.5, 4.75, 2.0, nan, -0.5, inf, -9.0}
    for _, dt in ipairs({"float32", "float64"}) do
      local r = T.where(T.tensor(cv), T.tensor(av, dt), T.tensor(bv, dt))
      assert.equal(dt, r:dtype())
      assert.same(shown(pick(cv, av, bv)), shown(r:totable()), dt)
    end
    local iv, jv = {7, -3, 12, -40, 5, 2, -1}, {-8, 6, -11, 9, 0, -2, 33}
    for _, dt in ipairs({"int64", "int32", "int16", "int8", "uint8", "bool"}) do
      local a, b = T.tensor(iv):to(dt), T.tensor(jv):to(dt)
      local r = T.where(T.tensor(cv), a, b)
      assert.equal(dt, r:dtype())
      assert.same(pick(cv, a:totable(), b:totable()), r:totable(), dt)
    end
  end)

  it("broadcasts the condition and both values with numpy's rules", function()
    local cond = T.tensor({{true}, {false}, {true}})              -- 3x1
    local a = T.tensor({{-1.5, 2.5, -3.25, 4.0}}, "float64")       -- 1x4
    local b = T.tensor({{10.5}, {-20.25}, {30.0}}, "float64")      -- 3x1
    local r = T.where(cond, a, b)
    assert.same({3, 4}, r:size())
    local cv, av, bv = {true, false, true}, a:totable()[1], {10.5, -20.25, 30.0}
    for i = 1, 3 do
      for j = 1, 4 do assert.equal(cv[i] and av[j] or bv[i], r[i][j], i .. "," .. j) end
    end
    local ok, err = pcall(T.where, T.tensor({true, false}), T.zeros({3}), T.zeros({3}))
    assert.is_false(ok)
    assert.matches("^EINVAL: where: shapes .* cannot be broadcast", err)
    assert.same({0, 4}, T.where(T.zeros({0, 1}, "bool"), a, 1.0):size())
  end)

  it("takes numbers for a and b and gives torch's result dtype", function()
    local c = T.tensor({true, false, true, false})
    local ints = T.tensor({5, -6, 7, -8})
    local r = T.where(c, ints, 0.5)
    assert.equal("float32", r:dtype())
    assert.same({5, 0.5, 7, 0.5}, r:totable())
    r = T.where(c, T.tensor({5, -6, 7, -8}, "int32"), -9)
    assert.equal("int32", r:dtype())
    assert.same({5, -9, 7, -9}, r:totable())
    r = T.where(c, -1.5, 2)
    assert.equal("float32", r:dtype())
    assert.same({-1.5, 2, -1.5, 2}, r:totable())
    assert.equal("int64", T.where(c, 3, -4):dtype())
    r = T.where(c, ints, T.tensor({0.25, -0.75, 1.5, 2.0}, "float64"))
    assert.equal("float64", r:dtype())
    assert.same({5, -0.75, 7, 2.0}, r:totable())
    assert.same({-1, -6, -1, -8}, ints:where(T.tensor({false, true, false, true}), -1):totable()) -- (torch's x.where(c, y))
  end)

  -- torch.where(cond) (the indices of the non-zero elements) was ENOTSUP
  it("with one argument gives the 1-based indices of the non-zero elements, one int64 tensor per dim", function()
    local xv = {{{0.5, 0, -2.25}, {0, 0, 7}}, {{-0.125, 3, 0}, {0 / 0, 0, -1}}} -- nan is non-zero, as torch's
    local want = {{}, {}, {}}
    for i = 1, 2 do for j = 1, 2 do for k = 1, 3 do
      if xv[i][j][k] ~= 0 then want[1][#want[1] + 1], want[2][#want[2] + 1], want[3][#want[3] + 1] = i, j, k end
    end end end
    local x = T.tensor(xv, "float64")
    local r = table.pack(T.where(x))
    assert.equal(3, r.n)
    for d = 1, 3 do
      assert.equal("int64", r[d]:dtype())
      assert.same(want[d], r[d]:totable())
    end
    local b = table.pack(T.where(x:lt(0)))               -- a bool condition, as the usual torch.where(x < 0)
    assert.same({{1, 2, 2}, {1, 1, 2}, {3, 1, 3}}, {b[1]:totable(), b[2]:totable(), b[3]:totable()})
    -- x[where] read back through the indices gives the non-zero values in order
    for n = 1, #want[1] do assert.not_equal(0, xv[want[1][n]][want[2][n]][want[3][n]]) end
    -- nonzero: the same as an [n, dims] matrix; {as_tuple = true} as where
    local nz = x:nonzero()
    assert.same({#want[1], 3}, nz:size())
    for n = 1, #want[1] do assert.same({want[1][n], want[2][n], want[3][n]}, nz[n]:totable()) end
    local tv = table.pack(T.tensor({0, -3, 0, 5, 9}):nonzero({as_tuple = true}))
    assert.equal(1, tv.n)
    assert.same({2, 4, 5}, tv[1]:totable())
    -- nothing non-zero: empty index tensors; a 0-d tensor counts as one element
    local e = table.pack(T.where(T.zeros({2, 3}, "bool")))
    assert.same({{0}, {0}}, {e[1]:size(), e[2]:size()})
    assert.same({0, 2}, T.zeros({2, 3}):nonzero():size())
    assert.same({1}, T.where(T.tensor(true)):totable())
    assert.same({0}, T.where(T.tensor(0.0)):size())
  end)

  it("refuses a non-bool condition, a missing value and a bad value with clear errors", function()
    local x = T.tensor({1.5, -2.5})
    local ok, err = pcall(T.where, T.tensor({1, 0}), x, x)
    assert.matches("^EINVAL: where: the condition must be a bool tensor, got int64", err)
    ok, err = pcall(T.where, x:gt(0), x)
    assert.is_false(ok)
    assert.matches("^EINVAL: bad argument #3 to 'where' %(tensor or number expected, got nil%)", err)
    ok, err = pcall(T.where, x:gt(0), x, "zero")
    assert.matches("^EINVAL: bad argument #3 to 'where' %(tensor or number expected, got string%)", err)
    ok, err = pcall(T.where, true, x, x)
    assert.matches("^EINVAL: bad argument #1 to 'where' %(bool tensor expected", err)
  end)
end)

describe("masked_fill", function()
  it("writes the value where the mask is true, also inf and nan, and keeps nan elsewhere", function()
    local xv = {2.5, nan, -inf, -1.25, 6.0}
    local mv = {false, true, false, true, false}
    local x = T.tensor(xv, "float64")
    local want = {}
    for i, v in ipairs(xv) do want[i] = mv[i] and 0 or v end
    assert.same(shown(want), shown(x:masked_fill(T.tensor(mv), 0):totable()))
    assert.same(shown(xv), shown(x:totable())) -- (a copy: x unchanged)
    for i, v in ipairs(xv) do want[i] = mv[i] and -inf or v end
    assert.same(shown(want), shown(x:masked_fill(T.tensor(mv), -inf):totable()))
    for i, v in ipairs(xv) do want[i] = mv[i] and nan or v end
    assert.same(shown(want), shown(T.masked_fill(x, T.tensor(mv), T.tensor(nan)):totable()))
    -- the attention-mask idiom: scores:masked_fill(mask, -inf) then softmax
    local s = T.tensor({{0.5, -1.0, 2.0}, {1.5, 0.25, -0.75}})
    local mask = T.tensor({{false, false, true}, {false, true, true}})
    local p = s:masked_fill(mask, -inf):softmax(2)
    local e1, e2 = math.exp(0.5), math.exp(-1.0)
    assert.near(e1 / (e1 + e2), p[1][1], 1e-6)
    assert.same({1, 0, 0}, p[2]:totable())
  end)

  it("converts the value to the tensor's dtype and masked_fill_ writes in place", function()
    local a = T.tensor({4, -5, 6, -7})
    local m = T.tensor({true, false, false, true})
    local r = a:masked_fill(m, 2.5)
    assert.equal("int64", r:dtype())
    assert.same({2, -5, 6, 2}, r:totable()) -- truncated, as torch's
    assert.equal(a, a:masked_fill_(m, -9))
    assert.same({-9, -5, 6, -9}, a:totable())
    local b = T.tensor({{1.5, -2.5}, {3.5, -4.5}}, "float64")
    b:masked_fill_(T.tensor({false, true}), 0.125) -- the mask broadcasts over rows
    assert.same({{1.5, 0.125}, {3.5, 0.125}}, b:totable())
    local ok, err = pcall(function() return T.tensor({1.5, 2.5}):masked_fill_(T.tensor({{true, false}, {false, true}}), 0) end)
    assert.is_false(ok)
    assert.matches("^EINVAL: masked_fill_: the mask's shape 2x2 does not broadcast to the tensor's 2", err)
    ok, err = pcall(function() return T.tensor({1.5, 2.5}):masked_fill(T.tensor({1, 0}), 0) end)
    assert.matches("^EINVAL: where: the condition must be a bool tensor, got int64", err)
  end)
end)

-- t[mask] raised "integer index expected, got userdata" and masked_select /
-- masked_scatter_ were nil methods
describe("boolean-mask indexing", function()
  local xv = {{1.5, -2.25, 3.125}, {-4.5, 5.75, -6.0625}}
  local mv = {{true, false, true}, {false, true, true}}

  -- the elements of xv where mv is true, row-major (a plain loop)
  local function selected()
    local r = {}
    for i = 1, 2 do for j = 1, 3 do if mv[i][j] then r[#r + 1] = xv[i][j] end end end
    return r
  end

  it("t[mask] and masked_select give the selected elements as a 1-d tensor, in row-major order", function()
    local x, m = T.tensor(xv, "float64"), T.tensor(mv)
    assert.same(selected(), x[m]:totable())
    assert.same(selected(), x:masked_select(m):totable())
    assert.same(selected(), T.masked_select(x, m):totable())
    -- masked_select broadcasts the mask (here a column) as torch's
    local col = T.tensor({{false}, {true}})
    assert.same(xv[2], x:masked_select(col):totable())
    -- a mask over the leading dims selects whole rows (torch's x[rowmask])
    assert.same({xv[2]}, x[T.tensor({false, true})]:totable())
    assert.same({0, 3}, x[T.tensor({false, false})]:size())
    assert.same({0}, x[T.zeros({2, 3}, "bool")]:size())
  end)

  it("t[mask] = v writes a number, or the values of a tensor in order, into t (also through a view)", function()
    local x, m = T.tensor(xv, "float64"), T.tensor(mv)
    x[m] = -9.5
    local want = {}
    for i = 1, 2 do want[i] = {} for j = 1, 3 do want[i][j] = mv[i][j] and -9.5 or xv[i][j] end end
    assert.same(want, x:totable())
    local vals, k = {}, #selected()
    for n = 1, k do vals[n] = n * 1.25 - 7 end
    x = T.tensor(xv, "float64")
    x[m] = T.tensor(vals, "float64")
    local n = 0
    for i = 1, 2 do for j = 1, 3 do if mv[i][j] then n = n + 1; want[i][j] = vals[n] end end end
    assert.same(want, x:totable())
    -- masked_scatter_ is the same, taking the first values of a longer source
    local y = T.tensor(xv, "float64")
    table.insert(vals, 99.5)
    assert.equal(y, y:masked_scatter_(m, T.tensor(vals, "float64")))
    assert.same(want, y:totable())
    -- a row mask with a row value (broadcast), written through a transposed view into its base
    local base = T.tensor(xv, "float64")
    local view = base:t()                                    -- 3 x 2
    view[T.tensor({true, false, true})] = T.tensor({0.5, -0.25}, "float64")
    assert.same({{0.5, -2.25, 0.5}, {-0.25, 5.75, -0.25}}, base:totable())
  end)

  it("refuses a non-bool index, a mask of the wrong shape and a short source with clear errors", function()
    local x = T.tensor(xv, "float64")
    local ok, err = pcall(function() return x[T.tensor({1, 2})] end)
    assert.is_false(ok)
    assert.matches("^EINVAL: t%[index%]: indexing by an int64 tensor .*index_select", err)
    ok, err = pcall(function() return x[T.tensor({true, false, true})] end)
    assert.is_false(ok)
    assert.matches("^EINVAL: t%[mask%]: the mask's shape 3 does not match the tensor's leading dims 2x3", err)
    ok, err = pcall(function() x[T.tensor(mv)] = T.tensor({1.5, 2.5}, "float64") end)
    assert.is_false(ok)
    assert.matches("^EINVAL: t%[mask%] = v: v's shape 2 does not broadcast to the 4 selected elements", err)
    ok, err = pcall(function() x[T.tensor(mv)] = "one" end)
    assert.is_false(ok)
    assert.matches("^EINVAL: t%[mask%] = v: v must be a number, a boolean or a tensor, got string", err)
    ok, err = pcall(function() return x:masked_scatter_(T.tensor(mv), T.tensor({1.5}, "float64")) end)
    assert.is_false(ok)
    assert.matches("^EINVAL: masked_scatter_: the source has 1 elements, the mask selects 4", err)
    ok, err = pcall(function() return x:masked_select(T.tensor({1, 0, 1})) end)
    assert.is_false(ok)
    assert.matches("^EINVAL: masked_select: the mask must be a bool tensor, got int64", err)
  end)
end)

describe("unique", function()
  it("gives the sorted distinct values, and with the options the inverse and the counts", function()
    local xv = {{3, -1, 7, 3}, {-1, 12, 3, -8}}
    local x = T.tensor(xv)
    -- expected from a plain count
    local seen, vals = {}, {}
    for _, row in ipairs(xv) do for _, v in ipairs(row) do
      if not seen[v] then seen[v] = 0; vals[#vals + 1] = v end
      seen[v] = seen[v] + 1
    end end
    table.sort(vals)
    local pos, counts = {}, {}
    for i, v in ipairs(vals) do pos[v], counts[i] = i, seen[v] end
    local inverse = {}
    for i, row in ipairs(xv) do inverse[i] = {} for j, v in ipairs(row) do inverse[i][j] = pos[v] end end
    local u = x:unique()
    assert.equal("int64", u:dtype())
    assert.same(vals, u:totable())
    local u2, inv, cnt = T.unique(x, {return_inverse = true, return_counts = true})
    assert.same(vals, u2:totable())
    assert.same(inverse, inv:totable())
    assert.same(counts, cnt:totable())
    local _, c2 = x:unique({return_counts = true})
    assert.same(counts, c2:totable())
    -- x[inverse] rebuilds x (1-based positions, as crun's index_select)
    assert.same(xv, u:index_select(1, inv:view(8)):view(2, 4):totable())
  end)

  it("handles floats, nan (each nan its own value, last) and empty tensors", function()
    local u = T.tensor({2.5, nan, -0.5, 2.5, nan}, "float64"):unique()
    assert.same({-0.5, 2.5, "nan", "nan"}, shown(u:totable()))
    assert.same({0}, T.zeros({0, 3}):unique():size())
  end)

  -- unique{dim=} was ENOTSUP
  it("along a dim gives the distinct rows (columns), sorted, with torch's inverse and counts", function()
    local rv = {{3, -1, 7}, {-2, 5, 0}, {3, -1, 7}, {3, -1, -4}, {-2, 5, 0}, {-2, 5, 0}}
    -- expected: the distinct rows, sorted by a plain lexicographic compare
    local function less(a, b)
      for j = 1, #a do if a[j] ~= b[j] then return a[j] < b[j] end end
      return false
    end
    local vals = {}
    for _, r in ipairs(rv) do
      local seen = false
      for _, v in ipairs(vals) do if not less(v, r) and not less(r, v) then seen = true end end
      if not seen then vals[#vals + 1] = r end
    end
    table.sort(vals, less)
    local inverse, counts = {}, {}
    for i, r in ipairs(rv) do
      for k, v in ipairs(vals) do
        if not less(v, r) and not less(r, v) then inverse[i], counts[k] = k, (counts[k] or 0) + 1 end
      end
    end
    local x = T.tensor(rv, "int32")
    local u, inv, cnt = T.unique(x, {dim = 1, return_inverse = true, return_counts = true})
    assert.equal("int32", u:dtype())
    assert.same(vals, u:totable())
    assert.same(inverse, inv:totable())
    assert.same(counts, cnt:totable())
    -- columns: dim 2 of the transpose (also -1) gives the transposed rows
    local uc, invc = x:t():unique({dim = -1, return_inverse = true})
    assert.same(vals, uc:t():totable())
    assert.same(inverse, invc:totable())
    -- floats of a 3-d tensor along its middle dim; u:index_select(dim, inverse) rebuilds x
    local f = T.tensor({{{0.5, -1.5}, {2.25, 0}, {0.5, -1.5}}, {{-3, 4}, {1, 1}, {-3, 4}}}, "float64")
    local uf, invf = f:unique({dim = 2, return_inverse = true})
    assert.same({2, 2, 2}, uf:size())
    assert.same({{{0.5, -1.5}, {2.25, 0}}, {{-3, 4}, {1, 1}}}, uf:totable())
    assert.same(f:totable(), uf:index_select(2, invf):totable())
    local ok, err = pcall(function() return x:unique({dim = 3}) end)
    assert.is_false(ok)
    assert.matches("^EINVAL: unique: dim 3 out of range", err)
  end)
end)
