--- crun.optim.lr_scheduler: torch.optim.lr_scheduler's schedules, on any crun
-- optimizer (SGD, Adam, AdamW, ZeroRedundancyOptimizer: what they step with
-- is opt.opts.lr).
--
--   local sched = crun.optim.lr_scheduler.StepLR(opt, {step_size = 30, gamma = 0.1})
--   for epoch = 1, epochs do train_one_epoch(); sched:step() end
--   local plateau = crun.optim.lr_scheduler.ReduceLROnPlateau(opt, {patience = 2})
--   plateau:step(val_loss)
--
-- Each step computes the new rate the way torch's does (the same recursive
-- formulas, so the rates match torch's to the last bit or so, and schedulers
-- chain on one optimizer as torch's do). Creating one sets the rate of epoch
-- 0 (LinearLR and ConstantLR scale it at once, as torch). get_last_lr() returns
-- {lr} (torch: one rate per parameter group; crun's optimizers have one).
-- state_dict() / load_state_dict() carry the position for a resumed run
-- (a lambda is not saved, as torch does not save a plain function).
local S = {}
local O = require "crun.opts"

local Scheduler = {}
Scheduler.__index = Scheduler

local function check_optimizer(fname, opt)
  if type(opt) ~= "table" or type(opt.opts) ~= "table" or type(opt.opts.lr) ~= "number" then
    O.fail("EINVAL: %s: a crun.optim optimizer is expected (one with opts.lr), got %s", fname, type(opt))
  end
end

-- A scheduler of class cls on opt; rule(self, lr) gives the rate of the new
-- self.last_epoch from the current one.
local function new(cls, fname, opt, fields)
  check_optimizer(fname, opt)
  local self = setmetatable(fields, cls)
  self.optimizer, self.name = opt, fname
  if opt.initial_lr == nil then opt.initial_lr = opt.opts.lr end -- torch's group["initial_lr"]
  self.base_lr = opt.initial_lr
  self.last_epoch = -1
  self:step()
  return self
end

--- Advances one epoch (or iteration, if you step per batch) and sets the
-- optimizer's rate. torch's step(epoch) form is deprecated there and refused here.
function Scheduler:step(epoch)
  if epoch ~= nil then
    O.fail("EINVAL: %s:step: an epoch argument is not supported (torch deprecates it); call step() once per epoch",
      self.name)
  end
  self.last_epoch = self.last_epoch + 1
  local lr = self:_rule(self.optimizer.opts.lr)
  self.optimizer.opts.lr = lr
  self.last_lr = lr
end

function Scheduler:get_last_lr() return {self.last_lr} end

local STATE_KEYS = {"last_epoch", "base_lr", "last_lr", "best", "num_bad_epochs", "cooldown_counter"}

--- The scheduler's position, for crun.save.
function Scheduler:state_dict()
  local sd = {kind = self.name}
  for _, k in ipairs(STATE_KEYS) do sd[k] = self[k] end
  return sd
end

--- Restores state_dict()'s position (and the optimizer's rate with it).
function Scheduler:load_state_dict(sd)
  if type(sd) ~= "table" or sd.kind ~= self.name or math.type(sd.last_epoch) ~= "integer" then
    O.fail("EINVAL: %s:load_state_dict: a state_dict() of a %s is expected, got %s", self.name, self.name,
      type(sd) == "table" and tostring(sd.kind) or type(sd))
  end
  for _, k in ipairs(STATE_KEYS) do self[k] = sd[k] end
  if self.last_lr then self.optimizer.opts.lr = self.last_lr end
end

local function class(name)
  local c = setmetatable({}, {__index = Scheduler})
  c.__index = c
  c.__name = "crun.optim.lr_scheduler." .. name
  return c
end

local function pos(fname, what, v, def)
  v = v == nil and def or v
  if type(v) ~= "number" or v ~= v or v <= 0 or v == math.huge then
    O.fail("EINVAL: %s: %s must be a number > 0, got %s", fname, what, tostring(v))
  end
  return v
end

--- StepLR(opt, {step_size=, gamma=0.1}): the rate times gamma every step_size epochs.
local StepLR = class("StepLR")
local STEP = O.spec{"step_size", "gamma", inert = {last_epoch = "crun schedulers start at epoch 0", verbose = "deprecated in torch"}}
function S.StepLR(opt, opts)
  opts = O.check(STEP, "StepLR", opts)
  return new(StepLR, "StepLR", opt, {step_size = O.int("StepLR", "step_size", opts.step_size, 1),
    gamma = pos("StepLR", "gamma", opts.gamma, 0.1)})
end
function StepLR:_rule(lr)
  if self.last_epoch == 0 or self.last_epoch % self.step_size ~= 0 then return lr end
  return lr * self.gamma
end

--- MultiStepLR(opt, {milestones={...}, gamma=0.1}): times gamma at each milestone epoch.
local MultiStepLR = class("MultiStepLR")
local MULTI = O.spec{"milestones", "gamma", inert = STEP.inert}
function S.MultiStepLR(opt, opts)
  opts = O.check(MULTI, "MultiStepLR", opts)
  local count = {}
  if type(opts.milestones) ~= "table" then
    O.fail("EINVAL: MultiStepLR: milestones must be a list of epochs, got %s", type(opts.milestones))
  end
  for i, m in ipairs(opts.milestones) do
    O.int("MultiStepLR", "milestone " .. i, m, 1)
    count[m] = (count[m] or 0) + 1
  end
  return new(MultiStepLR, "MultiStepLR", opt, {milestones = count, gamma = pos("MultiStepLR", "gamma", opts.gamma, 0.1)})
end
function MultiStepLR:_rule(lr)
  local k = self.milestones[self.last_epoch]
  return k and lr * self.gamma ^ k or lr
end

--- ExponentialLR(opt, {gamma=}): times gamma every epoch.
local ExponentialLR = class("ExponentialLR")
local EXP = O.spec{"gamma", inert = STEP.inert}
function S.ExponentialLR(opt, opts)
  opts = O.check(EXP, "ExponentialLR", opts)
  if opts.gamma == nil then O.fail("EINVAL: ExponentialLR: gamma is required") end
  return new(ExponentialLR, "ExponentialLR", opt, {gamma = pos("ExponentialLR", "gamma", opts.gamma)})
end
function ExponentialLR:_rule(lr) return self.last_epoch == 0 and lr or lr * self.gamma end

--- CosineAnnealingLR(opt, {T_max=, eta_min=0}): from the base rate down to
-- eta_min along half a cosine over T_max epochs (and back up after, as torch).
local Cosine = class("CosineAnnealingLR")
local COS = O.spec{"T_max", "eta_min", inert = STEP.inert}
function S.CosineAnnealingLR(opt, opts)
  opts = O.check(COS, "CosineAnnealingLR", opts)
  local eta = opts.eta_min or 0
  if type(eta) ~= "number" or eta ~= eta or eta < 0 then
    O.fail("EINVAL: CosineAnnealingLR: eta_min must be a number >= 0, got %s", tostring(eta))
  end
  return new(Cosine, "CosineAnnealingLR", opt, {T_max = O.int("CosineAnnealingLR", "T_max", opts.T_max, 1), eta_min = eta})
end
function Cosine:_rule(lr)
  local e, T, base, eta = self.last_epoch, self.T_max, self.base_lr, self.eta_min
  if e == 0 then return lr end
  if (e - 1 - T) % (2 * T) == 0 then return lr + (base - eta) * (1 - math.cos(math.pi / T)) / 2 end
  return (1 + math.cos(math.pi * e / T)) / (1 + math.cos(math.pi * (e - 1) / T)) * (lr - eta) + eta
end

--- LinearLR(opt, {start_factor=1/3, end_factor=1, total_iters=5}): the factor
-- goes linearly from start_factor to end_factor over total_iters epochs.
local LinearLR = class("LinearLR")
local LIN = O.spec{"start_factor", "end_factor", "total_iters", inert = STEP.inert}
function S.LinearLR(opt, opts)
  opts = O.check(LIN, "LinearLR", opts)
  local s, e = opts.start_factor or 1 / 3, opts.end_factor or 1
  if type(s) ~= "number" or not (s > 0 and s <= 1) then
    O.fail("EINVAL: LinearLR: start_factor must be in (0, 1], got %s", tostring(s))
  end
  if type(e) ~= "number" or not (e >= 0 and e <= 1) then
    O.fail("EINVAL: LinearLR: end_factor must be in [0, 1], got %s", tostring(e))
  end
  return new(LinearLR, "LinearLR", opt, {start_factor = s, end_factor = e,
    total_iters = O.int("LinearLR", "total_iters", opts.total_iters, 1, 5)})
end
function LinearLR:_rule(lr)
  local e, s, f, n = self.last_epoch, self.start_factor, self.end_factor, self.total_iters
  if e == 0 then return lr * s end
  if e > n then return lr end
  return lr * (1 + (f - s) / (n * s + (e - 1) * (f - s)))
end

--- ConstantLR(opt, {factor=1/3, total_iters=5}): the rate times factor for
-- the first total_iters epochs.
local ConstantLR = class("ConstantLR")
local CONST = O.spec{"factor", "total_iters", inert = STEP.inert}
function S.ConstantLR(opt, opts)
  opts = O.check(CONST, "ConstantLR", opts)
  local f = opts.factor or 1 / 3
  if type(f) ~= "number" or not (f >= 0 and f <= 1) then
    O.fail("EINVAL: ConstantLR: factor must be in [0, 1], got %s", tostring(f))
  end
  return new(ConstantLR, "ConstantLR", opt, {factor = f, total_iters = O.int("ConstantLR", "total_iters", opts.total_iters, 1, 5)})
end
function ConstantLR:_rule(lr)
  if self.last_epoch == 0 then return lr * self.factor end
  if self.last_epoch ~= self.total_iters then return lr end
  return lr * (1 / self.factor)
end

--- LambdaLR(opt, fn): the base rate times fn(epoch).
local LambdaLR = class("LambdaLR")
function S.LambdaLR(opt, fn)
  if type(fn) ~= "function" then O.fail("EINVAL: LambdaLR: lr_lambda must be a function, got %s", type(fn)) end
  return new(LambdaLR, "LambdaLR", opt, {fn = fn})
end
function LambdaLR:_rule() return self.base_lr * self.fn(self.last_epoch) end

--- MultiplicativeLR(opt, fn): the rate times fn(epoch) every epoch after the first.
local MultLR = class("MultiplicativeLR")
function S.MultiplicativeLR(opt, fn)
  if type(fn) ~= "function" then O.fail("EINVAL: MultiplicativeLR: lr_lambda must be a function, got %s", type(fn)) end
  return new(MultLR, "MultiplicativeLR", opt, {fn = fn})
end
function MultLR:_rule(lr) return self.last_epoch > 0 and lr * self.fn(self.last_epoch) or lr end

--- ReduceLROnPlateau(opt, {mode="min", factor=0.1, patience=10, threshold=1e-4,
-- threshold_mode="rel", cooldown=0, min_lr=0, eps=1e-8}): step(metric) after
-- each evaluation; the rate times factor once the metric has not improved
-- for more than patience epochs (torch's rules, to the comparison).
local Plateau = class("ReduceLROnPlateau")
local PLATEAU = O.spec{"mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "min_lr", "eps",
  inert = {verbose = "deprecated in torch"}}
function S.ReduceLROnPlateau(opt, opts)
  local F = "ReduceLROnPlateau"
  check_optimizer(F, opt)
  opts = O.check(PLATEAU, F, opts)
  local mode, tmode = opts.mode or "min", opts.threshold_mode or "rel"
  if mode ~= "min" and mode ~= "max" then O.fail("EINVAL: %s: mode must be \"min\" or \"max\", got %s", F, tostring(mode)) end
  if tmode ~= "rel" and tmode ~= "abs" then
    O.fail("EINVAL: %s: threshold_mode must be \"rel\" or \"abs\", got %s", F, tostring(tmode))
  end
  local factor = opts.factor or 0.1
  if type(factor) ~= "number" or not (factor >= 0 and factor < 1) then
    O.fail("EINVAL: %s: factor must be in [0, 1), got %s", F, tostring(factor))
  end
  local self = setmetatable({optimizer = opt, name = F, mode = mode, threshold_mode = tmode, factor = factor,
    patience = O.int(F, "patience", opts.patience, 0, 10), threshold = O.num(F, "threshold", opts.threshold, 0, 1e-4),
    cooldown = O.int(F, "cooldown", opts.cooldown, 0, 0), min_lr = O.num(F, "min_lr", opts.min_lr, 0, 0),
    eps = O.num(F, "eps", opts.eps, 0, 1e-8), last_epoch = 0, num_bad_epochs = 0, cooldown_counter = 0,
    best = mode == "min" and math.huge or -math.huge, last_lr = opt.opts.lr}, Plateau)
  return self
end
function Plateau:_better(a)
  local b, t = self.best, self.threshold
  if self.mode == "min" then return self.threshold_mode == "rel" and a < b * (1 - t) or (self.threshold_mode == "abs" and a < b - t) end
  return self.threshold_mode == "rel" and a > b * (1 + t) or (self.threshold_mode == "abs" and a > b + t)
end
function Plateau:step(metric)
  if type(metric) ~= "number" then
    O.fail("EINVAL: ReduceLROnPlateau:step: the metric must be a number, got %s", type(metric))
  end
  self.last_epoch = self.last_epoch + 1
  if self:_better(metric) then
    self.best, self.num_bad_epochs = metric, 0
  else
    self.num_bad_epochs = self.num_bad_epochs + 1
  end
  if self.cooldown_counter > 0 then
    self.cooldown_counter = self.cooldown_counter - 1
    self.num_bad_epochs = 0
  end
  if self.num_bad_epochs > self.patience then
    local old = self.optimizer.opts.lr
    local lr = math.max(old * self.factor, self.min_lr)
    if old - lr > self.eps then self.optimizer.opts.lr = lr end
    self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
  end
  self.last_lr = self.optimizer.opts.lr
end

return S
