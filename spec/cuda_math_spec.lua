-- The math of device tensors (issue 12): tensor arithmetic with broadcasting,
-- reductions, softmax and matmul, an MLP's forward/backward through Linear,
-- ReLU, LogSoftMax and ClassNLL (and CrossEntropy, Dropout), and SGD / Adam
-- steps, each run on "cuda" tensors and compared with the same work on the
-- CPU. Through the CUDA test double (ctest gpudouble.cuda_math: device memory
-- is host memory, kernels are the host launchers of the same bodies) the
-- results must be equal bit for bit; on a real GPU (spec.cuda_math_spec) to
-- float rounding. Without a device ctest reports it skipped with the reason.
local tmpname = require("helpers.common").tmpname -- os.tmpname() under TMPDIR
local crun = require "crun"
local T, cuda, nn, optim = crun.tensor, crun.cuda, crun.nn, crun.optim

local DOUBLE = os.getenv("CRUN_GPU_DOUBLE") == "1"
local avail = cuda.is_available()
local reason = cuda.unavailable_reason()
local it_gpu = avail and it or function(name) pending(name .. " (skipped: " .. tostring(reason) .. ")") end

-- Signed, non-periodic values (a splitmix-driven normal draw).
local function randn(shape, seed, dtype)
  return T.randn(shape, {seed = seed, dtype = dtype or "float32"})
end

-- Fails unless device tensor d (brought back) matches host tensor h: equal
-- through the double, within float rounding on a GPU.
local function same(what, h, d)
  assert.is_true(d:is_cuda(), what .. ": result not on the device")
  local b = d:cpu()
  assert.equals(h:dtype(), b:dtype(), what)
  assert.same(h:size(), b:size(), what)
  if DOUBLE then
    assert.is_true(h:equal(b), what .. ": differs from the CPU")
  else
    assert.is_true(h:allclose(b, 1e-4, 1e-5), what .. ": differs from the CPU beyond rounding")
  end
end

local function close(what, a, b)
  if DOUBLE then assert.equals(a, b, what) else assert.is_true(math.abs(a - b) <= 1e-5 * (1 + math.abs(a)), what) end
end

describe("tensor math on a device", function()
  it_gpu("runs element-wise ops with scalars and broadcasting", function()
    local a, b = randn({257, 3}, 1), randn({3}, 2)
    local da, db = a:cuda(), b:cuda()
    same("add", a + b, da + db)
    same("sub", a - b, da - db)
    same("mul by a scalar", a * -2.5, da * -2.5)
    same("scalar minus", 3 - a, 3 - da)
    same("div", a / b, da / db)
    same("maximum", a:maximum(b), da:maximum(db))
    same("gt", a:gt(b), da:gt(db))
    same("exp of a transpose", a:t():exp(), da:t():exp())
    same("tanh", a:tanh(), da:tanh())
    same("clamp", a:clamp(-1, 0.5), da:clamp(-1, 0.5))
    local ia, ib = T.new({-7, 3, 120, -128}, "int32"), T.new({2, -5, 9, 1}, "int32")
    same("int32 add wraps as on the CPU", ia * ib, ia:cuda() * ib:cuda())
  end)

  it_gpu("reduces, takes softmax and multiplies matrices", function()
    local a = randn({257, 5}, 3)
    local da = a:cuda()
    close("sum", a:sum(), da:sum())
    close("mean", a:mean(), da:mean())
    same("sum over dim 1", a:sum(1), da:sum(1))
    local e = T.zeros({2, 0, 3}, "float32") -- mean over an empty dim: nan, as torch's and the host's
    local em = e:cuda():mean(2):cpu():totable()
    assert.is_true(em[1][1] ~= em[1][1] and em[2][3] ~= em[2][3], "device mean over an empty dim is nan")
    local v, i = a:max(2)
    local dv, di = da:max(2)
    same("max over dim 2", v, dv)
    same("its positions", i, di)
    same("argmax", a:argmax(1), da:argmax(1))
    same("softmax", a:softmax(2), da:softmax(2))
    same("log_softmax", a:log_softmax(1), da:log_softmax(1))
    local w = randn({5, 7}, 4)
    same("matmul", a:matmul(w), da:matmul(w:cuda()))
    same("matmul of a transposed view", a:t():matmul(a), da:t():matmul(da))
    same("cast to float64", a:double(), da:double())
    local z = T.zeros({4, 6}, "float64", {device = "cuda"})
    z:narrow(2, 2, 3):fill(-1.25)
    local hz = T.zeros({4, 6}, "float64")
    hz:narrow(2, 2, 3):fill(-1.25)
    same("fill through a view", hz, z)
  end)

  it_gpu("refuses operands on two places", function()
    local h, d = T.new({1, 2, 3}), T.new({1, 2, 3}):cuda()
    local ok, err = pcall(function() return h + d end)
    assert.is_false(ok)
    assert.matches("^EINVAL: add: operands on different devices %(cpu and cuda:%d+", err)
  end)
end)

-- A small classifier and a batch, identical on both sides.
local function model(seed)
  nn.manual_seed(seed)
  return nn.Sequential(nn.Linear(7, 16), nn.ReLU(), nn.Linear(16, 4), nn.LogSoftMax())
end

local function batch()
  local x = randn({65, 7}, 5)
  local labels = {}
  for i = 1, 65 do labels[i] = (i * 7919) % 4 + 1 end
  return x, T.new(labels, "int64")
end

describe("nn and optim on a device", function()
  it_gpu("Linear + ReLU + LogSoftMax + ClassNLL forward/backward and SGD / Adam steps match the CPU", function()
    local x, y = batch()
    for _, kind in ipairs({"SGD", "Adam", "AdamW"}) do
      local mh, md = model(11), model(11):cuda()
      local ch, cd = nn.ClassNLLCriterion(), nn.ClassNLLCriterion()
      local oh, od
      if kind == "SGD" then
        local o = {lr = 0.1, momentum = 0.9, nesterov = true, weight_decay = 1e-3}
        oh, od = optim.SGD(mh, o), optim.SGD(md, o)
      else
        local o = {lr = 1e-2, weight_decay = 1e-2, amsgrad = kind == "AdamW"}
        oh, od = optim[kind](mh, o), optim[kind](md, o)
      end
      local dx, dy = x:cuda(), y:cuda()
      for step = 1, 3 do
        oh:zero_grad(); od:zero_grad()
        local lh = ch:forward(mh:forward(x), y)
        local ld = cd:forward(md:forward(dx), dy)
        close(kind .. " loss at step " .. step, lh, ld)
        mh:backward(x, ch:backward(mh.output, y))
        md:backward(dx, cd:backward(md.output, dy))
        local _, gh = mh:parameters()
        local _, gd = md:parameters()
        for i = 1, #gh do same(kind .. " gradient " .. i .. " at step " .. step, gh[i], gd[i]) end
        oh:step(); od:step()
        local ph = mh:parameters()
        local pd = md:parameters()
        for i = 1, #ph do same(kind .. " parameter " .. i .. " after step " .. step, ph[i], pd[i]) end
      end
    end
  end)

  it_gpu("CrossEntropy and MSE on a device, with the label check", function()
    local x, y = batch()
    local ch, cd = nn.CrossEntropyCriterion(), nn.CrossEntropyCriterion()
    close("cross entropy", ch:forward(x:narrow(2, 1, 4), y), cd:forward(x:narrow(2, 1, 4):cuda(), y:cuda()))
    assert.equals(ch.correct, cd.correct)
    same("its gradient", ch:backward(), cd:backward())
    local t = randn({65, 7}, 6)
    local mh, md = nn.MSECriterion(), nn.MSECriterion()
    close("mse", mh:forward(x, t), md:forward(x:cuda(), t:cuda()))
    same("its gradient", mh:backward(), md:backward())
    local bad = y:clone()
    bad[30] = 9
    local ok, err = pcall(function() return cd:forward(x:narrow(2, 1, 4):cuda(), bad:cuda()) end)
    assert.is_false(ok)
    assert.matches("^ERANGE: CrossEntropy: label 9 of row 30 is out of range 1..4", err)
    -- an empty batch: the mean losses are nan on a device too, as on the host and in torch
    local e, ey = T.zeros({0, 4}, "float64"):cuda(), T.zeros({0}, "int64"):cuda()
    local ce, mse = nn.CrossEntropyCriterion():forward(e, ey), nn.MSECriterion():forward(e, e:clone())
    assert.is_true(ce ~= ce and mse ~= mse, "nan losses of an empty batch on a device")
    assert.is_true(nn.ClassNLLCriterion():forward(e, ey) ~= nn.ClassNLLCriterion():forward(e, ey))
  end)

  it_gpu("L1, SmoothL1, BCE and BCEWithLogits losses on a device, every reduction, as on the host", function()
    for _, dt in ipairs{"float32", "float64"} do
      local x, tt = randn({37, 53}, 11, dt), randn({37, 53}, 13, dt)
      local p = nn.Sigmoid():forward(x):clone()
      local t01 = T.rand({37, 53}, {seed = 12, dtype = dt})
      local pw = T.full({53}, 1.5, {dtype = dt})
      for _, c in ipairs{{"L1Loss", {}, x, tt}, {"SmoothL1Loss", {beta = 0.7}, x, tt}, {"BCELoss", {}, p, t01},
                         {"BCEWithLogitsLoss", {}, x, t01}, {"BCEWithLogitsLoss", {pos_weight = pw}, x, t01}} do
        for _, red in ipairs{"mean", "sum", "none"} do
          local what = string.format("%s%s %s %s", c[1], c[2].beta and " beta" or c[2].pos_weight and " pos_weight" or "",
                                     red, dt)
          local ho, dopts = {reduction = red}, {reduction = red}
          for k, v in pairs(c[2]) do ho[k], dopts[k] = v, type(v) == "userdata" and v:cuda() or v end
          local hc, dc = nn[c[1]](ho), nn[c[1]](dopts)
          local xh, th = c[3], c[4]
          local fh, fd = hc:forward(xh, th), dc:forward(xh:cuda(), th:cuda())
          if red == "none" then same(what, fh, fd) else close(what, fh, fd) end
          local g = red == "none" and randn({37, 53}, 14, dt) or nil
          same(what .. ": its gradient", hc:backward(xh, th, g), dc:backward(xh:cuda(), th:cuda(), g and g:cuda()))
        end
      end
    end
    -- the select ops have no device kernel: ENOTSUP, never a wrong answer
    local d = randn({5}, 3):cuda()
    for name, f in pairs{where = function() return T.where(d:gt(0), d, 0) end,
                         masked_fill = function() return d:masked_fill(d:gt(0), 1) end,
                         unique = function() return d:unique() end} do
      local ok, err = pcall(f)
      assert.is_false(ok, name)
      assert.matches("^ENOTSUP: " .. name .. ": not implemented for a tensor on cuda:0", tostring(err))
    end
  end)

  it_gpu("Dropout on a device is reproducible from its seed", function()
    local x = randn({257, 9}, 7):cuda()
    local a, b = nn.Dropout(0.25, {seed = 42}), nn.Dropout(0.25, {seed = 42})
    local ya, yb = a:forward(x):cpu(), b:forward(x):cpu()
    assert.is_true(ya:equal(yb))
    local dropped = a.mask:cpu():eq(0):sum()
    assert.is_true(math.abs(dropped - 0.25 * 257 * 9) < 5 * math.sqrt(257 * 9 * 0.25 * 0.75))
    local y2 = a:forward(x):cpu() -- the next call draws a new mask
    assert.is_false(ya:equal(y2))
    same("backward is gy * mask", (x * a.mask:cpu():cuda()):cpu(), a:backward(x, x))
  end)
end)

describe("DDP on a device", function()
  local core = require "crun.core"
  local it_nccl = (avail and core.have_nccl) and it or function(name)
    pending(name .. " (skipped: " .. (avail and "the nccl backend is not in this build" or tostring(reason)) .. ")")
  end

  -- The "epoch ... done" lines of a 2-rank jobs/train.lua run, without the rate.
  local function train(device, dir)
    local run = require "helpers.dist_run"
    -- two ranks, or one where this machine has one GPU (NCCL puts one rank on each)
    local code, out = run.run(DOUBLE and 2 or math.min(2, cuda.device_count()), "jobs/train.lua", "--device " .. device ..
      " --epochs 2 --samples 600 --quiet --ckpt-dir " .. dir, {limit = 200})
    assert.equals(0, code, out)
    local done = {}
    for l in out:gmatch("[^\n]+") do
      if l:find("done:", 1, true) then done[#done + 1] = l:gsub(", [%d.]+ samples/s", "") end
    end
    assert.equals(2, #done, out)
    return done, out
  end

  it_nccl("jobs/train.lua --device cuda trains with gradient buckets in device memory as the CPU run does", function()
    local dir = tmpname()
    os.remove(dir)
    local cpu = train("cpu", dir .. "-cpu")
    local gpu, out = train("cuda", dir .. "-cuda")
    assert.truthy(out:find("params on cuda;", 1, true), out)
    if DOUBLE then
      assert.same(cpu, gpu) -- the same arithmetic, the same order: the same losses
    else
      assert.truthy(gpu[2]:find("test accuracy", 1, true), out)
    end
    -- the checkpoint was written from host copies and loads on the CPU
    local ck = crun.load(dir .. "-cuda/train.crun")
    assert.equals(2, ck.epoch)
    assert.is_false(ck.model[1]:is_cuda())
    os.execute("rm -rf '" .. dir .. "-cpu' '" .. dir .. "-cuda'")
  end)
end)
