--- crun.optim: SGD (momentum, dampening, nesterov, weight decay) and
-- Adam / AdamW (amsgrad), with the update rules of torch.optim. The update
-- of each parameter is one fused C loop (crun/train.h).
--
--   local opt = crun.optim.SGD(model, {lr=0.1, momentum=0.9})   -- model or DDP
--   local opt = crun.optim.Adam(params, grads, {lr=1e-3})       -- or two lists
--   opt:zero_grad(); ...backward...; opt:step()
-- @module crun.optim

-- The C kernels, wrapped so that a failure also names this process's rank.
local K = require("crun.tensor")._rank_kernels{"optim_adam", "optim_sgd"}

local optim = {}
local O = require "crun.opts"

-- Options of torch.optim that change nothing in crun (reported once on rank 0).
local INERT = {
  foreach = "crun updates each parameter in one fused C loop",
  fused = "crun updates each parameter in one fused C loop",
  differentiable = "crun's optimizers record no autograd graph",
  capturable = "crun has no CUDA graphs",
}
-- Torch7's optim names for the same options (optim.sgd / optim.adam configs).
local TORCH7 = {learningRate = "lr", weightDecay = "weight_decay", epsilon = "eps"}

local function spec(keys)
  local aliases = {}
  for k, to in pairs(TORCH7) do
    for _, known in ipairs(keys) do
      if known == to then aliases[k] = to end
    end
  end
  keys.aliases, keys.inert = aliases, INERT
  return O.spec(keys)
end
local SGD_OPTS = spec{"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"}
local ADAM_OPTS = spec{"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"}

-- The accepted keys of each optimizer, and the inert ones, for wrappers that pass
-- options through (ZeroRedundancyOptimizer checks against the same lists).
optim.KEYS = {
  SGD = {"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"},
  Adam = {"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"},
}
optim.KEYS.AdamW = optim.KEYS.Adam
optim.IMPL_INERT = INERT

-- crun.tensor.
local function T() return require "crun.tensor" end

--- (for wrappers too) EINVAL when `module` is one that crun.FSDP wrapped: its
-- parameters are empty while sharded, so an optimizer over them would
-- silently step nothing; the FSDP model's parameters() are the shards.
function optim.check_not_sharded(fname, module)
  if rawget(module, "_sharded_by") then
    O.fail("EINVAL: %s: the module's parameters are sharded by %s: build the optimizer from the FSDP model it "
      .. "returned, not from the module it wraps", fname, module._sharded_by)
  end
end

-- Returns params, grads, opts, module from (model, opts), (params, grads, opts)
-- or torch's (params, opts) with a module's parameters (module: a stand-in whose
-- parameters() gives their gradient tensors of the time).
local function unpack_args(fname, a, b, c)
  local params, grads, opts, module
  if type(a) == "table" and type(a.parameters) == "function" then
    optim.check_not_sharded(fname, a)
    params, grads = a:parameters()
    opts, module = b, a
  else
    params, grads, opts = a, b, c
  end
  if not module and type(params) == "table" and #params > 0 and (grads == nil or type(grads) == "table" and #grads == 0) then
    local nn = require "crun.nn"
    local found = nn.grads_for(params) -- torch's SGD(model.parameters(), opts)
    if found then -- (each step takes the modules' gradient tensors of the time, as from a module)
      local p, g, o = unpack_args(fname, params, found, grads)
      return p, g, o, {parameters = function() return params, nn.grads_for(params) end}
    end
    O.fail("EINVAL: %s: %d parameters and no gradients (torch's %s(model.parameters(), ...)): crun's gradients are " ..
      "tensors of their own; pass the module, %s(model, opts), or %s(params, grads, opts) with params, grads = " ..
      "model:parameters()", fname, #params, fname, fname, fname)
  end
  if type(params) ~= "table" or type(grads) ~= "table" or #params ~= #grads then
    O.fail("EINVAL: %s: a module, or lists of params and grads of equal length, is expected", fname)
  end
  local is_tensor = require("crun.serialize").is_tensor
  for i, p in ipairs(params) do
    if not is_tensor(p) or not is_tensor(grads[i]) then
      O.fail("EINVAL: %s: parameter %d or its gradient is not a tensor", fname, i)
    end
    if p:numel() ~= grads[i]:numel() or p:dtype() ~= grads[i]:dtype() then
      O.fail("EINVAL: %s: parameter %d (%s[%d]) and its gradient (%s[%d]) differ in size or dtype", fname, i,
        p:dtype(), p:numel(), grads[i]:dtype(), grads[i]:numel())
    end
  end
  return params, grads, opts, module
end

local Optimizer = {}
Optimizer.__index = Optimizer

--- opt.param_groups: torch's list of parameter groups, here the one group:
-- {{lr =, momentum =, ..., params = {...}}}, whose option fields read and
-- write opt.opts (so `for _, g in ipairs(opt.param_groups) do g.lr = x end`
-- sets the rate, as in torch). Made on each read: it follows a replaced opts.
function optim.param_groups(self)
  local opts = rawget(self, "opts")
  return {setmetatable({params = rawget(self, "params")}, {__index = opts, __newindex = opts})}
end

-- cls.__index for an optimizer class: its methods, and param_groups.
function optim.index_with_groups(cls)
  return function(self, k)
    if k == "param_groups" then return optim.param_groups(self) end
    return cls[k]
  end
end

-- Built from a module: takes its current gradient tensors (DDP's
-- gradient_as_bucket_view swaps them for bucket views after wrapping).
function Optimizer:_refresh()
  if self.module then self.params, self.grads = self.module:parameters() end
end

--- zero_grad([set_to_none=false]): sets every gradient to zero (torch's
--- set_to_none = true is ENOTSUP: see opts.zero_grad_arg).
function Optimizer:zero_grad(set_to_none)
  O.zero_grad_arg(self.kind .. ":zero_grad", set_to_none)
  self:_refresh()
  for _, g in ipairs(self.grads) do g:fill(0) end
end

-- A copy of opts (its tables copied too: betas), less `params`.
local function copy_opts(o)
  local c = {}
  for k, v in pairs(o) do
    if k ~= "params" then c[k] = type(v) == "table" and table.move(v, 1, #v, 1, {}) or v end
  end
  return c
end

--- Optimizer state as plain tables and tensors, for crun.save: {kind=,
-- state = {[i] = buffers and step counts}, param_groups = {{lr=, ...,
-- params = {1, ..., n}}}} (torch's form: the one group's options, the rate a
-- schedule or the user set included, and its parameters' indices).
function Optimizer:state_dict()
  self:_refresh()
  local st = {}
  for i, s in pairs(self.state) do
    local c = {}
    for k, v in pairs(s) do c[k] = type(v) == "userdata" and v:clone() or v end
    st[i] = c
  end
  return {state = st, kind = self.kind, param_groups = {self:_group_dict(#self.params)}}
end

-- The one parameter group of a state dict: a copy of the options, and
-- params = {1, ..., n} (n parameters' indices).
function Optimizer:_group_dict(n)
  local group, idx = copy_opts(self.opts), {}
  for i = 1, n do idx[i] = i end
  group.params = idx
  return group
end

-- The state entries that are tensors, and those each parameter's state must hold.
local STATE_TENSORS = {momentum_buffer = true, exp_avg = true, exp_avg_sq = true, max_exp_avg_sq = true}
local function required_tensors(self)
  if self.kind == "SGD" then return {} end
  return self.opts.amsgrad and {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"} or {"exp_avg", "exp_avg_sq"}
end

-- Returns a copy of the loaded state s of parameter i, its tensors in the
-- parameter's dtype (as torch casts them); EINVAL naming what does not fit.
-- With `dry` only checks (the result holds s's own tensors).
local function load_entry(self, F, i, s, dry)
  local p, is_tensor = self.params[i], require("crun.serialize").is_tensor
  if math.type(i) ~= "integer" or not p then
    O.fail("EINVAL: %s: state for parameter %s, the optimizer has %d", F, tostring(i), #self.params)
  end
  if type(s) ~= "table" then O.fail("EINVAL: %s: state of parameter %d is a %s, a table is expected", F, i, type(s)) end
  local c = {}
  for k, v in pairs(s) do
    if is_tensor(v) then
      if v:numel() ~= p:numel() then
        O.fail("EINVAL: %s: %s of parameter %d has %d elements, the parameter %d", F, tostring(k), i, v:numel(), p:numel())
      end
      c[k] = dry and v or v:dtype() == p:dtype() and v:clone() or v:to(p:dtype())
    elseif STATE_TENSORS[k] then
      O.fail("EINVAL: %s: %s of parameter %d is a %s, a tensor is expected", F, k, i, type(v))
    else
      c[k] = v
    end
  end
  for _, k in ipairs(required_tensors(self)) do
    if not c[k] then O.fail("EINVAL: %s: the state of parameter %d has no %s", F, i, k) end
  end
  if self.kind ~= "SGD" and (math.type(c.step) ~= "integer" or c.step < 0) then
    O.fail("EINVAL: %s: step of parameter %d must be an integer >= 0, got %s", F, i, tostring(c.step))
  end
  return c
end

-- The options of state dict param_groups (torch's form, one group): a copy of
-- the group less params, every option the optimizer has present with a value
-- of the same type; EINVAL otherwise, or when the group's parameter count differs.
local function loaded_opts(self, F, groups)
  if type(groups) ~= "table" or #groups ~= 1 or type(groups[1]) ~= "table" then
    O.fail("EINVAL: %s: param_groups must be a list of one group (crun's optimizers have one), got %s", F,
      type(groups) == "table" and #groups .. " groups" or type(groups))
  end
  local g = groups[1]
  if g.params ~= nil and (type(g.params) ~= "table" or #g.params ~= #self.params) then
    O.fail("EINVAL: %s: the state's parameter group has %s parameters, the optimizer's %d", F,
      type(g.params) == "table" and tostring(#g.params) or type(g.params), #self.params)
  end
  local o = copy_opts(g)
  for k, v in pairs(self.opts) do
    if type(o[k]) ~= type(v) then
      O.fail("EINVAL: %s: option %s of the state's parameter group is a %s, the optimizer's a %s", F, k, type(o[k]), type(v))
    end
  end
  return o
end

--- Restores a state_dict(): the buffers and step counts, copied into fresh
-- tensors, and the group's options when it has param_groups (lr, momentum,
-- betas, ...: torch restores them, so a resumed run goes on at the saved
-- rate). Everything is checked first (EINVAL, the optimizer unchanged).
function Optimizer:load_state_dict(sd)
  local F = self.kind .. ":load_state_dict"
  if type(sd) ~= "table" or sd.kind ~= self.kind or type(sd.state) ~= "table" then
    O.fail("EINVAL: %s: expected a %s state, got %s", F, self.kind,
      type(sd) ~= "table" and type(sd) or sd.kind ~= self.kind and tostring(sd.kind) or "a state of type " .. type(sd.state))
  end
  self:_refresh()
  local opts = sd.param_groups == nil and self.opts or loaded_opts(self, F, sd.param_groups)
  local view = setmetatable({opts = opts}, {__index = self}) -- (amsgrad's buffers are the loaded opts')
  local state = {}
  for i, s in pairs(sd.state) do state[i] = load_entry(view, F, i, s) end
  self.state, self.opts = state, opts
end

-- For wrappers holding part of a model (ZeroRedundancyOptimizer): checks
-- every entry of the state sd against `params`, the whole model's list, as
-- load_state_dict would, copying nothing; F names the caller in errors.
function Optimizer:_check_state(sd, params, F)
  local whole = setmetatable({params = params}, {__index = self})
  for i, s in pairs(sd.state) do load_entry(whole, F, i, s, true) end
end

-- ---------------------------------------------------------------- SGD

local SGD = setmetatable({}, {__index = Optimizer})
SGD.__index = optim.index_with_groups(SGD)

--- SGD(model | params, grads, {lr=, momentum=0, dampening=0, weight_decay=0, nesterov=false, maximize=false}):
--- lr is required; options are checked as Adam's are (see below).
function optim.SGD(a, b, c)
  local params, grads, o, module = unpack_args("SGD", a, b, c)
  o = O.check(SGD_OPTS, "SGD", o)
  if o.lr == nil then O.fail("EINVAL: SGD: lr is required") end
  local self = setmetatable({kind = "SGD", params = params, grads = grads, module = module, state = {},
    opts = {lr = O.num("SGD", "lr", o.lr, 0), momentum = O.num("SGD", "momentum", o.momentum, 0, 0),
      dampening = O.num("SGD", "dampening", o.dampening, nil, 0),
      weight_decay = O.num("SGD", "weight_decay", o.weight_decay, 0, 0),
      nesterov = O.bool("SGD", "nesterov", o.nesterov, false), maximize = O.bool("SGD", "maximize", o.maximize, false)}}, SGD)
  if self.opts.nesterov and (self.opts.momentum <= 0 or self.opts.dampening ~= 0) then
    O.fail("EINVAL: SGD: nesterov momentum requires a momentum > 0 and zero dampening")
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
    if o.momentum ~= 0 and not (s and s.momentum_buffer) then -- (a loaded state may have none)
      s = s or {}
      s.momentum_buffer, self.state[i], first = T().zeros_like(p), s, true
    end
    K.optim_sgd(p, self.grads[i], s and s.momentum_buffer, o, first)
  end
end

-- ---------------------------------------------------------------- Adam / AdamW

local Adam = setmetatable({}, {__index = Optimizer})
Adam.__index = optim.index_with_groups(Adam)

-- Returns beta1, beta2 of betas, a pair of numbers in [0, 1) (EINVAL naming
-- fname otherwise).
local function check_betas(fname, betas)
  if type(betas) ~= "table" or #betas ~= 2 then
    O.fail("EINVAL: %s: betas must be a pair {beta1, beta2}, got %s", fname, tostring(betas))
  end
  for i = 1, 2 do
    local bi = O.num(fname, "betas[" .. i .. "]", betas[i], 0)
    if bi >= 1 then O.fail("EINVAL: %s: betas[%d] must be in [0, 1), got %s", fname, i, tostring(bi)) end
  end
  return betas[1], betas[2]
end

-- opts.betas is what step() reads, as torch's group["betas"]: param_groups
-- and a replaced opts can change it between steps.
local function adam(kind, decoupled, default_wd, a, b, c)
  local params, grads, o, module = unpack_args(kind, a, b, c)
  o = O.check(ADAM_OPTS, kind, o)
  local b1, b2 = check_betas(kind, o.betas or {0.9, 0.999})
  return setmetatable({kind = kind, params = params, grads = grads, module = module, state = {}, decoupled = decoupled,
    opts = {lr = O.num(kind, "lr", o.lr, 0, 1e-3), betas = {b1, b2},
      eps = O.num(kind, "eps", o.eps, 0, 1e-8),
      weight_decay = O.num(kind, "weight_decay", o.weight_decay, 0, default_wd),
      amsgrad = O.bool(kind, "amsgrad", o.amsgrad, false), maximize = O.bool(kind, "maximize", o.maximize, false)}}, Adam)
end

--- Adam(model | params, grads, {lr=1e-3, betas={0.9, 0.999}, eps=1e-8, weight_decay=0, amsgrad=false,
--- maximize=false}). Unknown options raise EINVAL; torch's foreach/fused/
--- differentiable/capturable are accepted and reported once as inert; Torch7's
--- learningRate/weightDecay/epsilon are aliases of lr/weight_decay/eps.
function optim.Adam(a, b, c) return adam("Adam", false, 0, a, b, c) end

--- AdamW: Adam with decoupled weight decay (default 1e-2), as torch.optim.AdamW.
function optim.AdamW(a, b, c) return adam("AdamW", true, 1e-2, a, b, c) end

-- The C kernel's options for this step: opts with betas split, and AdamW's
-- decoupled decay (the optimizer's kind, not an option a replaced opts could drop).
local function kernel_opts(self)
  local o = self.opts
  local b1, b2 = check_betas(self.kind .. ":step", o.betas)
  return {lr = o.lr, beta1 = b1, beta2 = b2, eps = o.eps, weight_decay = o.weight_decay, decoupled = self.decoupled,
    amsgrad = o.amsgrad, maximize = o.maximize}
end

function Adam:step()
  self:_refresh()
  local o = kernel_opts(self)
  for i, p in ipairs(self.params) do
    local s = self.state[i]
    if not s then
      s = {step = 0, exp_avg = T().zeros_like(p), exp_avg_sq = T().zeros_like(p)}
      if o.amsgrad then s.max_exp_avg_sq = T().zeros_like(p) end
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

-- with the timeline on, every step is a span (lua/crun/trace.lua)
require("crun.trace")._wrap(SGD, "step", "SGD", "optim")
require("crun.trace")._wrap(Adam, "step", "Adam", "optim")

--- torch.optim.lr_scheduler's schedules (crun/lr_scheduler.lua).
optim.lr_scheduler = require "crun.lr_scheduler"

return optim
