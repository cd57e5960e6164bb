--- crun.optim: SGD (momentum, dampening, nesterov, weight decay) and
-- Adam / AdamW (amsgrad), with the update rules of torch.optim. The update
-- of each parameter is one fused C loop (crun/train.h).
--
--   local opt = crun.optim.SGD(model, {lr=0.1, momentum=0.9})   -- model or DDP
--   local opt = crun.optim.Adam(params, grads, {lr=1e-3})       -- or two lists
--   opt:zero_grad(); ...backward...; opt:step()

-- The C kernels, wrapped so that a failure also names this process's rank.
local K = require("crun.tensor")._rank_kernels{"optim_adam", "optim_sgd"}

local optim = {}
local O = require "crun.opts"

-- torch.optim flags that choose an implementation, not an update rule.
local IMPL_INERT = {
  foreach = "crun's update is one fused C loop per parameter",
  fused = "crun's update is one fused C loop per parameter",
  capturable = "crun has no CUDA graphs",
  differentiable = "crun's optimizers do not record an autograd graph",
}

-- Accepted option keys of each optimizer (crun.opts specs); ZeroRedundancyOptimizer
-- checks the options it passes through against the same lists.
optim.KEYS = {
  SGD = {"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"},
  Adam = {"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"},
}
optim.KEYS.AdamW = optim.KEYS.Adam
optim.IMPL_INERT = IMPL_INERT
local SPECS = {}
for name, keys in pairs(optim.KEYS) do
  local t = {inert = IMPL_INERT}
  for i, k in ipairs(keys) do t[i] = k end
  SPECS[name] = O.spec(t)
end

-- crun.tensor.
local function T() return require "crun.tensor" end

-- Returns params, grads, opts, module from (model, opts) or (params, grads, opts).
local function unpack_args(fname, a, b, c)
  local params, grads, opts, module
  if type(a) == "table" and type(a.parameters) == "function" then
    params, grads = a:parameters()
    opts, module = b, a
  else
    params, grads, opts = a, b, c
  end
  if type(params) ~= "table" or type(grads) ~= "table" or #params ~= #grads then
    error(string.format("bad argument #1 to '%s' (a module, or lists of params and grads of equal length expected)", fname), 3)
  end
  for i, p in ipairs(params) do
    if p:numel() ~= grads[i]:numel() or p:dtype() ~= grads[i]:dtype() then
      error(string.format("%s: parameter %d and its gradient differ in size or dtype", fname, i), 3)
    end
  end
  return params, grads, opts or {}, module
end

local function check_lr(fname, o)
  if type(o.lr) ~= "number" or o.lr < 0 then
    error(string.format("bad argument to '%s' (lr >= 0 expected, got %s)", fname, tostring(o.lr)), 3)
  end
end

local Optimizer = {}
Optimizer.__index = Optimizer

-- Built from a module: takes its current gradient tensors (DDP's
-- gradient_as_bucket_view swaps them for bucket views after wrapping).
function Optimizer:_refresh()
  if self.module then self.params, self.grads = self.module:parameters() end
end

--- Sets every gradient to zero.
function Optimizer:zero_grad()
  self:_refresh()
  for _, g in ipairs(self.grads) do g:fill(0) end
end

--- Optimizer state (buffers and step counts) as plain tables and tensors, for crun.save.
function Optimizer:state_dict()
  local st = {}
  for i, s in pairs(self.state) do
    local c = {}
    for k, v in pairs(s) do c[k] = type(v) == "userdata" and v:clone() or v end
    st[i] = c
  end
  return {state = st, kind = self.kind}
end

--- Restores a state_dict(); tensors are copied into fresh buffers.
function Optimizer:load_state_dict(sd)
  if type(sd) ~= "table" or sd.kind ~= self.kind then
    error(string.format("load_state_dict: expected a %s state, got %s", self.kind,
      type(sd) == "table" and tostring(sd.kind) or type(sd)), 2)
  end
  self.state = {}
  for i, s in pairs(sd.state) do
    local c = {}
    for k, v in pairs(s) do c[k] = type(v) == "userdata" and v:clone() or v end
    self.state[i] = c
  end
end

-- ---------------------------------------------------------------- SGD

local SGD = setmetatable({}, {__index = Optimizer})
SGD.__index = SGD

--- SGD(model | params, grads, {lr=, momentum=0, dampening=0, weight_decay=0, nesterov=false, maximize=false})
function optim.SGD(a, b, c)
  local params, grads, opts, module = unpack_args("SGD", a, b, c)
  local o = O.check(SPECS.SGD, "SGD", opts)
  check_lr("SGD", o)
  local self = setmetatable({kind = "SGD", params = params, grads = grads, module = module, state = {},
    opts = {lr = o.lr, momentum = o.momentum or 0, dampening = o.dampening or 0,
      weight_decay = o.weight_decay or 0, nesterov = o.nesterov == true, maximize = o.maximize == true}}, SGD)
  if self.opts.nesterov and (self.opts.momentum <= 0 or self.opts.dampening ~= 0) then
    error("bad argument to 'SGD' (nesterov momentum requires a momentum and zero dampening)", 2)
  end
  return self
end

--- One update of every parameter from its current gradient.
function SGD:step()
  self:_refresh()
  local o = self.opts
  for i, p in ipairs(self.params) do
    local s = self.state[i]
    local first = false
    if o.momentum ~= 0 and not s then
      s = {momentum_buffer = T().zeros(p:size(), p:dtype())}
      self.state[i], first = s, true
    end
    K.optim_sgd(p, self.grads[i], s and s.momentum_buffer, o, first)
  end
end

-- ---------------------------------------------------------------- Adam / AdamW

local Adam = setmetatable({}, {__index = Optimizer})
Adam.__index = Adam

local function adam(kind, decoupled, default_wd, a, b, c)
  local params, grads, opts, module = unpack_args(kind, a, b, c)
  local o = O.check(SPECS[kind], kind, opts)
  check_lr(kind, {lr = o.lr or 1e-3})
  local betas = o.betas or {0.9, 0.999}
  return setmetatable({kind = kind, params = params, grads = grads, module = module, state = {},
    opts = {lr = o.lr or 1e-3, beta1 = betas[1], beta2 = betas[2], eps = o.eps or 1e-8,
      weight_decay = o.weight_decay or default_wd, decoupled = decoupled,
      amsgrad = o.amsgrad == true, maximize = o.maximize == true}}, Adam)
end

--- Adam(model | params, grads, {lr=1e-3, betas={0.9, 0.999}, eps=1e-8, weight_decay=0, amsgrad=false})
function optim.Adam(a, b, c) return adam("Adam", false, 0, a, b, c) end

--- AdamW: Adam with decoupled weight decay (default 1e-2), as torch.optim.AdamW.
function optim.AdamW(a, b, c) return adam("AdamW", true, 1e-2, a, b, c) end

function Adam:step()
  self:_refresh()
  local o = self.opts
  for i, p in ipairs(self.params) do
    local s = self.state[i]
    if not s then
      s = {step = 0, exp_avg = T().zeros(p:size(), p:dtype()), exp_avg_sq = T().zeros(p:size(), p:dtype())}
      if o.amsgrad then s.max_exp_avg_sq = T().zeros(p:size(), p:dtype()) end
      self.state[i] = s
    end
    s.step = s.step + 1
    K.optim_adam(p, self.grads[i], s.exp_avg, s.exp_avg_sq, s.max_exp_avg_sq, s.step, o)
  end
end

--- ZeroRedundancyOptimizer(model | {params, grads}, optim_class, opts): see crun/zero.lua.
function optim.ZeroRedundancyOptimizer(a, optim_class, opts)
  return require("crun.zero").new(a, optim_class, opts)
end

return optim
