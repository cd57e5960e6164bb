-- crun.nn image/sequence layers (Conv2d, MaxPool2d, AvgPool2d, Flatten,
-- BatchNorm1d/2d, SyncBatchNorm, LayerNorm, Embedding): forward values
-- against plain-Lua loops written from the definitions, float64
-- finite-difference gradient checks, running statistics and buffers, and
-- SyncBatchNorm on 2-4 ranks against BatchNorm on the concatenated batch.
local nn = require "crun.nn"
local each_raises = require("helpers.common").each_raises
local util = require "helpers.train_util"
local torch_ref = require "helpers.torch_ref"
local T = util.T()

local TOL = 1e-6

local function randn(shape, seed) return T.randn(shape, {seed = seed, dtype = "float64"}) end

-- Checks d(sum(m(x) .* r))/dx and /dparams against central differences.
local function gradcheck(m, x, opts)
  opts = opts or {}
  local out = m:forward(x)
  local r = randn(out:size(), opts.seed or 99)
  local function f() return util.dot(m:forward(x), r) end
  m:forward(x)
  m:zero_grad()
  local gx = m:backward(x, r)
  gx = gx and gx:clone()
  local params, grads = m:parameters()
  local gcopy = {}
  for i, g in ipairs(grads) do gcopy[i] = g:clone() end
  if not opts.no_input then
    local e = util.max_rel_err(gx, util.numgrad(f, x))
    assert.is_true(e < TOL, "gradInput off by " .. e)
  end
  for i, p in ipairs(params) do
    local e = util.max_rel_err(gcopy[i], util.numgrad(f, p))
    assert.is_true(e < TOL, "gradient of parameter " .. i .. " off by " .. e)
  end
end

-- Element (n, c, h, w) (1-based) of a contiguous 4-d tensor's flat list.
local function at4(list, d, n, c, h, w) return list[(((n - 1) * d[2] + c - 1) * d[3] + h - 1) * d[4] + w] end

-- Direct convolution from the definition.
local function conv_ref(x, w, b, s, p, dl)
  local xd, wd, xl, wl = x:size(), w:size(), util.list(x), util.list(w)
  local oh = (xd[3] + 2 * p[1] - dl[1] * (wd[3] - 1) - 1) // s[1] + 1
  local ow = (xd[4] + 2 * p[2] - dl[2] * (wd[4] - 1) - 1) // s[2] + 1
  local out = {}
  for n = 1, xd[1] do
    for o = 1, wd[1] do
      for y = 1, oh do
        for z = 1, ow do
          local acc = b and b[o] or 0
          for c = 1, xd[2] do
            for i = 1, wd[3] do
              for j = 1, wd[4] do
                local iy, ix = (y - 1) * s[1] - p[1] + (i - 1) * dl[1] + 1, (z - 1) * s[2] - p[2] + (j - 1) * dl[2] + 1
                if iy >= 1 and iy <= xd[3] and ix >= 1 and ix <= xd[4] then
                  acc = acc + at4(xl, xd, n, c, iy, ix) * at4(wl, wd, o, c, i, j)
                end
              end
            end
          end
          out[#out + 1] = acc
        end
      end
    end
  end
  return out, {xd[1], wd[1], oh, ow}
end

-- Max / average pooling from the definition.
local function pool_ref(x, kind, k, s, p, include_pad)
  local xd, xl = x:size(), util.list(x)
  local oh, ow = (xd[3] + 2 * p[1] - k[1]) // s[1] + 1, (xd[4] + 2 * p[2] - k[2]) // s[2] + 1
  local out = {}
  for n = 1, xd[1] do
    for c = 1, xd[2] do
      for y = 1, oh do
        for z = 1, ow do
          local best, sum, cnt = -math.huge, 0, 0
          for i = 1, k[1] do
            for j = 1, k[2] do
              local iy, ix = (y - 1) * s[1] - p[1] + i, (z - 1) * s[2] - p[2] + j
              if iy >= 1 and iy <= xd[3] and ix >= 1 and ix <= xd[4] then
                local v = at4(xl, xd, n, c, iy, ix)
                best, sum, cnt = math.max(best, v), sum + v, cnt + 1
              end
            end
          end
          out[#out + 1] = kind == "max" and best or sum / (include_pad and k[1] * k[2] or cnt)
        end
      end
    end
  end
  return out
end

-- Per-channel mean and biased variance of a [N, C, ...] tensor.
local function channel_stats(x)
  local d, l = x:size(), util.list(x)
  local c, per = d[2], 1
  for i = 3, #d do per = per * d[i] end
  local mean, var = {}, {}
  for ch = 1, c do
    local s, cnt = 0, 0
    for n = 1, d[1] do
      for k = 1, per do s, cnt = s + l[((n - 1) * c + ch - 1) * per + k], cnt + 1 end
    end
    mean[ch] = s / cnt
    local q = 0
    for n = 1, d[1] do
      for k = 1, per do q = q + (l[((n - 1) * c + ch - 1) * per + k] - mean[ch]) ^ 2 end
    end
    var[ch] = q / cnt
  end
  return mean, var, d[1] * per
end

-- y = (x - mean) / sqrt(var + eps) * w + b per channel, as a flat list.
local function bn_ref(x, mean, var, w, b, eps)
  local d, l, out = x:size(), util.list(x), {}
  local per = x:numel() // (d[1] * d[2])
  for i = 1, #l do
    local ch = ((i - 1) // per) % d[2] + 1
    out[i] = (l[i] - mean[ch]) / math.sqrt(var[ch] + eps) * (w and w[ch] or 1) + (b and b[ch] or 0)
  end
  return out
end

describe("nn.Conv2d (float64)", function()
  setup(function() nn.set_default_dtype("float64"); nn.manual_seed(11) end)
  teardown(function() nn.set_default_dtype("float32") end)

  it("matches the direct convolution with stride, padding, dilation and bias", function()
    local cases = {
      {cin = 3, cout = 4, k = {3, 3}, s = {1, 1}, p = {1, 1}, d = {1, 1}, x = {2, 3, 9, 7}},
      {cin = 2, cout = 5, k = {3, 2}, s = {2, 1}, p = {1, 0}, d = {1, 2}, x = {3, 2, 8, 9}},
      {cin = 1, cout = 3, k = {2, 3}, s = {3, 2}, p = {0, 2}, d = {2, 1}, x = {1, 1, 11, 6}, bias = false},
    }
    for ci, c in ipairs(cases) do
      local m = nn.Conv2d(c.cin, c.cout, c.k, {stride = c.s, padding = c.p, dilation = c.d, bias = c.bias})
      local x = randn(c.x, 20 + ci)
      local y = m:forward(x)
      local ref, shape = conv_ref(x, m.weight, m.bias, c.s, c.p, c.d)
      assert.are.same(shape, y:size())
      assert.is_true(util.max_rel_err(y, ref) < 1e-12, "case " .. ci)
    end
  end)

  it("passes gradient checks (input, weight, bias) with stride, padding and dilation", function()
    gradcheck(nn.Conv2d(2, 3, {3, 2}, {stride = {2, 1}, padding = {1, 0}, dilation = {1, 2}}), randn({2, 2, 6, 7}, 31))
    gradcheck(nn.Conv2d(3, 2, 3, {padding = 1, bias = false}), randn({2, 3, 5, 5}, 32))
  end)

  it("accumulates weight gradients and rejects bad shapes", function()
    local m, x = nn.Conv2d(2, 2, 2), randn({1, 2, 4, 4}, 33)
    local r = randn({1, 2, 3, 3}, 34)
    m:zero_grad(); m:forward(x); m:backward(x, r)
    local once = util.list(m.gradWeight)
    m:forward(x); m:backward(x, r)
    local twice = util.list(m.gradWeight)
    for i = 1, #once do assert.is_true(math.abs(twice[i] - 2 * once[i]) < 1e-12) end
    assert.has_error(function() m:forward(randn({1, 3, 4, 4}, 1)) end)
    local ok, err = pcall(function() nn.Conv2d(1, 1, 5):forward(randn({1, 1, 3, 3}, 1)) end)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):match("EINVAL"))
  end)
end)

describe("nn layer sizes and options at the edges", function()
  -- in + 2 * padding and dilation * (kernel - 1) overflowed int64 before the
  -- range check (UBSan aborted; a plain build named the wrong cause)
  local M, x = math.maxinteger, T.zeros({1, 1, 3, 3}, "float64")
  local cases = {
    {"Conv2d padding maxinteger", function() nn.Conv2d(1, 1, 1, {padding = M, dtype = "float64"}):forward(x) end,
     "^EINVAL: Conv2d: height: input extent 3, kernel 1, padding 9223372036854775807 or dilation 1 is above 2^31 %- 1"},
    {"Conv2d dilation maxinteger", function() nn.Conv2d(1, 1, 2, {dilation = M, dtype = "float64"}):forward(x) end,
     "^EINVAL: Conv2d: height: input extent 3, kernel 2, padding 0 or dilation 9223372036854775807 is above 2^31 %- 1"},
    {"AvgPool2d padding maxinteger", function() nn.AvgPool2d(2, {padding = M}):forward(x) end,
     "^EINVAL: Pool2d: padding %(9223372036854775807, 9223372036854775807%) must be at most half the kernel %(2, 2%)"},
    {"MaxPool2d kernel maxinteger", function() nn.MaxPool2d(M):forward(x) end,
     "^EINVAL: Pool2d: height: input extent 3, kernel 9223372036854775807, padding 0 or dilation 1 is above 2^31 %- 1"},
  }
  -- a size table of 3 entries used its first two, and LayerNorm took a NaN or
  -- negative eps (every output NaN), where BatchNorm refuses them
  -- the windows read the output buffer they were writing when it was the input
  it("MaxPool2d and AvgPool2d fed their own output buffer compute from its values", function()
    for _, m in ipairs{nn.MaxPool2d(3, {stride = 1, padding = 1}), nn.AvgPool2d(3, {stride = 1, padding = 1})} do
      local x = randn({2, 2, 4, 4}, 22)
      local want = m:forward(m:forward(x):clone()):clone()
      local y = m:forward(x)
      y = m:forward(y)
      assert.is_true(util.max_rel_err(y, util.list(want)) < 1e-15, tostring(m))
    end
  end)

  -- backward zeroes gradInput before accumulating into it: gradOutput = that buffer was lost
  it("Conv2d, MaxPool2d and AvgPool2d backward take their own gradInput buffer as gradOutput", function()
    for _, m in ipairs{nn.Conv2d(2, 2, 3, {padding = 1, dtype = "float64"}), nn.MaxPool2d(3, {stride = 1, padding = 1}),
                       nn.AvgPool2d(3, {stride = 1, padding = 1})} do
      local x = randn({2, 2, 4, 4}, 23)
      m:forward(x)
      local gy = randn(m.output:size(), 24)
      local want = m:backward(x, m:backward(x, gy):clone()):clone()
      local g = m:backward(x, gy)
      g = m:backward(x, g)
      assert.is_true(util.max_rel_err(g, util.list(want)) < 1e-15, tostring(m))
    end
  end)

  -- an empty batch [0, 3, 2] came out [0, 0] (numel // N), so the next Linear(6, k) refused it
  it("Flatten keeps the feature size of an empty batch", function()
    local f = nn.Flatten()
    assert.are.same({0, 6}, f:forward(T.zeros({0, 3, 2}, "float64")):size())
    assert.are.same({0, 4}, nn.Sequential(f, nn.Linear(6, 4, {dtype = "float64"})):forward(T.zeros({0, 3, 2}, "float64")):size())
    assert.are.same({2, 6}, f:forward(T.zeros({2, 3, 2}, "float64")):size())
  end)

  it("refuses a size table that is not a pair, and LayerNorm's NaN or negative eps", function()
    util.refuses{{function() nn.Conv2d(1, 1, {1, 2, 3}) end, "^EINVAL: nn.Conv2d: kernel_size must be an integer or a pair {h, w}, got a table of 3"},
                       {function() nn.Conv2d(1, 1, 1, {stride = {1}}) end, "^EINVAL: nn.Conv2d: stride must be an integer or a pair"},
                       {function() nn.MaxPool2d({2, 2, 2}) end, "^EINVAL: nn.MaxPool2d: kernel_size must be an integer or a pair"},
                       {function() nn.LayerNorm({3}, {eps = 0 / 0}) end, "^EINVAL: nn.LayerNorm: eps must be a number >= 0"},
                       {function() nn.LayerNorm({3}, {eps = -1}) end, "^EINVAL: nn.LayerNorm: eps must be a number >= 0, got %-1"}}
  end)

  -- torch's Conv2d(..., padding="same") / "valid" were EINVAL ("padding must be an integer")
  it("Conv2d takes torch's padding \"valid\" and \"same\" (stride 1, even total padding)", function()
    local x = randn({2, 2, 6, 5}, 26)
    local function conv(k, o) o.seed, o.dtype = 8, "float64" return nn.Conv2d(2, 3, k, o):forward(x) end
    assert.are.same(util.list(conv(3, {})), util.list(conv(3, {padding = "valid"})))
    local same = conv({3, 5}, {padding = "same"})
    assert.are.same({2, 3, 6, 5}, same:size())
    assert.are.same(util.list(conv({3, 5}, {padding = {1, 2}})), util.list(same))
    assert.are.same(util.list(conv(3, {padding = {2, 2}, dilation = 2})), util.list(conv(3, {padding = "same", dilation = 2})))
    util.refuses{
      {function() nn.Conv2d(2, 3, 3, {padding = "same", stride = 2}) end,
       '^EINVAL: nn.Conv2d: padding = "same" needs stride 1, got 2,2'},
      {function() nn.Conv2d(2, 3, {2, 3}, {padding = "same"}) end,
       '^ENOTSUP: nn.Conv2d: padding = "same" with kernel 2x3 and dilation 1,1 needs uneven padding'},
      {function() nn.Conv2d(2, 3, 3, {padding = "full"}) end, "^EINVAL: nn.Conv2d: padding must be an integer"},
    }
  end)

  -- a ported script spelling an option at torch's default (groups = 1, ceil_mode = false, device = "cpu", ...)
  -- was EINVAL ("unknown option") although crun computes exactly that
  it("accept torch's options at their default value and refuse other values naming option and value", function()
    local x = randn({2, 2, 6, 5}, 25)
    local function same(a, b, what) assert.is_true(util.max_rel_err(a, b) == 0, what) end
    same(nn.Conv2d(2, 3, 3, {groups = 1, padding_mode = "zeros", dilation = {1, 1}, device = "cpu", seed = 7,
      dtype = "float64"}):forward(x), nn.Conv2d(2, 3, 3, {seed = 7, dtype = "float64"}):forward(x), "Conv2d")
    same(nn.MaxPool2d(2, {dilation = 1, return_indices = false, ceil_mode = false}):forward(x),
      pool_ref(x, "max", {2, 2}, {2, 2}, {0, 0}), "MaxPool2d")
    same(nn.AvgPool2d(2, {ceil_mode = false, count_include_pad = true}):forward(x),
      pool_ref(x, "avg", {2, 2}, {2, 2}, {0, 0}, true), "AvgPool2d")
    local bn = nn.BatchNorm2d(2, {affine = true, track_running_stats = true, device = "cpu", dtype = "float64"})
    same(bn:forward(x), nn.BatchNorm2d(2, {dtype = "float64"}):forward(x), "BatchNorm2d")
    same(nn.LayerNorm(5, {elementwise_affine = true, device = -1, dtype = "float64"}):forward(x),
      nn.LayerNorm(5, {dtype = "float64"}):forward(x), "LayerNorm")
    local idx = T.tensor({3, 1, 4}, "int64")
    same(nn.Embedding(4, 3, {norm_type = 2, scale_grad_by_freq = false, sparse = false, device = "cpu", seed = 5,
      dtype = "float64"}):forward(idx), nn.Embedding(4, 3, {seed = 5, dtype = "float64"}):forward(idx), "Embedding")
    util.refuses{
      {function() nn.Conv2d(2, 4, 3, {groups = 2}) end,
       '^ENOTSUP: nn.Conv2d: groups = 2 is not implemented %(crun computes only torch\'s default, groups = 1%)'},
      {function() nn.Conv2d(2, 4, 3, {padding_mode = "reflect"}) end,
       '^ENOTSUP: nn.Conv2d: padding_mode = "reflect" is not implemented %(crun computes only torch\'s default, ' ..
       'padding_mode = "zeros"%)'},
      {function() nn.MaxPool2d(2, {dilation = {1, 2}}) end, "^ENOTSUP: nn.MaxPool2d: dilation = {1, 2} is not implemented"},
      {function() nn.MaxPool2d(2, {return_indices = true}) end, "^ENOTSUP: nn.MaxPool2d: return_indices = true"},
      {function() nn.MaxPool2d(2, {ceil_mode = true}) end, "^ENOTSUP: nn.MaxPool2d: ceil_mode = true"},
      {function() nn.MaxPool2d(2, {count_include_pad = false}) end, "^EINVAL: nn.MaxPool2d: unknown option 'count_include_pad'"},
      {function() nn.AvgPool2d(2, {ceil_mode = true}) end, "^ENOTSUP: nn.AvgPool2d: ceil_mode = true"},
      {function() nn.AvgPool2d(2, {divisor_override = 3}) end,
       "^ENOTSUP: nn.AvgPool2d: divisor_override = 3 is not implemented %(crun computes only torch's default, " ..
       "divisor_override = None%)"},
      {function() nn.Embedding(4, 3, {max_norm = 1}) end, "^ENOTSUP: nn.Embedding: max_norm = 1 is not implemented"},
      {function() nn.Embedding(4, 3, {sparse = true}) end, "^ENOTSUP: nn.Embedding: sparse = true is not implemented"},
      {function() nn.Embedding(4, 3, {norm_type = 1}) end, "^ENOTSUP: nn.Embedding: norm_type = 1 is not implemented"},
      {function() nn.BatchNorm1d(3, {device = "cuda:0"}) end,
       '^ENOTSUP: nn.BatchNorm1d: device = cuda:0 is not implemented %(this layer computes on the host'},
      {function() nn.LayerNorm(3, {device = "tpu"}) end, "^EINVAL: nn.LayerNorm: unknown device 'tpu'"},
      -- a plain BatchNorm took SyncBatchNorm's group and ignored it
      {function() nn.BatchNorm2d(3, {group = {}}) end, "^EINVAL: nn.BatchNorm2d: unknown option 'group'"},
      {function() nn.BatchNorm1d(3, {process_group = {}}) end, "^EINVAL: nn.BatchNorm1d: unknown option 'process_group'"},
      {function() nn.SyncBatchNorm(3, {group = 1, process_group = 2}) end,
       "^EINVAL: nn.SyncBatchNorm: options 'process_group' and 'group' name the same thing with different values"},
    }
  end)

  for _, c in ipairs(cases) do
    it(c[1], function()
      local ok, err = pcall(c[2])
      assert.is_false(ok)
      assert.matches(c[3], tostring(err))
    end)
  end
end)

describe("nn pooling and Flatten (float64)", function()
  it("MaxPool2d matches the definition and passes a gradient check", function()
    local x = randn({2, 3, 7, 8}, 41)
    for _, g in ipairs{{k = {2, 2}, s = {2, 2}, p = {0, 0}}, {k = {3, 2}, s = {2, 1}, p = {1, 1}}} do
      local m = nn.MaxPool2d(g.k, {stride = g.s, padding = g.p})
      assert.is_true(util.max_rel_err(m:forward(x), pool_ref(x, "max", g.k, g.s, g.p)) == 0)
      gradcheck(m, x)
    end
  end)

  it("AvgPool2d matches the definition with and without counting the padding", function()
    local x = randn({2, 2, 7, 6}, 42)
    for _, inc in ipairs{true, false} do
      local m = nn.AvgPool2d({3, 2}, {stride = {2, 2}, padding = {1, 1}, count_include_pad = inc})
      assert.is_true(util.max_rel_err(m:forward(x), pool_ref(x, "avg", {3, 2}, {2, 2}, {1, 1}, inc)) < 1e-12)
      gradcheck(m, x)
    end
    gradcheck(nn.AvgPool2d(2), randn({1, 2, 4, 6}, 43))
  end)

  it("MaxPool2d and AvgPool2d take torch's positional (kernel, stride, padding), and refuse more", function()
    local x = randn({2, 2, 7, 6}, 45)
    local mp, ap = nn.MaxPool2d(3, 2, 1), nn.AvgPool2d(3, 2, 1)
    local ym = mp:forward(x)
    assert.are.same({2, 2, 4, 3}, ym:size()) -- (7 + 2 - 3) // 2 + 1, (6 + 2 - 3) // 2 + 1
    assert.is_true(util.max_rel_err(ym, pool_ref(x, "max", {3, 3}, {2, 2}, {1, 1})) == 0)
    assert.is_true(util.max_rel_err(ap:forward(x), pool_ref(x, "avg", {3, 3}, {2, 2}, {1, 1}, true)) < 1e-12)
    each_raises{
      {function() nn.MaxPool2d(3, 2, 1, 2) end,
       "^ENOTSUP: nn.MaxPool2d: dilation = 2 is not implemented %(crun computes only torch's default, dilation = 1%)"},
      {function() nn.AvgPool2d(3, 2, 1, true) end,
       "^ENOTSUP: nn.AvgPool2d: ceil_mode = true is not implemented"},
      {function() nn.AvgPool2d(3, 2, 1, false, true, nil, 1) end,
       "^EINVAL: nn.AvgPool2d: 6 positional arguments after the kernel, torch's AvgPool2d has 5 %(stride, padding, " ..
       "ceil_mode, count_include_pad, divisor_override%)"},
      {function() nn.MaxPool2d(3, {stride = 2}, 1) end, "^EINVAL: nn.MaxPool2d: a third argument"},
    }
  end)

  -- torch's positional defaults (dilation 1, return_indices/ceil_mode false, count_include_pad true) were EINVAL
  it("MaxPool2d and AvgPool2d take torch's later positional arguments at their defaults", function()
    local x = randn({2, 2, 7, 6}, 46)
    local ym = nn.MaxPool2d(3, 2, 1, 1, false, false):forward(x)
    assert.is_true(util.max_rel_err(ym, pool_ref(x, "max", {3, 3}, {2, 2}, {1, 1})) == 0)
    for _, inc in ipairs{true, false} do
      local ya = nn.AvgPool2d(3, 2, 1, false, inc):forward(x)
      assert.is_true(util.max_rel_err(ya, pool_ref(x, "avg", {3, 3}, {2, 2}, {1, 1}, inc)) < 1e-12)
    end
    assert.are.same({2, 2, 2, 2}, nn.MaxPool2d(3, nil, 0, {1, 1}):forward(x):size()) -- stride=None: the kernel
  end)

  it("Flatten keeps the batch dim and passes a gradient check", function()
    local x = randn({3, 2, 2, 5}, 44)
    local y = nn.Flatten():forward(x)
    assert.are.same({3, 20}, y:size())
    assert.are.same(util.list(x), util.list(y))
    gradcheck(nn.Flatten(), x)
  end)
end)

describe("nn.BatchNorm1d / BatchNorm2d (float64)", function()
  setup(function() nn.set_default_dtype("float64") end)
  teardown(function() nn.set_default_dtype("float32") end)

  local function randomize_affine(m, seed)
    m.weight:copy(randn({m.num_features}, seed))
    m.bias:copy(randn({m.num_features}, seed + 1))
  end

  it("normalises with the batch statistics in training and updates the running ones", function()
    for _, c in ipairs{{"BatchNorm1d", {6, 3}}, {"BatchNorm1d", {4, 3, 5}}, {"BatchNorm2d", {3, 4, 5, 3}}} do
      local m = nn[c[1]](c[2][2], {eps = 1e-3, momentum = 0.25})
      randomize_affine(m, 50)
      local rm, rv = {}, {}
      for i = 1, c[2][2] do rm[i], rv[i] = 0, 1 end
      for step = 1, 2 do
        local x = randn(c[2], 50 + step)
        local mean, var, n = channel_stats(x)
        local y = m:forward(x)
        local ref = bn_ref(x, mean, var, util.list(m.weight), util.list(m.bias), 1e-3)
        assert.is_true(util.max_rel_err(y, ref) < 1e-12, c[1])
        for i = 1, #rm do
          rm[i] = 0.75 * rm[i] + 0.25 * mean[i]
          rv[i] = 0.75 * rv[i] + 0.25 * var[i] * n / (n - 1)
        end
      end
      assert.is_true(util.max_rel_err(m.running_mean, rm) < 1e-12)
      assert.is_true(util.max_rel_err(m.running_var, rv) < 1e-12)
      assert.are.equal(2, m.num_batches_tracked[1])
      -- eval mode: the running statistics
      m:evaluate()
      local x = randn(c[2], 59)
      local ref = bn_ref(x, rm, rv, util.list(m.weight), util.list(m.bias), 1e-3)
      assert.is_true(util.max_rel_err(m:forward(x), ref) < 1e-12)
      assert.is_true(util.max_rel_err(m.running_mean, rm) < 1e-15, "eval must not move the running mean")
    end
  end)

  -- an empty batch was EINVAL ("expected more than 1 value per channel"); torch 1.13 gives an empty output,
  -- counts the batch in num_batches_tracked and leaves the running statistics as they are
  it("takes an empty batch in training and evaluation: empty output, running statistics kept, batch counted", function()
    for _, c in ipairs{{"BatchNorm1d", {0, 3}}, {"BatchNorm1d", {0, 3, 4}}, {"BatchNorm2d", {0, 3, 2, 2}},
                       {"BatchNorm2d", {2, 3, 0, 0}}} do
      for _, mom in ipairs{0.25, false} do
        local m = nn[c[1]](3, {momentum = mom})
        m.running_mean:copy(T.new({0.5, -1.25, 2}, "float64"))
        m.running_var:copy(T.new({2, 0.75, 3.5}, "float64"))
        m.gradWeight:fill(0.125)
        local x = T.zeros(c[2], "float64")
        assert.are.same(c[2], m:forward(x):size())
        assert.are.same({0.5, -1.25, 2}, util.list(m.running_mean))
        assert.are.same({2, 0.75, 3.5}, util.list(m.running_var))
        assert.are.equal(1, m.num_batches_tracked[1])
        assert.are.same(c[2], m:backward(x, T.zeros(c[2], "float64")):size())
        assert.are.same({0.125, 0.125, 0.125}, util.list(m.gradWeight)) -- (a sum over nothing added)
        -- the next batch's momentum counts the empty one: cumulative 1/2
        local x2 = randn({4, 3}, 61)
        if c[1] == "BatchNorm1d" and #c[2] == 2 then
          m:forward(x2)
          local mean = channel_stats(x2)
          local w = mom or 0.5
          assert.is_true(math.abs(m.running_mean[1] - ((1 - w) * 0.5 + w * mean[1])) < 1e-12)
        end
        m:evaluate()
        assert.are.same(c[2], m:forward(x):size())
        local nt = nn[c[1]](3, {track_running_stats = false})
        nt:evaluate()
        assert.are.same(c[2], nt:forward(x):size())
      end
    end
  end)

  it("momentum=false keeps a cumulative average", function()
    local m = nn.BatchNorm1d(2, {momentum = false})
    local means = {{}, {}}
    for step = 1, 3 do
      local x = randn({5, 2}, 60 + step)
      local mean = channel_stats(x)
      means[1][step], means[2][step] = mean[1], mean[2]
      m:forward(x)
    end
    for ch = 1, 2 do
      local avg = (means[ch][1] + means[ch][2] + means[ch][3]) / 3
      assert.is_true(math.abs(m.running_mean[ch] - avg) < 1e-12)
    end
  end)

  -- a NaN momentum passed the range check (NaN < 0 and NaN > 1 are false) and
  -- made the running statistics NaN at the first forward
  it("refuses a momentum or eps outside its range, NaN included", function()
    for _, bad in ipairs{{momentum = 0 / 0}, {momentum = -0.1}, {momentum = 2}, {eps = 0 / 0}} do
      local ok, err = pcall(nn.BatchNorm1d, 2, bad)
      assert.is_false(ok)
      assert.matches("^EINVAL: nn.BatchNorm1d: " .. (bad.eps and "eps" or "momentum") .. " must be", err)
    end
  end)

  it("without running statistics uses the batch's in evaluation too, and refuses one value per channel there", function()
    local m = nn.BatchNorm1d(2, {track_running_stats = false, affine = false})
    m:evaluate()
    local x = T.tensor({{1.5, -2}, {-0.5, 4}, {2.75, 1}}, "float64")
    local mean, var = channel_stats(x)
    assert.is_true(util.max_rel_err(m:forward(x), bn_ref(x, mean, var, {1, 1}, {0, 0}, 1e-5)) < 1e-12)
    for _, mode in ipairs{"evaluate", "train"} do
      m[mode](m)
      local ok, err = pcall(m.forward, m, T.tensor({{1.5, -2}}, "float64"))
      assert.is_false(ok, mode)
      assert.matches("^EINVAL: nn.BatchNorm1d:forward: expected more than 1 value per channel when using batch " ..
        "statistics, got input of shape 1x2", err)
    end
  end)

  it("passes gradient checks in training and in evaluation", function()
    for _, c in ipairs{{"BatchNorm1d", {5, 3}}, {"BatchNorm1d", {3, 2, 4}}, {"BatchNorm2d", {2, 3, 3, 4}}} do
      local m = nn[c[1]](c[2][2])
      randomize_affine(m, 70)
      gradcheck(m, randn(c[2], 71))
      m:evaluate()
      m.running_mean:copy(randn({c[2][2]}, 72))
      m.running_var:copy(T.rand({c[2][2]}, {seed = 73, dtype = "float64"}):add(0.5))
      gradcheck(m, randn(c[2], 74))
    end
    gradcheck(nn.BatchNorm2d(3, {affine = false}), randn({2, 3, 2, 3}, 75))
  end)

  it("exposes running statistics as buffers, in state_dict and through Sequential", function()
    local net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(8, 3),
      nn.BatchNorm1d(3))
    local bufs = net:buffers()
    assert.are.equal(6, #bufs)
    assert.are.equal(net.modules[2].running_mean, bufs[1])
    net:forward(randn({4, 1, 4, 4}, 80))
    local sd = net:state_dict()
    assert.are.equal(#net:parameters() + 6, #sd)
    local other = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(8, 3),
      nn.BatchNorm1d(3))
    other:load_state_dict(sd)
    assert.are.same(util.list(net.modules[2].running_var), util.list(other.modules[2].running_var))
    assert.are.same(util.list(net.modules[6].running_mean), util.list(other.modules[6].running_mean))
    assert.has_error(function() nn.BatchNorm2d(2):forward(randn({2, 3, 2, 2}, 1)) end)
  end)

  it("SyncBatchNorm.convert swaps BatchNorm in place and falls back to BatchNorm without a group", function()
    local bn = nn.BatchNorm2d(3)
    randomize_affine(bn, 90)
    local net = nn.Sequential(nn.Conv2d(2, 3, 1), bn, nn.Sequential(nn.BatchNorm1d(4)))
    local conv = nn.SyncBatchNorm.convert(net)
    assert.are.equal(net, conv)
    local s = net.modules[2]
    assert.are.equal(nn.SyncBatchNormClass, getmetatable(s))
    assert.are.equal(nn.SyncBatchNormClass, getmetatable(net.modules[3].modules[1]))
    assert.are.equal(bn.weight, s.weight)
    assert.are.equal(bn.running_mean, s.running_mean)
    local x = randn({4, 3, 2, 2}, 91)
    local mean, var = channel_stats(x)
    local ref = bn_ref(x, mean, var, util.list(bn.weight), util.list(bn.bias), 1e-5)
    assert.is_true(util.max_rel_err(s:forward(x), ref) < 1e-12)
    gradcheck(nn.SyncBatchNorm(3), randn({3, 3, 5}, 92))
  end)
end)

describe("nn.LayerNorm and nn.Embedding (float64)", function()
  setup(function() nn.set_default_dtype("float64"); nn.manual_seed(5) end)
  teardown(function() nn.set_default_dtype("float32") end)

  it("LayerNorm normalises the last dims and passes gradient checks", function()
    local m = nn.LayerNorm({3, 4}, {eps = 1e-4})
    m.weight:copy(randn({3, 4}, 100))
    m.bias:copy(randn({3, 4}, 101))
    local x = randn({2, 5, 3, 4}, 102)
    local y, xl, w, b = util.list(m:forward(x)), util.list(x), util.list(m.weight), util.list(m.bias)
    for r = 0, 9 do
      local s, q = 0, 0
      for j = 1, 12 do s = s + xl[r * 12 + j] end
      for j = 1, 12 do q = q + (xl[r * 12 + j] - s / 12) ^ 2 end
      for j = 1, 12 do
        local ref = (xl[r * 12 + j] - s / 12) / math.sqrt(q / 12 + 1e-4) * w[j] + b[j]
        assert.is_true(math.abs(y[r * 12 + j] - ref) < 1e-12)
      end
    end
    gradcheck(m, randn({3, 3, 4}, 103))
    gradcheck(nn.LayerNorm(6, {elementwise_affine = false}), randn({4, 6}, 104))
  end)

  it("Embedding looks rows up, accumulates their gradients and honours padding_idx", function()
    local m = nn.Embedding(7, 3, {padding_idx = 2})
    local idx = T.new({{1, 2, 7}, {7, 3, 1}}, "int64")
    local y = m:forward(idx)
    assert.are.same({2, 3, 3}, y:size())
    for _, v in ipairs(util.list(m.weight:select(1, 2))) do assert.are.equal(0, v) end
    local w = util.list(m.weight)
    local yl, il = util.list(y), util.list(idx)
    for i = 1, 6 do
      for j = 1, 3 do assert.are.equal(w[(il[i] - 1) * 3 + j], yl[(i - 1) * 3 + j]) end
    end
    gradcheck(nn.Embedding(7, 3), idx, {no_input = true}) -- (the padding row's gradient is 0 by design)
    -- padding row: no gradient even though index 2 is looked up
    m:zero_grad(); m:forward(idx); m:backward(idx, T.ones({2, 3, 3}, "float64"))
    for _, v in ipairs(util.list(m.gradWeight:select(1, 2))) do assert.are.equal(0, v) end
    assert.are.equal(2, m.gradWeight[7][1]) -- index 7 is looked up twice
    local ok, err = pcall(function() m:forward(T.new({0, 8}, "int64")) end)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):match("ERANGE"))
  end)
end)

describe("nn layers in float32", function()
  it("agree with the float64 kernels (forward, gradInput, parameter gradients)", function()
    local function pair(make, shape, seed, int_input)
      local m = {}
      for k, dt in ipairs{"float64", "float32"} do
        nn.set_default_dtype(dt)
        nn.manual_seed(seed)
        m[k] = make()
      end
      nn.set_default_dtype("float32")
      local p64, p32 = m[1]:parameters(), m[2]:parameters()
      for i = 1, #p64 do p64[i]:copy(p32[i]) end
      local x64 = int_input and shape or randn(shape, seed)
      local x32 = int_input and shape or x64:to("float32")
      local y64, y32 = m[1]:forward(x64), m[2]:forward(x32)
      assert.is_true(util.max_rel_err(y64, y32) < 1e-5, "forward")
      local r = randn(y64:size(), seed + 1)
      m[1]:zero_grad(); m[2]:zero_grad()
      local g64, g32 = m[1]:backward(x64, r), m[2]:backward(x32, r:to("float32"))
      if g64 then assert.is_true(util.max_rel_err(g64, g32) < 1e-5, "gradInput") end
      local _, q64 = m[1]:parameters()
      local _, q32 = m[2]:parameters()
      for i = 1, #q64 do assert.is_true(util.max_rel_err(q64[i], q32[i]) < 1e-4, "parameter gradient " .. i) end
    end
    pair(function() return nn.Conv2d(3, 4, 3, {stride = 2, padding = 1, dilation = {1, 2}}) end, {2, 3, 9, 10}, 200)
    pair(function() return nn.MaxPool2d(3, {stride = 2, padding = 1}) end, {2, 3, 9, 10}, 201)
    pair(function() return nn.AvgPool2d(3, {stride = 2, padding = 1}) end, {2, 3, 9, 10}, 202)
    pair(function() return nn.BatchNorm2d(3) end, {4, 3, 5, 6}, 203)
    pair(function() return nn.BatchNorm1d(5) end, {7, 5}, 204)
    pair(function() return nn.LayerNorm(6) end, {4, 6}, 205)
    pair(function() return nn.Embedding(9, 4) end, T.new({3, 9, 1, 3}, "int64"), 206, true)
  end)
end)

describe("nn layers against torch 1.13", function()
  it("Conv2d, pooling, BatchNorm2d and LayerNorm match torch in float64", function()
    local why = torch_ref.missing()
    if why then pending(why) return end
    nn.set_default_dtype("float64")
    nn.manual_seed(123)
    local conv = nn.Conv2d(2, 3, {3, 2}, {stride = {2, 1}, padding = {1, 1}, dilation = {1, 2}})
    local bn, pool, avg = nn.BatchNorm2d(3, {momentum = 0.3}), nn.MaxPool2d(2, {stride = 1}), nn.AvgPool2d(2, {padding = 1})
    local ln = nn.LayerNorm(3)
    nn.set_default_dtype("float32")
    local x = randn({2, 2, 6, 7}, 130)
    local net = nn.Sequential(conv, bn, pool, avg)
    local y = net:forward(x)
    local r = randn(y:size(), 131)
    net:zero_grad()
    local gx = net:backward(x, r)
    local lx = randn({4, 3}, 132)
    local ly = ln:forward(lx)
    local function py(t)
      local v = {}
      for i, e in ipairs(util.list(t)) do v[i] = string.format("%.17g", e) end
      return "torch.tensor([" .. table.concat(v, ",") .. "], dtype=torch.float64).reshape(" .. table.concat(t:size(), ",") .. ")"
    end
    local out = torch_ref.run(string.format([[
import torch
x = %s.requires_grad_()
conv = torch.nn.Conv2d(2, 3, (3, 2), stride=(2, 1), padding=(1, 1), dilation=(1, 2)).double()
with torch.no_grad():
    conv.weight.copy_(%s); conv.bias.copy_(%s)
bn = torch.nn.BatchNorm2d(3, momentum=0.3).double()
net = torch.nn.Sequential(conv, bn, torch.nn.MaxPool2d(2, stride=1), torch.nn.AvgPool2d(2, padding=1))
y = net(x)
(y * %s).sum().backward()
ln = torch.nn.LayerNorm(3).double()
ly = ln(%s)
for t in (y, x.grad, conv.weight.grad, conv.bias.grad, bn.running_mean, bn.running_var, ly):
    print(" ".join(repr(float(v)) for v in t.detach().reshape(-1)))
]], py(x), py(conv.weight), py(conv.bias), py(r), py(lx)))
    local mine = {y, gx, conv.gradWeight, conv.gradBias, bn.running_mean, bn.running_var, ly}
    local k = 0
    for line in out:gmatch("[^\n]+") do
      k = k + 1
      local vals = {}
      for w in line:gmatch("%S+") do vals[#vals + 1] = assert(tonumber(w), line) end
      local e = util.max_rel_err(mine[k], vals)
      assert.is_true(e < 1e-10, "tensor " .. k .. " differs from torch by " .. e)
    end
    assert.are.equal(#mine, k)
  end)
end)

describe("SyncBatchNorm across ranks", function()
  local have = util.have_launcher()
  for _, n in ipairs{2, 3, 4} do
    it(string.format("on %d ranks equals BatchNorm on the concatenated batch (uneven slices)", n), function()
      if not have then pending("crun-lua or crun.dist is not built") return end
      local ok, out = util.crun(n, "spec/helpers/syncbn_job.lua")
      assert.is_true(ok, out)
      local seen = 0
      for _ in out:gmatch("SYNCBN OK rank %d+") do seen = seen + 1 end
      assert.are.equal(n, seen, out)
    end)
  end
end)
