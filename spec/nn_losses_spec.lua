-- crun.nn's element-wise losses (L1, SmoothL1, BCE, BCEWithLogits): forward
-- against per-element formulas written out in plain Lua, backward against
-- their hand-derived derivatives and finite differences (float64), for
-- every reduction.
local nn = require "crun.nn"
local each_raises = require("helpers.common").each_raises
local T = require "crun.tensor"

local function sigmoid(v) return 1 / (1 + math.exp(-v)) end
local function clamped_log(v) return math.max(math.log(v), -100) end

-- Per-element loss f(x, t, k) and derivative df(x, t, k) of each loss (k:
-- element index, for the per-element pos_weight), in the textbook form.
local REF = {
  L1Loss = {f = function(x, t) return math.abs(x - t) end,
            df = function(x, t) return x > t and 1 or x < t and -1 or 0 end},
  SmoothL1Loss = { -- beta 0.75
    f = function(x, t) local d = math.abs(x - t) return d < 0.75 and 0.5 * d * d / 0.75 or d - 0.5 * 0.75 end,
    df = function(x, t) local d = x - t
      if math.abs(d) < 0.75 then return d / 0.75 end
      return d > 0 and 1 or -1
    end},
  BCELoss = {f = function(x, t) return -(t * clamped_log(x) + (1 - t) * clamped_log(1 - x)) end,
             df = function(x, t) return (x - t) / math.max(x * (1 - x), 1e-12) end},
  BCEWithLogitsLoss = { -- pos_weight per element: {2.5, 0.5, 1, ...} cycling over 3 classes
    f = function(x, t, k) local pw = ({2.5, 0.5, 1.25})[(k - 1) % 3 + 1]
      return -(pw * t * math.log(sigmoid(x)) + (1 - t) * math.log(1 - sigmoid(x)))
    end,
    df = function(x, t, k) local pw = ({2.5, 0.5, 1.25})[(k - 1) % 3 + 1]
      return -(pw * t * (1 - sigmoid(x)) - (1 - t) * sigmoid(x))
    end},
}

local function make(name, reduction)
  local o = {reduction = reduction}
  if name == "SmoothL1Loss" then o.beta = 0.75 end
  if name == "BCEWithLogitsLoss" then o.pos_weight = T.tensor({2.5, 0.5, 1.25}, "float64") end
  return nn[name](o)
end

-- Inputs (2x3, float64) for each loss: signed, non-periodic, away from kinks.
local X = {
  L1Loss = {{1.5, -2.25, 0.375}, {-4.0, 3.125, -0.0625}},
  SmoothL1Loss = {{1.5, -2.25, 0.375}, {-4.0, 3.125, -0.0625}},
  BCELoss = {{0.125, 0.8125, 0.46875}, {0.9375, 0.03125, 0.625}},
  BCEWithLogitsLoss = {{1.5, -2.25, 0.375}, {-4.0, 3.125, -0.0625}},
}
local TGT = {
  L1Loss = {{-0.5, 1.25, 0.75}, {-3.5, 2.0, 0.4}},
  SmoothL1Loss = {{-0.5, -2.0, 0.75}, {-3.5, 2.0, 0.4}},
  BCELoss = {{0.0, 1.0, 0.25}, {1.0, 0.0, 0.7}},
  BCEWithLogitsLoss = {{0.0, 1.0, 0.25}, {1.0, 0.0, 0.7}},
}

-- Flattens a 2-d table.
local function flat(m)
  local r = {}
  for _, row in ipairs(m) do for _, v in ipairs(row) do r[#r + 1] = v end end
  return r
end

describe("nn element-wise losses", function()
  for name, ref in pairs(REF) do
    it(name .. ": forward, backward and finite differences for mean, sum and none", function()
      local xs, ts = flat(X[name]), flat(TGT[name])
      local x, t = T.tensor(X[name], "float64"), T.tensor(TGT[name], "float64")
      local sum, per, der = 0, {}, {}
      for k = 1, #xs do
        per[k], der[k] = ref.f(xs[k], ts[k], k), ref.df(xs[k], ts[k], k)
        sum = sum + per[k]
      end
      local n = #xs
      -- mean and sum
      local c = make(name)
      assert.near(sum / n, c:forward(x, t), 1e-12)
      local g = flat(c:backward(x, t):totable())
      for k = 1, n do assert.near(der[k] / n, g[k], 1e-12, name .. " mean grad " .. k) end
      c = make(name, "sum")
      assert.near(sum, c:forward(x, t), 1e-12)
      g = flat(c:backward(x, t):totable())
      for k = 1, n do assert.near(der[k], g[k], 1e-12, name .. " sum grad " .. k) end
      -- finite differences of the sum
      for k = 1, n do
        local h, xp, xm = 1e-6, {table.unpack(xs)}, {table.unpack(xs)}
        xp[k], xm[k] = xs[k] + h, xs[k] - h
        local fd = (c:forward(T.tensor(xp, "float64"):view(2, 3), t) - c:forward(T.tensor(xm, "float64"):view(2, 3), t)) / (2 * h)
        assert.near(fd, der[k], 1e-5 * math.max(1, math.abs(fd)), name .. " fd " .. k)
      end
      -- none: the per-element losses, and backward through grad_loss
      c = make(name, "none")
      local l = c:forward(x, t)
      assert.same({2, 3}, l:size())
      local lv = flat(l:totable())
      for k = 1, n do assert.near(per[k], lv[k], 1e-12) end
      local r = {0.5, -1.25, 2.0, 0.125, -0.375, 1.75}
      g = flat(c:backward(x, t, T.tensor(r, "float64"):view(2, 3)):totable())
      for k = 1, n do assert.near(r[k] * der[k], g[k], 1e-12, name .. " none grad " .. k) end
      local ok, err = pcall(function() return c:backward(x, t) end)
      assert.is_false(ok)
      assert.matches("^EINVAL: %w+Criterion:backward: reduction = \"none\" needs the gradient", err)
    end)
  end

  it("float32 inputs give float32 gradients; the mean of no elements is nan", function()
    local x, t = T.tensor({0.25, -1.5}), T.tensor({1.0, 0.0})
    local g = nn.BCEWithLogitsLoss():backward(x, t)
    assert.equal("float32", g:dtype())
    assert.near((sigmoid(0.25) - 1) / 2, g[1], 1e-7)
    local v = nn.L1Loss():forward(T.zeros({0, 2}), T.zeros({0, 2}))
    assert.is_true(v ~= v)
    assert.equal(0, nn.L1Loss{reduction = "sum"}:forward(T.zeros({0, 2}), T.zeros({0, 2})))
  end)

  -- torch's BCELoss clamps each log at -100: x = 0 or 1 gives a finite loss
  it("BCELoss clamps the logs at -100 and refuses inputs outside [0, 1]", function()
    local c = nn.BCELoss{reduction = "none"}
    local x, t = T.tensor({0.0, 1.0, 0.0, 1.0}, "float64"), T.tensor({1.0, 0.0, 0.0, 1.0}, "float64")
    assert.same({100, 100, 0, 0}, c:forward(x, t):totable())
    local g = nn.BCELoss{reduction = "sum"}:backward(x, t):totable()
    assert.same({-1e12, 1e12, 0, 0}, g) -- (x - t) / max(x (1 - x), 1e-12)
    for _, bad in ipairs({1.25, -0.5, 0 / 0}) do
      local ok, err = pcall(function() return nn.BCELoss():forward(T.tensor({0.5, bad}), T.tensor({1.0, 0.0})) end)
      assert.is_false(ok)
      assert.matches("^EINVAL: BCECriterion:forward: every element of the input must be between 0 and 1", err)
    end
  end)

  it("BCEWithLogitsLoss stays finite for large logits; weight scales each element", function()
    local x, t = T.tensor({300.0, -300.0, 300.0, -250.0}, "float64"), T.tensor({0.0, 1.0, 1.0, 0.0}, "float64")
    -- far from 0, log(1 + exp(-|x|)) is 0: loss = max(x, 0) - x t
    local l = nn.BCEWithLogitsLoss{reduction = "none"}:forward(x, t):totable()
    assert.same({300, 300}, {l[1], l[2]}) -- (sigmoid(-300) is 0 in double: the naive form gives inf)
    assert.is_true(l[3] >= 0 and l[3] < 1e-100 and l[4] >= 0 and l[4] < 1e-100)
    local g0 = nn.BCEWithLogitsLoss{reduction = "sum"}:backward(x, t):totable() -- sigmoid(x) - t
    assert.same({1, -1, 0}, {g0[1], g0[2], g0[3]})
    assert.is_true(g0[4] > 0 and g0[4] < 1e-100)
    local w = T.tensor({0.5, -2.0, 3.0, 1.5}, "float64")
    local xs, ts = {0.75, -1.25, 2.5, -0.125}, {1.0, 0.0, 0.25, 0.6}
    local c = nn.BCEWithLogitsLoss{weight = w, reduction = "sum"}
    local want, grad = 0, {}
    for k = 1, 4 do
      local wk, s = w[k], sigmoid(xs[k])
      want = want - wk * (ts[k] * math.log(s) + (1 - ts[k]) * math.log(1 - s))
      grad[k] = wk * (s - ts[k])
    end
    local xt, tt = T.tensor(xs, "float64"), T.tensor(ts, "float64")
    assert.near(want, c:forward(xt, tt), 1e-12)
    local g = c:backward(xt, tt):totable()
    for k = 1, 4 do assert.near(grad[k], g[k], 1e-12) end
    local b = nn.BCELoss{weight = w, reduction = "mean"}
    local p = xt:sigmoid()
    assert.near(want / 4, b:forward(p, tt), 1e-12)
  end)

  it("SmoothL1Loss with beta 0 is the L1 loss; names, options and bad input", function()
    local x, t = T.tensor({1.5, -0.25, 3.0}, "float64"), T.tensor({-0.5, 0.5, 3.0}, "float64")
    assert.near(2 + 0.75, nn.SmoothL1Loss{beta = 0, reduction = "sum"}:forward(x, t), 1e-12)
    assert.same({1, -1, 0}, nn.SmoothL1Loss{beta = 0, reduction = "sum"}:backward(x, t):totable())
    -- beta 1 (torch's default): 0.5 d^2 below 1, |d| - 0.5 above
    assert.near((2 - 0.5) + 0.5 * 0.75 ^ 2, nn.SmoothL1Loss{reduction = "sum"}:forward(x, t), 1e-12)
    assert.equal(nn.AbsCriterion, nn.L1Loss)
    assert.equal(nn.SmoothL1Criterion, nn.SmoothL1Loss)
    assert.equal(nn.BCECriterion, nn.BCELoss)
    assert.equal(nn.BCEWithLogitsCriterion, nn.BCEWithLogitsLoss)
    local cases = {
      {function() nn.SmoothL1Loss{beta = -1} end, "^EINVAL: nn.SmoothL1Criterion: beta must be a number >= 0, got %-1"},
      {function() nn.L1Loss{reduction = "avg"} end, "^EINVAL: nn.AbsCriterion: reduction must be \"mean\", \"sum\" or \"none\""},
      {function() nn.BCELoss{size_average = true} end, "^EINVAL: nn.BCECriterion: unknown option 'size_average'"},
      {function() nn.BCEWithLogitsLoss{pos_weight = 2} end,
       "^EINVAL: nn.BCEWithLogitsCriterion: pos_weight must be a tensor, got number"},
      {function() nn.L1Loss():forward(T.zeros({4, 1}), T.zeros({4})) end,
       "^EINVAL: AbsCriterion:forward: the target's shape 4 differs from the input's 4x1"},
      {function() nn.L1Loss():forward(T.zeros({2}, "int64"), T.zeros({2}, "int64")) end,
       "^EINVAL: AbsCriterion:forward: the input must be a float tensor, got int64"},
      {function() nn.BCELoss{reduction = "none"}:backward(x:sigmoid(), t:clamp(0, 1), T.zeros({3})) end,
       "^ESTATE: BCECriterion:backward called before forward"},
    }
    each_raises(cases)
  end)
end)
