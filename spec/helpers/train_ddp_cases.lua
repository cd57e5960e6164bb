-- The DDP equivalence cases, shared by the multi-rank job
-- (spec/helpers/train_ddp_job.lua, run under crun-lua) and by ddp_spec.lua,
-- which recomputes each case on one process from the concatenated batches.
local cases = {}

local function T()
  local ok, t = pcall(require, "crun.tensor")
  return ok and t or require("crun.core").tensor
end

cases.STEPS = 3
cases.ROWS = 4 -- rows per rank per step (per micro-batch)

--- The model: same architecture everywhere; init seed given by the caller.
--- tied: one Linear(7, 7) used twice (weight tying): its gradient sums both
-- uses before DDP may reduce it.
--- tied = "unroll": a container of the spec's own that calls one Linear(7, 7)
-- three times per forward (an unrolled cell, as an RNN's), each call followed
-- by its own Tanh: the cell runs its backward three times per pass, which the
-- module tree (one appearance) does not tell.
local Unroll
local function unroll_class(nn)
  if Unroll then return Unroll end
  Unroll = nn.class("UnrollSpec", getmetatable(nn.Sequential()))
  function Unroll:forward(x)
    self._x, self._pre = {}, {}
    for i = 1, 3 do
      self._x[i] = x
      self._pre[i] = self.cell:forward(x):clone() -- the cell's output buffer is reused by its next call
      x = self.acts[i]:forward(self._pre[i])
    end
    self.output = self.head:forward(x)
    self._last = x
    return self.output
  end
  function Unroll:backward(_, gy)
    gy = self.head:backward(self._last, gy)
    for i = 3, 1, -1 do gy = self.cell:backward(self._x[i], self.acts[i]:backward(self._pre[i], gy)) end
    self.gradInput = gy
    return gy
  end
  return Unroll
end

function cases.model(dtype, seed, tied)
  local nn = require "crun.nn"
  nn.set_default_dtype(dtype)
  nn.manual_seed(seed)
  local m
  if tied == "unroll" then
    local inp, cell, head = nn.Linear(5, 7), nn.Linear(7, 7), nn.Linear(7, 3)
    local u = setmetatable({}, unroll_class(nn)):_init()
    u.cell, u.head, u.acts = cell, head, {nn.Tanh(), nn.Tanh(), nn.Tanh()}
    u.modules = {cell, u.acts[1], u.acts[2], u.acts[3], head}
    m = nn.Sequential(inp, nn.Tanh(), u)
  elseif tied then
    local mid = nn.Linear(7, 7)
    m = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), mid, nn.Tanh(), mid, nn.ReLU(), nn.Linear(7, 3))
  else
    m = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 6), nn.ReLU(), nn.Linear(6, 3))
  end
  nn.set_default_dtype("float32")
  return m
end

--- The batch of `rank` at step s, micro-batch mb: X [ROWS, 5], labels [ROWS].
function cases.batch(dtype, s, rank, mb)
  local X = T().randn({cases.ROWS, 5}, {seed = 1000 * s + 10 * rank + (mb or 0), dtype = dtype})
  local y = {}
  for i = 1, cases.ROWS do y[i] = (s + rank + i + (mb or 0)) % 3 + 1 end
  return X, T().new(y, "int64")
end

--- Rows of several batches stacked (the "global batch").
function cases.concat(list)
  local Tm = T()
  if Tm.cat then return Tm.cat(list, 1) end
  local n = 0
  for _, t in ipairs(list) do n = n + t:size(1) end
  local shape = list[1]:size()
  shape[1] = n
  local out, row = Tm.zeros(shape, list[1]:dtype()), 1
  for _, t in ipairs(list) do
    out:narrow(1, row, t:size(1)):copy(t)
    row = row + t:size(1)
  end
  return out
end

--- Number of batches rank r trains on in the uneven (Join) cases.
function cases.join_batches(pattern, r, world)
  if pattern == "inc" then return 2 + r end
  return 1 + world - r
end

--- Optimizer for a case.
function cases.optimizer(model, kind, lr)
  local optim = require "crun.optim"
  if kind == "adam" then return optim.Adam(model, {lr = lr or 0.01}) end
  if kind == "sgd" then return optim.SGD(model, {lr = lr or 0.1}) end
  return optim.SGD(model, {lr = lr or 0.1, momentum = 0.9})
end

-- One forward/backward of `model` on (X, y) with mean cross entropy.
function cases.fwd_bwd(model, X, y)
  local nn = require "crun.nn"
  local crit = nn.CrossEntropyCriterion()
  local out = model:forward(X)
  crit:forward(out, y)
  model:backward(X, crit:backward(out, y))
end

--- The list of cases: name, dtype, DDP options, kind ("plain", "no_sync", "join").
cases.LIST = {
  {name = "f64_small_buckets", dtype = "float64", kind = "plain", opt = "momentum",
    ddp = {bucket_cap_mb = 0.0002, first_bucket_mb = 0.0001}},
  {name = "f64_one_bucket", dtype = "float64", kind = "plain", opt = "adam", ddp = {}},
  {name = "f64_bucket_view", dtype = "float64", kind = "plain", opt = "momentum",
    ddp = {bucket_cap_mb = 0.0003, gradient_as_bucket_view = true}},
  {name = "f32_small_buckets", dtype = "float32", kind = "plain", opt = "momentum",
    ddp = {bucket_cap_mb = 0.0001, first_bucket_mb = 0.0001}},
  {name = "f64_no_sync", dtype = "float64", kind = "no_sync", opt = "momentum",
    ddp = {bucket_cap_mb = 0.0002}},
  {name = "f32_no_sync_view", dtype = "float32", kind = "no_sync", opt = "sgd",
    ddp = {bucket_cap_mb = 0.0002, gradient_as_bucket_view = true}},
  {name = "f64_join_inc", dtype = "float64", kind = "join", pattern = "inc", opt = "sgd",
    ddp = {bucket_cap_mb = 0.0002}},
  {name = "f64_join_dec", dtype = "float64", kind = "join", pattern = "dec", opt = "sgd",
    ddp = {bucket_cap_mb = 0.0002}},
  {name = "f64_tied", dtype = "float64", kind = "plain", opt = "momentum", tied = true,
    ddp = {bucket_cap_mb = 0.0002, first_bucket_mb = 0.0001}},
  {name = "f64_unrolled", dtype = "float64", kind = "plain", opt = "momentum", tied = "unroll",
    ddp = {bucket_cap_mb = 0.0002, first_bucket_mb = 0.0001}},
}

--- Runs case c on this rank with DDP (inside a process group); returns the
-- final parameters (list of tensors).
function cases.run_ddp(c, rank, world)
  local crun = require "crun"
  local net = cases.model(c.dtype, 1 + rank, c.tied) -- different init per rank: DDP must broadcast rank 0's
  -- the optimizer comes first: with gradient_as_bucket_view it must pick up
  -- the bucket views DDP puts in place of the gradients
  local opt = cases.optimizer(net, c.opt)
  local model = crun.DDP(net, c.ddp)
  if c.kind == "join" then
    local nb = cases.join_batches(c.pattern, rank, world)
    crun.join({model}, function()
      for s = 1, nb do
        opt:zero_grad()
        cases.fwd_bwd(model, cases.batch(c.dtype, s, rank))
        opt:step()
      end
    end)
  else
    for s = 1, cases.STEPS do
      opt:zero_grad()
      if c.kind == "no_sync" then
        model:no_sync(function() cases.fwd_bwd(model, cases.batch(c.dtype, s, rank, 1)) end)
        cases.fwd_bwd(model, cases.batch(c.dtype, s, rank, 2))
      else
        cases.fwd_bwd(model, cases.batch(c.dtype, s, rank))
      end
      opt:step()
    end
  end
  model:close()
  return (net:parameters())
end

--- Runs case c on ONE process over the concatenated global batches; returns
-- the parameters every rank of a `world`-rank DDP run must end with.
function cases.run_reference(c, world)
  local net = cases.model(c.dtype, 1, c.tied)
  if c.kind == "join" then
    -- step s: (1/world) * sum of the active ranks' gradients (torch divides by
    -- the initial world size): SGD on the summed gradients with lr / world.
    local opt = cases.optimizer(net, c.opt, 0.1 / world)
    local most = 0
    for r = 0, world - 1 do most = math.max(most, cases.join_batches(c.pattern, r, world)) end
    for s = 1, most do
      opt:zero_grad()
      for r = 0, world - 1 do
        if s <= cases.join_batches(c.pattern, r, world) then cases.fwd_bwd(net, cases.batch(c.dtype, s, r)) end
      end
      opt:step()
    end
    return (net:parameters())
  end
  local opt = cases.optimizer(net, c.opt)
  local function global(s, mb)
    local xs, ys = {}, {}
    for r = 0, world - 1 do xs[#xs + 1], ys[#ys + 1] = cases.batch(c.dtype, s, r, mb) end
    return cases.concat(xs), cases.concat(ys)
  end
  for s = 1, cases.STEPS do
    opt:zero_grad()
    if c.kind == "no_sync" then
      cases.fwd_bwd(net, global(s, 1))
      cases.fwd_bwd(net, global(s, 2))
    else
      cases.fwd_bwd(net, global(s))
    end
    opt:step()
  end
  return (net:parameters())
end

return cases
