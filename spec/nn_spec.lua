-- crun.nn: forward values against plain Lua references, and finite-difference
-- gradient checks (float64) of every module and criterion.
local tmpname = require("helpers.common").tmpname -- os.tmpname() under TMPDIR
local nn = require "crun.nn"
local each_raises = require("helpers.common").each_raises
local util = require "helpers.train_util"
local T = util.T()

local TOL = 1e-6

local function randn(shape, seed) return T.randn(shape, {seed = seed, dtype = "float64"}) end

-- Checks d(sum(m(x) .* r))/dx and /dparams against finite differences.
local function gradcheck(m, x, seed)
  local out = m:forward(x)
  local r = randn(out:size(), seed or 99)
  local function f() return util.dot(m:forward(x), r) end
  m:forward(x)
  m:zero_grad()
  local gx = m:backward(x, r):clone()
  local params, grads = m:parameters()
  local gcopy = {}
  for i, g in ipairs(grads) do gcopy[i] = g:clone() end
  assert.is_true(util.max_rel_err(gx, util.numgrad(f, x)) < TOL, "gradInput")
  for i, p in ipairs(params) do
    local e = util.max_rel_err(gcopy[i], util.numgrad(f, p))
    assert.is_true(e < TOL, "gradient of parameter " .. i .. " off by " .. e)
  end
end

describe("nn modules (float64)", function()
  setup(function() nn.set_default_dtype("float64"); nn.manual_seed(7) end)
  teardown(function() nn.set_default_dtype("float32") end)

  it("Linear computes x W^T + b", function()
    local m = nn.Linear(3, 2)
    local x = randn({4, 3}, 1)
    local y = m:forward(x)
    for i = 1, 4 do
      for j = 1, 2 do
        local s = m.bias[j]
        for k = 1, 3 do s = s + x[i][k] * m.weight[j][k] end
        assert.is_true(math.abs(y[i][j] - s) < 1e-12)
      end
    end
    local bound = 1 / math.sqrt(3)
    for _, v in ipairs(util.list(m.weight)) do assert.is_true(math.abs(v) <= bound) end
  end)

  -- device= was accepted as inert: Linear{device = "cuda"} made host parameters
  it("Linear and Conv2d make their parameters on the device their options name", function()
    for _, make in ipairs{function(o) return nn.Linear(3, 2, o) end, function(o) return nn.Conv2d(1, 2, 3, o) end} do
      local m = make{device = "cpu"}
      assert.are.equal("cpu", m:parameters()[1]:device())
      local ok, err = pcall(make, {device = "gpu"})
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find("^EINVAL: nn%.%w+: unknown device 'gpu'"), err)
      ok, err = pcall(make, {device = "cuda:0"})
      if require("crun").cuda.is_available() then
        assert.is_true(ok, err)
        local params, grads = err:parameters()
        assert.are.same({"cuda:0", "cuda:0"}, {params[1]:device(), grads[1]:device()})
      else
        assert.is_false(ok)
        assert.is_truthy(tostring(err):find("^ENOTSUP: "), err)
      end
    end
  end)

  it("Linear passes a gradient check, with and without bias", function()
    gradcheck(nn.Linear(5, 3), randn({4, 5}, 2))
    gradcheck(nn.Linear(5, 3, {bias = false}), randn({4, 5}, 3))
  end)

  it("accumulates parameter gradients until zero_grad", function()
    local m, x = nn.Linear(3, 2), randn({2, 3}, 4)
    local r = randn({2, 2}, 5)
    m:zero_grad(); m:forward(x); m:backward(x, r)
    local once = util.list(m.gradWeight)
    m:forward(x); m:backward(x, r)
    local twice = util.list(m.gradWeight)
    for i = 1, #once do assert.is_true(math.abs(twice[i] - 2 * once[i]) < 1e-12) end
    m:zero_grad()
    for _, v in ipairs(util.list(m.gradWeight)) do assert.are.equal(0, v) end
  end)

  it("activations match their formulas and pass gradient checks", function()
    local x = randn({3, 4}, 6)
    -- keep ReLU inputs away from the kink
    local fx = util.flat(x)
    for i = 1, x:numel() do if math.abs(fx[i]) < 0.05 then fx[i] = 0.3 end end
    local refs = {
      ReLU = function(v) return v > 0 and v or 0 end,
      Tanh = math.tanh or function(v) return (math.exp(2 * v) - 1) / (math.exp(2 * v) + 1) end,
      Sigmoid = function(v) return 1 / (1 + math.exp(-v)) end,
    }
    for name, ref in pairs(refs) do
      local m = nn[name]()
      local y = util.list(m:forward(x))
      local xs = util.list(x)
      for i = 1, #xs do assert.is_true(math.abs(y[i] - ref(xs[i])) < 1e-12, name) end
      gradcheck(m, x)
    end
  end)

  -- nn.ReLU computed x > 0 ? x : 0, which turned NaN into 0 (hiding a diverged
  -- layer), while t:relu() and torch.nn.ReLU pass NaN on; backward then gave
  -- 0 where torch's threshold_backward passes the gradient
  -- nn.Tanh(3) and nn.ReLU("yes") were taken, the argument dropped without a word
  it("ReLU takes torch's inplace (true is reported as inert), Tanh and Sigmoid take no argument", function()
    local x = randn({3, 4}, 9)
    local want = util.list(nn.ReLU():forward(x))
    for _, m in ipairs{nn.ReLU(false), nn.ReLU(true), nn.ReLU{inplace = false}, nn.ReLU{inplace = true}} do
      assert.are.same(want, util.list(m:forward(x)))
    end
    util.refuses{
      {function() nn.Tanh(3) end, "^EINVAL: nn.Tanh takes no arguments, got 1"},
      {function() nn.Sigmoid({}) end, "^EINVAL: nn.Sigmoid takes no arguments, got 1"},
      {function() nn.ReLU("yes") end, "^EINVAL: nn.ReLU: inplace must be true or false, got yes"},
      {function() nn.ReLU{inplce = true} end, "^EINVAL: nn.ReLU: unknown option 'inplce'"},
      {function() nn.ReLU(true, 2) end, "^EINVAL: nn.ReLU: one argument %(torch's inplace%) at most, got 2"},
    }
  end)

  it("ReLU passes NaN on, forward and backward, as t:relu() and torch do", function()
    for _, dt in ipairs{"float32", "float64"} do
      local m = nn.ReLU()
      local y = m:forward(T.new({{0 / 0, -1, 2}}, dt)):totable()[1]
      assert.is_true(y[1] ~= y[1], dt)
      assert.are.same({0, 2}, {y[2], y[3]})
      assert.are.same({{5, 0, 5}}, m:backward(nil, T.full({1, 3}, 5, dt)):totable())
    end
  end)

  -- the GEMM wrote the output buffer it was reading: h = lin:forward(h) was wrong
  it("Linear fed its own output buffer computes from that buffer's values", function()
    local lin = nn.Linear(3, 3, {dtype = "float64"})
    local x = randn({4, 3}, 21)
    local h1 = lin:forward(x):clone()
    local want = lin:forward(h1):clone()
    local h = lin:forward(x)
    h = lin:forward(h)
    assert.is_true(util.max_rel_err(h, util.list(want)) < 1e-15)
  end)

  -- Sequential(l, act, l) listed l's weight twice: an optimizer stepped it
  -- twice with its summed gradient (SGD moved it by 2 lr g), num_parameters
  -- and state_dict counted it twice; torch's parameters() lists it once
  it("lists a module used twice (weight tying) once, and steps it once", function()
    local l = nn.Linear(2, 2, {dtype = "float64"})
    local net = nn.Sequential(l, nn.Tanh(), l)
    assert.are.equal(2, #net:parameters())
    assert.are.equal(6, net:num_parameters())
    assert.are.equal(2, #net:state_dict())
    assert.are.equal(2, #net:leaves()) -- l and the Tanh
    local x = randn({3, 2}, 25)
    net:zero_grad()
    net:forward(x)
    net:backward(x, T.ones({3, 2}, "float64"))
    local w0, g0 = l.weight:clone(), l.gradWeight:clone()
    require("crun.optim").SGD(net, {lr = 1}):step()
    assert.is_true(util.max_rel_err(l.weight, util.list(w0 - g0)) < 1e-15)
  end)

  it("LogSoftMax is stable and passes a gradient check", function()
    local x = randn({3, 5}, 8)
    local y = nn.LogSoftMax():forward(x)
    for i = 1, 3 do
      local s = 0
      for j = 1, 5 do s = s + math.exp(y[i][j]) end
      assert.is_true(math.abs(s - 1) < 1e-12)
    end
    local big = T.new({{1000, 1001, 1002}}, "float64")
    local yb = nn.LogSoftMax():forward(big)
    assert.is_true(math.abs(yb[1][3] - (-math.log(1 + math.exp(-1) + math.exp(-2)))) < 1e-9)
    gradcheck(nn.LogSoftMax(), x)
  end)

  it("Sequential chains modules and passes a gradient check", function()
    local net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5), nn.Sigmoid(),
      nn.Linear(5, 3), nn.LogSoftMax())
    gradcheck(net, randn({5, 4}, 9))
    local p = net:parameters()
    assert.are.equal(6, #p)
    assert.are.equal(4 * 6 + 6 + 6 * 5 + 5 + 5 * 3 + 3, net:num_parameters())
    assert.is_truthy(tostring(net):match("nn.Linear%(4 %-> 6%)"))
  end)

  -- torch's model(x) and criterion(out, y) were "attempt to call a table value",
  -- and nn.CrossEntropyLoss / nn.MSELoss / nn.NLLLoss nil
  it("modules, criteria, DDP and FSDP models are callable (m(x) is m:forward(x)), with torch's loss names", function()
    local crun = require "crun"
    local net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    local x, y = randn({5, 3}, 41), T.new({2, 1, 1, 2, 2}, "int64")
    local out = net(x):clone()
    assert.is_true(out:equal(net:forward(x)))
    assert.is_true(nn.Linear(3, 4, {seed = 5})(x):equal(nn.Linear(3, 4, {seed = 5}):forward(x)))
    assert.are.equal(nn.CrossEntropyCriterion():forward(out, y), nn.CrossEntropyLoss()(out, y))
    assert.are.equal(nn.ClassNLLCriterion():forward(out, y), nn.NLLLoss()(out, y))
    local t = randn({5, 2}, 42)
    assert.are.equal(nn.MSECriterion():forward(out, t), nn.MSELoss()(out, t))
    assert.is_true(nn.CrossEntropyLoss{reduction = "none"}(out, y):equal(
      nn.CrossEntropyCriterion{reduction = "none"}:forward(out, y)))
    local dist = crun.dist
    dist.init_process_group{backend = "cpu", world_size = 1, rank = 0, store = crun.store.hash()}
    local ok, err = pcall(function()
      assert.is_true(crun.DDP(net)(x):equal(out))
      assert.is_true(crun.FSDP(nn.Sequential(nn.Linear(3, 2, {seed = 6})))(x):equal(nn.Linear(3, 2, {seed = 6}):forward(x)))
    end)
    dist.destroy_process_group()
    assert(ok, err)
  end)

  it("Dropout drops with probability p, scales the rest, and is identity in evaluate()", function()
    local m = nn.Dropout(0.25, {seed = 3})
    local x = T.ones({100, 40}, "float64")
    local y = util.list(m:forward(x))
    local zeros = 0
    for _, v in ipairs(y) do
      if v == 0 then zeros = zeros + 1 else assert.is_true(math.abs(v - 1 / 0.75) < 1e-12) end
    end
    assert.is_true(zeros > 800 and zeros < 1200, "dropped " .. zeros .. " of 4000")
    local g = util.list(m:backward(x, T.full({100, 40}, 2, "float64")))
    for i, v in ipairs(g) do assert.are.equal(2 * y[i], v) end
    m:evaluate()
    assert.are.equal(x, m:forward(x))
    assert.has_error(function() nn.Dropout(1.25) end)
  end)

  -- nn.Dropout(1) was EINVAL; torch's drops everything: input * 0 in training (NaN and inf stay NaN), a zero
  -- gradient, the input itself in evaluation
  it("Dropout(1) outputs input * 0 and a zero gradient in training, and passes through in evaluate()", function()
    local m = nn.Dropout(1)
    local x = T.new({{1.5, -2, 0 / 0}, {1 / 0, 0.25, -3}}, "float64")
    local y, xs = util.list(m:forward(x)), util.list(x)
    for i, v in ipairs(xs) do
      local want = v * 0
      if want ~= want then assert.is_true(y[i] ~= y[i], "element " .. i) else assert.are.equal(want, y[i]) end
    end
    assert.are.equal(-1 / 0, 1 / y[2]) -- (-2 * 0 is -0, as torch's)
    assert.are.same({0, 0, 0, 0, 0, 0}, util.list(m:backward(x, T.new({{2, -1, 3}, {0.5, 4, -7}}, "float64"))))
    m:evaluate()
    assert.are.equal(x, m:forward(x))
  end)

  -- torch's Dropout(p=0.3) ported as nn.Dropout{p = 0.3}, and Dropout(0.5, False), were EINVAL
  it("Dropout takes torch's {p =, inplace =} and positional (p, inplace)", function()
    local x = T.ones({50, 40}, "float64")
    local want = util.list(nn.Dropout(0.3, {seed = 5}):forward(x))
    for _, m in ipairs{nn.Dropout{p = 0.3, seed = 5}, nn.Dropout{p = 0.3, inplace = false, seed = 5}} do
      assert.are.same(want, util.list(m:forward(x)))
    end
    assert.are.equal(0.5, nn.Dropout{inplace = false}.p)
    assert.are.equal(0.25, nn.Dropout(0.25, false).p)
    assert.are.equal(0.25, nn.Dropout(0.25, true).p)
    util.refuses{
      {function() nn.Dropout(0.2, {p = 0.3}) end, "^EINVAL: nn.Dropout: p given twice"},
      {function() nn.Dropout{p = 2} end, "^EINVAL: nn.Dropout: p must be in %[0, 1%], got 2"},
      {function() nn.Dropout(0.5, {inplace = 1}) end, "^EINVAL: nn.Dropout: inplace must be true or false, got 1"},
    }
  end)

  it("train()/evaluate() reach every submodule", function()
    local d = nn.Dropout(0.5)
    local net = nn.Sequential(nn.Linear(2, 2), d)
    net:evaluate()
    assert.is_false(d.training)
    net:train()
    assert.is_true(d.training)
  end)

  it("a module of the user's finds its children in self.modules, and refuses a child held only in a field", function()
    local Net = nn.class("SpecNet")
    local function new_net()
      local self = setmetatable({}, Net):_init()
      self.fc1, self.drop, self.fc2 = nn.Linear(3, 4), nn.Dropout(0.5), nn.Linear(4, 2, {bias = false})
      self.modules = {self.fc1, self.drop, self.fc2}
      self.crit = nn.MSECriterion() -- a module without parameters may sit in a field
      return self
    end
    local net = new_net()
    local params, grads = net:parameters()
    assert.are.same({net.fc1.weight, net.fc1.bias, net.fc2.weight}, params)
    assert.are.same({net.fc1.gradWeight, net.fc1.gradBias, net.fc2.gradWeight}, grads)
    net.fc1.gradWeight:fill(1.5)
    net:zero_grad()
    assert.are.same({0, 0, 0}, {net.fc1.gradWeight:max(), net.fc1.gradWeight:min(), net.fc2.gradWeight:max()})
    net:train(false)
    assert.is_false(net.drop.training)
    net:train()
    assert.is_true(net.drop.training)
    local bn = nn.BatchNorm1d(2)
    net.modules[#net.modules + 1] = bn
    assert.are.same({bn.running_mean, bn.running_var, bn.num_batches_tracked}, net:buffers())
    -- torch finds self.fc3 = nn.Linear(...) as a child; crun would leave it out of the optimizer: EINVAL
    net.fc3 = nn.Linear(2, 2)
    local ok, err = pcall(net.parameters, net)
    assert.is_false(ok)
    assert.matches("^EINVAL: nn.SpecNet:parameters: field 'fc3' holds nn.Linear%(2 %-> 2%), whose parameters are " ..
      "not among this module's", err)
    assert.has_error(function() require("crun.optim").SGD(net, {lr = 0.1}) end)
  end)

  it("apply visits every submodule depth first, then the module, and children lists the direct ones once", function()
    local l1, l2, act = nn.Linear(2, 3), nn.Linear(3, 3), nn.Tanh()
    local inner = nn.Sequential(l2, act, l2) -- l2 twice (tied): visited once, as torch's
    local net = nn.Sequential(l1, inner)
    local seen = {}
    assert.are.equal(net, net:apply(function(m) seen[#seen + 1] = m end))
    assert.are.same({l1, l2, act, inner, net}, seen)
    local kids = {}
    for m in inner:children() do kids[#kids + 1] = m end
    assert.are.same({l2, act}, kids)
    assert.is_nil(l1:children()())
    -- torch's use: re-initialise the Linear layers' weights
    net:apply(function(m) if m.weight then m.weight:fill(0.25) end end)
    assert.are.same({0.25, 0.25}, {l1.weight:min(), l2.weight:max()})
    local ok, err = pcall(net.apply, net, 3)
    assert.is_false(ok)
    assert.matches("^EINVAL: nn.Sequential:apply: a function is expected, got number", err)
  end)

  it("train(false) is evaluate(), as torch's module.train(False), down to every submodule", function()
    local d, bn = nn.Dropout(0.5), nn.BatchNorm1d(2)
    local lone = nn.Dropout(0.5)
    local net = nn.Sequential(nn.Linear(2, 2), nn.Sequential(d, bn))
    assert.are.equal(net, net:train(false))
    assert.are.same({false, false, false, false}, {net.training, net.modules[2].training, d.training, bn.training})
    lone:train(false)
    assert.is_false(lone.training)
    -- in evaluation mode Dropout passes its input through
    local x = T.tensor({{-1.5, 2.25}, {0.75, -3}}, "float64")
    assert.are.equal(x, lone:forward(x))
    net:train(true)
    assert.are.same({true, true, true, true}, {net.training, net.modules[2].training, d.training, bn.training})
    net:train(false); net:train()
    assert.is_true(d.training)
    for _, m in ipairs{net, lone} do
      local ok, err = pcall(m.train, m, 0)
      assert.is_false(ok)
      assert.matches("^EINVAL: nn%.%a+:train: mode must be a boolean, got 0", err)
    end
  end)
end)

describe("nn criteria (float64)", function()
  setup(function() nn.set_default_dtype("float64") end)
  teardown(function() nn.set_default_dtype("float32") end)

  it("CrossEntropy matches -log softmax and passes a gradient check", function()
    local x = randn({4, 3}, 11)
    local y = T.new({1, 3, 2, 3}, "int64")
    local c = nn.CrossEntropyCriterion()
    local loss = c:forward(x, y)
    local ref, correct = 0, 0
    for i = 1, 4 do
      local s, best = 0, 1
      for j = 1, 3 do
        s = s + math.exp(x[i][j])
        if x[i][j] > x[i][best] then best = j end
      end
      ref = ref - (x[i][y[i]] - math.log(s))
      if best == y[i] then correct = correct + 1 end
    end
    assert.is_true(math.abs(loss - ref / 4) < 1e-12)
    assert.are.equal(correct, c.correct)
    local g = c:backward(x, y):clone()
    local num = util.numgrad(function() return c:forward(x, y) end, x)
    assert.is_true(util.max_rel_err(g, num) < TOL)
  end)

  it("CrossEntropy with reduction=sum, and ClassNLL after LogSoftMax agree", function()
    local x = randn({5, 4}, 12)
    local y = T.new({4, 1, 2, 2, 3}, "int64")
    local mean = nn.CrossEntropyCriterion():forward(x, y)
    local sum = nn.CrossEntropyCriterion{reduction = "sum"}:forward(x, y)
    assert.is_true(math.abs(sum - 5 * mean) < 1e-12)
    local lsm, nll = nn.LogSoftMax(), nn.ClassNLLCriterion()
    assert.is_true(math.abs(nll:forward(lsm:forward(x), y) - mean) < 1e-12)
    local g = nll:backward(lsm.output, y):clone()
    local num = util.numgrad(function() return nll:forward(lsm.output, y) end, lsm.output)
    assert.is_true(util.max_rel_err(g, num) < TOL)
  end)

  -- CrossEntropyCriterion{ignore_index = -100, label_smoothing = 0} (torch's defaults, spelled out) was EINVAL
  it("CrossEntropy and ClassNLL accept torch's weight/ignore_index/label_smoothing defaults, refuse other values", function()
    local x, y = randn({4, 3}, 15), T.new({3, 1, 2, 3}, "int64")
    local ce = nn.CrossEntropyCriterion{ignore_index = -100, label_smoothing = 0, reduction = "mean"}
    assert.are.equal(nn.CrossEntropyCriterion():forward(x, y), ce:forward(x, y))
    local nll = nn.ClassNLLCriterion{ignore_index = -100}
    local ref = 0
    for i = 1, 4 do ref = ref - x[i][y[i]] end
    assert.is_true(math.abs(nll:forward(x, y) - ref / 4) < 1e-12)
    util.refuses{
      {function() nn.CrossEntropyCriterion{ignore_index = 0} end,
       "^ENOTSUP: nn.CrossEntropyCriterion: ignore_index = 0 is not implemented %(crun computes only torch's default, " ..
       "ignore_index = %-100%)"},
      {function() nn.CrossEntropyCriterion{label_smoothing = 0.1} end,
       "^ENOTSUP: nn.CrossEntropyCriterion: label_smoothing = 0.1 is not implemented"},
      {function() nn.CrossEntropyCriterion{weight = T.new({1, 2, 1}, "float64")} end,
       "^ENOTSUP: nn.CrossEntropyCriterion: weight = .* is not implemented %(crun computes only torch's default, weight = None%)"},
      {function() nn.ClassNLLCriterion{ignore_index = 2} end, "^ENOTSUP: nn.ClassNLLCriterion: ignore_index = 2"},
      {function() nn.MSECriterion{ignore_index = -100} end, "^EINVAL: nn.MSECriterion: unknown option 'ignore_index'"},
    }
  end)

  it("MSE matches its formula and passes a gradient check", function()
    local x, t = randn({3, 4}, 13), randn({3, 4}, 14)
    local c = nn.MSECriterion()
    local loss = c:forward(x, t)
    local xs, ts, ref = util.list(x), util.list(t), 0
    for i = 1, #xs do ref = ref + (xs[i] - ts[i]) ^ 2 end
    assert.is_true(math.abs(loss - ref / 12) < 1e-12)
    local g = c:backward(x, t):clone()
    assert.is_true(util.max_rel_err(g, util.numgrad(function() return c:forward(x, t) end, x)) < TOL)
  end)

  -- nn.MSECriterion{reduction = "sum"} and ClassNLLCriterion{...} dropped
  -- their options table and gave the mean without a word
  it("MSE and ClassNLL take torch's reduction=\"sum\" (and refuse others)", function()
    local x, t = randn({3, 4}, 21), randn({3, 4}, 22)
    local xs, ts, ref = util.list(x), util.list(t), 0
    for i = 1, #xs do ref = ref + (xs[i] - ts[i]) ^ 2 end
    local c = nn.MSECriterion{reduction = "sum"}
    assert.is_true(math.abs(c:forward(x, t) - ref) < 1e-12)
    local g = c:backward(x, t):clone()
    assert.is_true(util.max_rel_err(g, util.numgrad(function() return c:forward(x, t) end, x)) < TOL)
    local lp, y = randn({4, 3}, 23), T.new({2, 3, 1, 3}, "int64")
    local nref = 0
    for i = 1, 4 do nref = nref - lp[i][y[i]] end
    local nll = nn.ClassNLLCriterion{reduction = "sum"}
    assert.is_true(math.abs(nll:forward(lp, y) - nref) < 1e-12)
    g = nll:backward(lp, y):clone()
    assert.is_true(util.max_rel_err(g, util.numgrad(function() return nll:forward(lp, y) end, lp)) < TOL)
    assert.is_true(math.abs(nn.ClassNLLCriterion{reduction = "mean"}:forward(lp, y) - nref / 4) < 1e-12)
    -- an empty batch sums to 0
    assert.are.equal(0, nn.MSECriterion{reduction = "sum"}:forward(T.zeros({0, 2}, "float64"), T.zeros({0, 2}, "float64")))
    assert.are.equal(0, nn.ClassNLLCriterion{reduction = "sum"}:forward(T.zeros({0, 3}, "float64"), T.zeros({0}, "int64")))
    for _, mk in ipairs{nn.MSECriterion, nn.ClassNLLCriterion} do
      local ok, err = pcall(mk, {reduction = "avg"})
      assert.is_false(ok)
      assert.matches("^EINVAL: nn%.%w+: reduction must be \"mean\", \"sum\" or \"none\", got avg", err)
      ok, err = pcall(mk, {size_average = false})
      assert.is_false(ok)
      assert.matches("^EINVAL", err)
    end
  end)

  -- reduction = "none" was EINVAL: torch's per-sample losses for a masked or
  -- weighted mean (loss * w):sum() / w:sum(), whose gradient backward takes
  it("reduction = \"none\" gives per-element losses, and backward scales each by grad_loss", function()
    local x, y = randn({5, 3}, 31), T.new({2, 3, 1, 3, 2}, "int64")
    local w = T.new({0.5, -1.25, 2, 0, 0.75}, "float64")
    local ce, nll = nn.CrossEntropyCriterion{reduction = "none"}, nn.ClassNLLCriterion{reduction = "none"}
    local l_ce, l_nll = ce:forward(x, y), nll:forward(x, y)
    assert.are.same({5}, l_ce:size())
    assert.are.same({5}, l_nll:size())
    local g_ce, g_nll = ce:backward(x, y, w), nll:backward(x, y, w)
    for i = 1, 5 do
      local s = 0
      for j = 1, 3 do s = s + math.exp(x[i][j]) end
      assert.is_true(math.abs(l_ce[i] - (math.log(s) - x[i][y[i]])) < 1e-12, "CrossEntropy row " .. i)
      assert.are.equal(-x[i][y[i]], l_nll[i])
      for j = 1, 3 do
        local hot = j == y[i] and 1 or 0
        assert.is_true(math.abs(g_ce[i][j] - w[i] * (math.exp(x[i][j]) / s - hot)) < 1e-12)
        assert.are.equal(-w[i] * hot, g_nll[i][j])
      end
    end
    for _, c in ipairs{ce, nll} do -- d(sum(loss .* w))/dx against finite differences
      local g = c:backward(x, y, w)
      assert.is_true(util.max_rel_err(g, util.numgrad(function() return util.dot(c:forward(x, y), w) end, x)) < TOL)
    end
    local a, t, r = randn({2, 3}, 32), randn({2, 3}, 33), randn({2, 3}, 34)
    local mse = nn.MSECriterion{reduction = "none"}
    local l, g = mse:forward(a, t), mse:backward(a, t, r)
    for i = 1, 2 do
      for j = 1, 3 do
        assert.are.equal((a[i][j] - t[i][j]) ^ 2, l[i][j])
        assert.is_true(math.abs(g[i][j] - 2 * (a[i][j] - t[i][j]) * r[i][j]) < 1e-12)
      end
    end
    -- an empty batch gives no losses; backward needs grad_loss of the losses' shape
    assert.are.same({0}, ce:forward(T.zeros({0, 3}, "float64"), T.zeros({0}, "int64")):size())
    assert.are.same({0, 3}, ce:backward(nil, nil, T.zeros({0}, "float64")):size())
    util.refuses{
      {function() ce:forward(x, y); ce:backward(x, y) end,
       "^EINVAL: CrossEntropyCriterion:backward: reduction = \"none\" needs the gradient of the per%-element " ..
       "losses: backward%(input, target, grad_loss%) with grad_loss of shape 5 "},
      {function() nll:backward(x, y, T.zeros({4}, "float64")) end,
       "^EINVAL: ClassNLLCriterion:backward: grad_loss has shape 4, the losses of the last forward 5"},
      {function() nn.MSECriterion{reduction = "none"}:backward(a, t, r) end,
       "^ESTATE: MSECriterion:backward called before forward"},
    }
  end)

  -- reduction = "none" ran the fused kernel and then log_softmax again for
  -- the losses (twice the forward's work)
  it("reduction = \"none\" takes the losses from the one fused pass, not a second log_softmax", function()
    local n, c = 7, 5
    local x = randn({n, c}, 41):mul(3)
    local y = T.new({3, 1, 5, 5, 2, 4, 1}, "int64")
    local calls, lsm = 0, T.methods.log_softmax
    T.methods.log_softmax = function(...) calls = calls + 1; return lsm(...) end
    local ce = nn.CrossEntropyLoss{reduction = "none"}
    local ok, l = pcall(ce.forward, ce, x, y)
    T.methods.log_softmax = lsm
    assert.is_true(ok, tostring(l))
    assert.are.equal(0, calls)
    local correct = 0
    for i = 1, n do -- expected from a plain loop: log(sum exp) - x[label]
      local s, best = 0, 1
      for j = 1, c do s = s + math.exp(x[i][j]); if x[i][j] > x[i][best] then best = j end end
      assert.is_true(math.abs(l[i] - (math.log(s) - x[i][y[i]])) < 1e-12, "row " .. i)
      if best == y[i] then correct = correct + 1 end
    end
    assert.are.equal(correct, ce.correct)
    local f = nn.CrossEntropyLoss{reduction = "none"}:forward(x:float(), y) -- float32 losses of float32 logits
    assert.are.equal("float32", f:dtype())
    for i = 1, n do assert.is_true(math.abs(f[i] - l[i]) < 1e-5) end
  end)

  -- torch: the mean over no rows is 0/0 = nan (sum: 0); crun gave 0, which
  -- an averaging loop would count as a perfect batch
  it("the mean loss of an empty batch is nan, the sum 0, as torch's", function()
    local x, y = T.zeros({0, 3}, "float64"), T.zeros({0}, "int64")
    local function is_nan(v) return v ~= v end
    for _, dt in ipairs{"float64", "float32"} do
      local xd = x:to(dt)
      local ce = nn.CrossEntropyCriterion()
      assert.is_true(is_nan(ce:forward(xd, y)), "CrossEntropy mean " .. dt)
      assert.are.same({0, 3}, ce:backward(xd, y):size())
      assert.are.equal(0, ce.correct)
      assert.are.equal(0, nn.CrossEntropyCriterion{reduction = "sum"}:forward(xd, y), "CrossEntropy sum " .. dt)
      assert.is_true(is_nan(nn.ClassNLLCriterion():forward(xd, y)), "ClassNLL " .. dt)
      assert.are.same({0, 3}, nn.ClassNLLCriterion():backward(xd, y):size())
      local mse = nn.MSECriterion()
      assert.is_true(is_nan(mse:forward(xd, xd:clone())), "MSE " .. dt)
      assert.are.same({0, 3}, mse:backward(xd, xd:clone()):size())
    end
  end)
end)

describe("nn in float32", function()
  it("agrees with the float64 computation (forward, backward, loss)", function()
    nn.set_default_dtype("float64")
    local net64 = nn.Sequential(nn.Linear(6, 5, {seed = 3}), nn.Sigmoid(), nn.Linear(5, 4, {seed = 4}),
      nn.Tanh(), nn.Linear(4, 3, {seed = 5}), nn.ReLU(), nn.LogSoftMax())
    nn.set_default_dtype("float32")
    local net32 = nn.Sequential(nn.Linear(6, 5, {seed = 3}), nn.Sigmoid(), nn.Linear(5, 4, {seed = 4}),
      nn.Tanh(), nn.Linear(4, 3, {seed = 5}), nn.ReLU(), nn.LogSoftMax())
    local p64, p32 = net64:parameters(), net32:parameters()
    for i = 1, #p64 do p32[i]:copy(p64[i]) end
    local x64 = randn({7, 6}, 21)
    local x32 = x64:to("float32")
    local c64, c32 = nn.CrossEntropyCriterion(), nn.CrossEntropyCriterion()
    local y = T.new({1, 2, 3, 1, 2, 3, 1}, "int64")
    local o64, o32 = net64:forward(x64), net32:forward(x32)
    assert.are.equal("float32", o32:dtype())
    assert.is_true(util.max_rel_err(o32, o64) < 1e-5)
    assert.is_true(math.abs(c64:forward(o64, y) - c32:forward(o32, y)) < 1e-5)
    net64:zero_grad(); net32:zero_grad()
    assert.is_true(util.max_rel_err(net32:backward(x32, c32:backward(o32, y)),
      net64:backward(x64, c64:backward(o64, y))) < 1e-5)
    local _, g64 = net64:parameters()
    local _, g32 = net32:parameters()
    for i = 1, #g64 do assert.is_true(util.max_rel_err(g32[i], g64[i]) < 1e-5, "grad " .. i) end
  end)
end)

describe("nn bad input", function()
  it("names the layer and the shapes on a width mismatch", function()
    local m = nn.Linear(3, 2)
    local ok, err = pcall(m.forward, m, T.zeros({4, 5}))
    assert.is_false(ok)
    assert.is_truthy(tostring(err):match("^EINVAL: Linear forward: input float32 4x5 does not match weight float32 2x3"))
  end)

  it("rejects labels out of range with ERANGE", function()
    local c = nn.CrossEntropyCriterion()
    local ok, err = pcall(c.forward, c, T.zeros({2, 3}), T.new({1, 4}, "int64"))
    assert.is_false(ok)
    assert.is_truthy(tostring(err):match("^ERANGE: CrossEntropy: label 4 of row 2 is out of range 1..3"))
    ok, err = pcall(c.forward, c, T.zeros({2, 3}), T.new({1.5, 2}, "float32"))
    assert.is_false(ok)
    assert.is_truthy(tostring(err):match("labels must be int64 or int32"))
  end)

  it("rejects bad sizes, dtypes and arguments with errors that start with the status name", function()
    local m = nn.Linear(3, 2)
    local cases = {
      {function() nn.Linear(0, 2) end, "^EINVAL: nn.Linear: in_features must be an integer >= 1, got 0"},
      {function() nn.Linear(2.5, 2) end, "^EINVAL: nn.Linear: in_features must be an integer >= 1, got 2.5"},
      {function() nn.Linear(2, 2, {dtype = "int32"}) end, "^EINVAL: nn.Linear: dtype must be float32 or float64"},
      {function() m:forward(T.zeros({2, 3}, "float64")) end, "^EINVAL: "},
      {function() m:forward("x") end, "^EINVAL: Linear:forward: input must be a tensor, got string"},
      {function() nn.Sequential():add(42) end, "^EINVAL: Sequential:add: an nn module is expected, got number"},
      {function() nn.Sequential():backward() end, "^ESTATE: Sequential:backward called before forward"},
      {function() nn.Dropout(1.5) end, "^EINVAL: nn.Dropout: p must be in %[0, 1%], got 1.5"},
      {function() nn.Dropout(0 / 0) end, "^EINVAL: nn.Dropout: p must be in %[0, 1%]"},
      {function() nn.set_default_dtype("float16") end, "^EINVAL: nn.set_default_dtype: float32 or float64 expected"},
      {function() nn.manual_seed("x") end, "^EINVAL: nn.manual_seed: seed must be an integer"},
      {function() m:load_state_dict({T.zeros({3})}) end, "^EINVAL: load_state_dict: expected 2 tensors, got 1"},
      {function() nn.mlp(4, 8, -1, 3) end, "^EINVAL: nn.mlp: layers must be an integer >= 0, got %-1"},
      {function() nn.mlp(4, 8, 2.5, 3) end, "^EINVAL: nn.mlp: layers must be an integer >= 0, got 2.5"},
      {function() m:load_state_dict({42, T.zeros({2})}) end,
       "^EINVAL: load_state_dict: entry 1 is a number, a tensor is expected"},
      {function() m:load_state_dict({T.zeros({2, 3}), "bias"}) end,
       "^EINVAL: load_state_dict: entry 2 is a string, a tensor is expected"},
      -- a [3, 2] weight (another model's) was loaded as [2, 3] without a word
      {function() m:load_state_dict({T.zeros({3, 2}), T.zeros({2})}) end,
       "^EINVAL: load_state_dict: tensor 1 has shape 3x2, the model's has 2x3"},
      {function() m:load_state_dict({T.zeros({2, 3}), T.zeros({1, 2})}) end,
       "^EINVAL: load_state_dict: tensor 2 has shape 1x2, the model's has 2"},
      {function() nn.MSECriterion():forward(T.zeros({2}), 3) end,
       "^EINVAL: MSECriterion:forward: target must be a tensor, got number"},
      {function() nn.MSECriterion():forward(T.zeros({4, 1}), T.zeros({4})) end,
       "^EINVAL: MSECriterion:forward: the target's shape 4 differs from the input's 4x1"},
      {function() nn.MSECriterion():forward(T.zeros({2, 3}), T.zeros({3, 2})) end,
       "^EINVAL: MSECriterion:forward: the target's shape 3x2 differs from the input's 2x3"},
      {function() nn.ClassNLLCriterion():forward(T.zeros({2, 3}), T.new({1}, "int64")) end,
       "^EINVAL: ClassNLLCriterion:forward: input must be %[N, C%] and labels %[N%], got 2x3 and 1"},
      {function() nn.CrossEntropyCriterion{reduction = "elementwise_mean"} end,
       "^EINVAL: nn.CrossEntropyCriterion: reduction must be \"mean\", \"sum\" or \"none\", got elementwise_mean"},
    }
    each_raises(cases)
  end)

  -- these fell through to a bare Lua error ("attempt to call a nil value (method
  -- 'is_contiguous')") in contig()
  it("names a non-tensor input or gradOutput of every module with EINVAL", function()
    local mods = {Dropout = nn.Dropout(0.5), LogSoftMax = nn.LogSoftMax(), Flatten = nn.Flatten(),
      MaxPool2d = nn.MaxPool2d(2), AvgPool2d = nn.AvgPool2d(2), Embedding = nn.Embedding(3, 2)}
    for name, m in pairs(mods) do
      local ok, err = pcall(m.backward, m, T.ones({2, 2}), "x")
      assert.is_false(ok, name)
      assert.matches("^EINVAL: " .. name .. ":backward: [a-zA-Z]+ must be a tensor, got string", err)
    end
    local ok, err = pcall(nn.Dropout(0.5).forward, nn.Dropout(0.5), 5)
    assert.is_false(ok)
    assert.matches("^EINVAL: Dropout:forward: input must be a tensor, got number", err)
    ok, err = pcall(nn.ClassNLLCriterion().backward, nn.ClassNLLCriterion(), 5, 5)
    assert.is_false(ok)
    assert.matches("^EINVAL: ClassNLLCriterion:backward: input must be a tensor, got number", err)
    ok, err = pcall(nn.Linear(2, 2).forward, nn.Linear(2, 2), T.Generator(1))
    assert.is_false(ok)
    assert.matches("^EINVAL: Linear:forward: input must be a tensor, got userdata", err)
  end)

  it("load_state_dict copies nothing from a refused list and takes a strided tensor of the right shape", function()
    local m = nn.Linear(3, 2)
    local w0 = m.weight:clone()
    assert.has_error(function() m:load_state_dict({T.ones({2, 3}), T.ones({3})}) end)
    assert.is_true(m.weight:equal(w0))
    m:load_state_dict({T.arange(6):view(3, 2):t(), T.ones({2}, "float64")})
    assert.are.same({{0, 2, 4}, {1, 3, 5}}, m.weight:totable())
    assert.are.same({1, 1}, m.bias:totable())
  end)

  it("checks options: unknown keys are EINVAL naming the accepted ones, torch's inert ones are taken", function()
    local ok, err = pcall(nn.Linear, 2, 2, {bais = false})
    assert.is_false(ok)
    assert.are.equal("EINVAL: nn.Linear: unknown option 'bais' (accepted: bias, device, dtype, seed)", err)
    ok, err = pcall(nn.CrossEntropyCriterion, {label_smooting = 0.1})
    assert.is_false(ok)
    assert.are.equal("EINVAL: nn.CrossEntropyCriterion: unknown option 'label_smooting' (accepted: ignore_index, " ..
      "label_smoothing, reduction, weight)", err)
    ok, err = pcall(nn.Dropout, 0.5, {sead = 1})
    assert.is_false(ok)
    assert.are.equal("EINVAL: nn.Dropout: unknown option 'sead' (accepted: inplace, p, seed)", err)
    local a = nn.Linear(3, 2, {seed = 11, device = "cpu", dtype = "float64"})
    local b = nn.Linear(3, 2, {seed = 11, dtype = "float64"})
    assert.are.same(a.weight:totable(), b.weight:totable())
    assert.is_truthy(nn.Dropout(0.2, {inplace = true, seed = 3}))
  end)

  -- torch's nn.LogSoftmax(dim=1) / nn.Flatten(0) ported as LogSoftMax(1) /
  -- Flatten(0) were ignored: crun normalised the rows (dim 2, 1-based) and
  -- flattened from dim 2 whatever was asked
  it("LogSoftMax and Flatten take only the dims they compute, 1-based, and refuse others", function()
    local x = randn({3, 4}, 31)
    local want = nn.LogSoftMax():forward(x):clone()
    for _, d in ipairs({2, -1}) do
      assert.is_true(nn.LogSoftMax(d):forward(x):equal(want), "dim " .. d)
      assert.is_true(nn.LogSoftMax({dim = d}):forward(x):equal(want), "{dim = " .. d .. "}")
    end
    local ok, err = pcall(function() return nn.LogSoftMax(1):forward(x) end)
    assert.is_false(ok)
    assert.matches("^EINVAL: nn.LogSoftMax: dim 1 of a 2%-d input: crun's LogSoftMax normalizes the last dim " ..
                   "%(dims are 1%-based: torch's dim=1 of %[N, C%] is dim=2 here%)", err)
    ok, err = pcall(nn.LogSoftMax, 1.5)
    assert.matches("^EINVAL: nn.LogSoftMax", err)
    local y = randn({2, 3, 4}, 32)
    assert.are.same({2, 12}, nn.Flatten(2):forward(y):size())
    assert.are.same({2, 12}, nn.Flatten(2, -1):forward(y):size())
    assert.are.same({2, 12}, nn.Flatten({start_dim = 2, end_dim = 3}):forward(y):size())
    for _, args in ipairs({{1}, {2, 2}, {0}, {{start_dim = 1}}}) do
      ok, err = pcall(function() return nn.Flatten(table.unpack(args)):forward(y) end)
      assert.is_false(ok)
      assert.matches("^EINVAL: nn.Flatten: ", err)
    end
  end)

  it("names the criterion whose backward is called before forward", function()
    for _, name in ipairs({"CrossEntropyCriterion", "MSECriterion"}) do
      local c = nn[name]()
      local ok, err = pcall(c.backward, c)
      assert.is_false(ok)
      assert.are.equal("ESTATE: " .. name .. ":backward called before forward", err)
    end
  end)
end)

describe("nn errors under a launcher", function()
  it("name the rank from RANK", function()
    local lua = "lua5.4"
    local cmd = [[RANK=3 ]] .. lua .. [[ -e 'local nn = require "crun.nn"; local T = require "crun.tensor"
      local m = nn.Linear(3, 2); local ok, e = pcall(m.forward, m, T.zeros({4, 5})); io.write(e)' 2>&1]]
    local p = io.popen(cmd)
    local out = p:read("a")
    p:close()
    assert.is_truthy(out:match("^EINVAL: Linear forward: .* %(rank 3%)$"), out)
  end)
end)

-- Names as torch gives them (named_parameters, named_buffers, a keyed
-- state_dict) and load_state_dict of a keyed state dict (strict and not).
describe("nn names and keyed state dicts", function()
  -- a Sequential(Linear, BatchNorm1d, ReLU, Linear): the expected names are
  -- written out by hand from torch's naming (children by 0-based position)
  local function model(seed)
    nn.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2, {bias = false}))
  end
  local function names_of(iter)
    local out = {}
    for name, t in iter do out[#out + 1] = name .. ":" .. table.concat(t:size(), "x") end
    return table.concat(out, " ")
  end

  it("named_parameters and named_buffers give torch's names in parameters() order", function()
    local m = model(1)
    assert.are.equal("0.weight:4x3 0.bias:4 1.weight:4 1.bias:4 3.weight:2x4", names_of(m:named_parameters()))
    assert.are.equal("1.running_mean:4 1.running_var:4 1.num_batches_tracked:1", names_of(m:named_buffers()))
    local params = m:parameters()
    local i = 0
    for _, p in m:named_parameters() do i = i + 1; assert.are.equal(params[i], p) end
    assert.are.equal(#params, i)
    assert.are.equal("weight:2x3 bias:2", names_of(nn.Linear(3, 2):named_parameters()))
    assert.is_truthy(names_of(model(1):named_parameters("net.")):match("^net%.0%.weight:4x3 net%.0%.bias:4 "))
    -- a tied layer comes once in named_parameters, under its first name
    local l = nn.Linear(2, 2)
    assert.are.equal("0.weight:2x2 0.bias:2", names_of(nn.Sequential(l, nn.ReLU(), l):named_parameters()))
  end)

  -- a module of the user's with self.fc1 = nn.Linear(...) named it "0.weight" where torch says "fc1.weight"
  it("a user's module names a child held in a field by the field, as torch; Sequential stays positional", function()
    local Net = nn.class("SpecNamedNet")
    function Net:forward(x)
      for _, m in ipairs(self.modules) do x = m:forward(x) end
      return x
    end
    local function new_net(seed)
      nn.manual_seed(seed)
      local self = setmetatable({}, Net):_init()
      self.fc1, self.bn, self.fc2 = nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2, {bias = false})
      self.modules = {self.fc1, self.bn, nn.ReLU(), self.fc2, nn.Linear(2, 2)} -- the last in no field
      return self
    end
    local a = new_net(1)
    assert.are.equal("fc1.weight:4x3 fc1.bias:4 bn.weight:4 bn.bias:4 fc2.weight:2x4 4.weight:2x2 4.bias:2",
      names_of(a:named_parameters()))
    assert.are.equal("bn.running_mean:4 bn.running_var:4 bn.num_batches_tracked:1", names_of(a:named_buffers()))
    local seq = nn.Sequential(nn.Linear(2, 2))
    seq.head = seq.modules[1]
    assert.are.equal("0.weight:2x2 0.bias:2", names_of(seq:named_parameters()))
    -- keyed round trip under the field names
    local x = T.randn({5, 3}, {seed = 6, dtype = "float32"})
    a:forward(x)
    local sd = a:state_dict{keyed = true}
    assert.is_truthy(sd["fc2.weight"] and sd["bn.running_mean"] and sd["4.bias"])
    local b = new_net(2)
    local res = b:load_state_dict(sd)
    assert.are.same({{}, {}}, {res.missing_keys, res.unexpected_keys})
    a:evaluate(); b:evaluate()
    assert.are.equal(0, (a:forward(x) - b:forward(x)):abs():max())
    -- a checkpoint keyed by the positional names crun gave before loads too (strict)
    local old = {}
    for k, v in pairs(sd) do
      local f = k:match("^(%a%w*)%.")
      local pos = ({fc1 = "0", bn = "1", fc2 = "3"})[f]
      old[pos and (pos .. k:sub(#f + 1)) or k] = v
    end
    assert.is_truthy(old["0.weight"] and old["1.running_var"] and old["3.weight"])
    local c = new_net(3)
    res = c:load_state_dict(old)
    assert.are.same({{}, {}}, {res.missing_keys, res.unexpected_keys})
    c:evaluate()
    assert.are.equal(0, (a:forward(x) - c:forward(x)):abs():max())
  end)

  it("a keyed state_dict round-trips through load_state_dict and crun.save", function()
    local a, b = model(1), model(2)
    local x = T.randn({5, 3}, {seed = 4, dtype = "float32"})
    a:forward(x) -- updates a's running statistics
    local sd = a:state_dict{keyed = true}
    local keys = {}
    for k in pairs(sd) do keys[#keys + 1] = k end
    table.sort(keys)
    assert.are.equal("0.bias 0.weight 1.bias 1.num_batches_tracked 1.running_mean 1.running_var 1.weight 3.weight",
      table.concat(keys, " "))
    assert.are_not.equal(a.modules[1].weight, sd["0.weight"]) -- copies
    local path = tmpname()
    require("crun").save(path, sd)
    local res = b:load_state_dict(require("crun").load(path))
    os.remove(path)
    assert.are.equal(0, #res.missing_keys)
    assert.are.equal(0, #res.unexpected_keys)
    a:evaluate(); b:evaluate()
    local ya, yb = a:forward(x), b:forward(x)
    assert.are.equal(0, (ya - yb):abs():max())
    assert.are.equal(a.modules[2].running_var:sum(), b.modules[2].running_var:sum())
  end)

  it("strict refuses missing and unexpected keys, naming them all; strict = false loads the rest", function()
    local a, b = model(1), model(2)
    local sd = a:state_dict{keyed = true}
    sd["0.bias"], sd["3.weight"], sd["4.weight"] = nil, nil, T.zeros({1})
    local before = b.modules[1].weight:clone()
    local ok, err = pcall(b.load_state_dict, b, sd)
    assert.is_false(ok)
    assert.are.equal('EINVAL: load_state_dict for Sequential: missing key(s) in state_dict: "0.bias", "3.weight"; '
      .. 'unexpected key(s) in state_dict: "4.weight" (strict = false loads the keys that match)', err)
    assert.are.equal(0, (b.modules[1].weight - before):abs():max()) -- nothing loaded
    local res = b:load_state_dict(sd, {strict = false})
    assert.are.equal("0.bias 3.weight", table.concat(res.missing_keys, " "))
    assert.are.equal("4.weight", table.concat(res.unexpected_keys, " "))
    assert.are.equal(0, (b.modules[1].weight - a.modules[1].weight):abs():max())
    assert.are_not.equal(0, (b.modules[4].weight - a.modules[4].weight):abs():max())
    -- a wrong shape is named by its key, and nothing is loaded
    local c = model(3)
    local sd2 = a:state_dict{keyed = true}
    sd2["3.weight"] = T.zeros({4, 2})
    ok, err = pcall(c.load_state_dict, c, sd2)
    assert.is_false(ok)
    assert.are.equal('EINVAL: load_state_dict: "3.weight" has shape 4x2, the model\'s has 2x4', err)
    assert.are_not.equal(0, (c.modules[1].weight - a.modules[1].weight):abs():max())
    ok, err = pcall(c.load_state_dict, c, sd2, {strict = "yes"})
    assert.is_false(ok)
    assert.is_truthy(err:match("^EINVAL: load_state_dict: strict must be true or false"), err)
  end)
end)

-- torch.nn.utils's clipping; expected norms from plain Lua loops over the
-- gradients' elements (signed, non-periodic values).
describe("nn.utils.clip_grad_norm_ / clip_grad_value_", function()
  local function setup_grads()
    local m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    local _, grads = m:parameters()
    local k = 0
    for _, g in ipairs(grads) do
      local f = g:view(g:numel())
      for i = 1, g:numel() do
        k = k + 1
        f[i] = ((k * 7919) % 23 - 11) / 8 * (k % 3 == 0 and -1 or 1) -- exact in float32
      end
    end
    return m, grads
  end
  local function values(grads)
    local v = {}
    for _, g in ipairs(grads) do
      local f = g:view(g:numel())
      for i = 1, g:numel() do v[#v + 1] = f[i] end
    end
    return v
  end
  local function norm(v, p)
    local acc = 0
    for _, x in ipairs(v) do
      if p == math.huge then acc = math.max(acc, math.abs(x)) else acc = acc + math.abs(x) ^ p end
    end
    return p == math.huge and acc or acc ^ (1 / p)
  end

  it("returns the total norm and scales every gradient by max_norm / (norm + 1e-6) when above it", function()
    for _, p in ipairs{2, 1, 3, math.huge} do
      local m, grads = setup_grads()
      local before = values(grads)
      local want = norm(before, p)
      local got = nn.utils.clip_grad_norm_(m, 0.75, p == math.huge and "inf" or p)
      assert.is_true(math.abs(got - want) <= 1e-12 * want, string.format("p %s: %.17g vs %.17g", p, got, want))
      local coef = 0.75 / (want + 1e-6)
      for i, x in ipairs(values(grads)) do
        assert.is_true(math.abs(x - before[i] * coef) <= 1e-6 * math.abs(before[i] * coef) + 1e-30,
          string.format("p %s, element %d: %.9g vs %.9g", p, i, x, before[i] * coef))
      end
      assert.is_true(math.abs(norm(values(grads), p) - 0.75) < 1e-5)
    end
    -- below max_norm: untouched; a list of gradients works as a module does
    local _, grads = setup_grads()
    local before = values(grads)
    local got = nn.utils.clip_grad_norm_(grads, 1e3, {norm_type = 2})
    assert.is_true(math.abs(got - norm(before, 2)) <= 1e-12 * got)
    assert.are.same(before, values(grads))
  end)

  it("a non-finite norm scales as torch, or raises ERANGE with error_if_nonfinite and changes nothing", function()
    local m, grads = setup_grads()
    grads[1]:view(grads[1]:numel())[2] = math.huge
    local before = values(grads)
    local ok, err = pcall(nn.utils.clip_grad_norm_, m, 1, 2, {error_if_nonfinite = true})
    assert.is_false(ok)
    assert.are.equal("ERANGE: clip_grad_norm_: the total norm of order 2 of the gradients is inf, so it cannot be "
      .. "clipped (error_if_nonfinite = false scales the gradients by it anyway, as torch)", err)
    assert.are.same(before, values(grads))
    assert.are.equal(math.huge, nn.utils.clip_grad_norm_(m, 1))
    local v = values(grads)
    assert.is_true(v[2] ~= v[2]) -- inf * 0
    assert.are.equal(0, v[1])
  end)

  it("clip_grad_value_ clamps each element, and bad arguments are EINVAL", function()
    local m, grads = setup_grads()
    local before = values(grads)
    nn.utils.clip_grad_value_(m, 0.5)
    for i, x in ipairs(values(grads)) do assert.are.equal(math.max(-0.5, math.min(0.5, before[i])), x) end
    local cases = {
      {function() nn.utils.clip_grad_norm_(m, -1) end, "EINVAL: clip_grad_norm_: max_norm must be a number >= 0, got -1"},
      {function() nn.utils.clip_grad_norm_(m, 1, 0) end,
       'EINVAL: clip_grad_norm_: norm_type must be a number > 0 or "inf", got 0'},
      {function() nn.utils.clip_grad_norm_(m, 1, "l2") end,
       'EINVAL: clip_grad_norm_: norm_type must be a number > 0 or "inf", got l2'},
      {function() nn.utils.clip_grad_norm_({T.zeros({2}), 3}, 1) end,
       "EINVAL: clip_grad_norm_: gradient 2 is a number, a tensor is expected"},
      {function() nn.utils.clip_grad_norm_(m, 1, 2, {norm_type = 2}) end,
       "EINVAL: clip_grad_norm_: norm_type given twice (argument 3 and the options)"},
      {function() nn.utils.clip_grad_value_(m, 0 / 0) end,
       "EINVAL: clip_grad_value_: clip_value must be a number >= 0, got " .. tostring(0 / 0)},
      {function() nn.utils.clip_grad_norm_(42, 1) end,
       "EINVAL: clip_grad_norm_: a crun.nn module or a list of gradient tensors is expected, got number"},
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok)
      assert.are.equal(c[2], err)
    end
  end)
end)
