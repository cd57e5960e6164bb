-- crun.optim: SGD and Adam/AdamW follow torch.optim's update rules. Checked
-- against a plain Lua transcription of torch's formulas and, when Debian's
-- torch is installed, against torch.optim itself.
local tmpname = require("helpers.common").tmpname -- os.tmpname() under TMPDIR
local optim = require "crun.optim"
local each_raises = require("helpers.common").each_raises
local util = require "helpers.train_util"
local T = util.T()
local torch_ref = require "helpers.torch_ref"

local N, STEPS = 37, 7   -- 37: whole vectors of every width and a tail

local function p0(i) return 0.5 - 0.17 * i end
local function grad(i, k) return math.sin(1.3 * i + 0.7 * k) * (1 + 0.1 * k) end

local CONFIGS = {
  {kind = "SGD", lr = 0.1},
  {kind = "SGD", lr = 0.05, momentum = 0.9},
  {kind = "SGD", lr = 0.05, momentum = 0.9, dampening = 0.3, weight_decay = 0.01},
  {kind = "SGD", lr = 0.05, momentum = 0.8, nesterov = true, weight_decay = 0.02},
  {kind = "SGD", lr = 0.04, momentum = 0.7, weight_decay = 0.03, maximize = true},
  {kind = "Adam", lr = 0.01},
  {kind = "Adam", lr = 0.02, betas = {0.8, 0.99}, eps = 1e-6, weight_decay = 0.05},
  {kind = "Adam", lr = 0.02, amsgrad = true},
  {kind = "Adam", lr = 0.02, weight_decay = 0.03, amsgrad = true},
  {kind = "AdamW", lr = 0.01},
  {kind = "AdamW", lr = 0.03, weight_decay = 0.1, amsgrad = true},
  {kind = "Adam", lr = 0.02, weight_decay = 0.04, maximize = true},
  {kind = "AdamW", lr = 0.02, betas = {0.85, 0.95}, maximize = true},
}

-- torch's update rules transcribed literally, element by element.
local function reference(c)
  local p, buf, m, v, vmax = {}, {}, {}, {}, {}
  for i = 1, N do p[i], m[i], v[i], vmax[i] = p0(i), 0, 0, 0 end
  local wd = c.weight_decay or (c.kind == "AdamW" and 0.01 or 0)
  local b1, b2 = (c.betas or {0.9, 0.999})[1], (c.betas or {0.9, 0.999})[2]
  for k = 1, STEPS do
    for i = 1, N do
      local g = grad(i, k)
      if c.maximize then g = -g end
      if c.kind == "SGD" then
        local d = g + wd * p[i]
        if (c.momentum or 0) ~= 0 then
          buf[i] = k == 1 and d or c.momentum * buf[i] + (1 - (c.dampening or 0)) * d
          d = c.nesterov and d + c.momentum * buf[i] or buf[i]
        end
        p[i] = p[i] - c.lr * d
      else
        if c.kind == "AdamW" then p[i] = p[i] * (1 - c.lr * wd) else g = g + wd * p[i] end
        m[i] = m[i] * b1 + (1 - b1) * g
        v[i] = v[i] * b2 + (1 - b2) * g * g
        local s = v[i]
        if c.amsgrad then vmax[i] = math.max(vmax[i], v[i]); s = vmax[i] end
        local denom = math.sqrt(s) / math.sqrt(1 - b2 ^ k) + (c.eps or 1e-8)
        p[i] = p[i] - (c.lr / (1 - b1 ^ k)) * m[i] / denom
      end
    end
  end
  return p
end

-- The optimizer's options of config c (every key but kind).
local function opts_of(c)
  local o = {}
  for k, v in pairs(c) do
    if k ~= "kind" then o[k] = v end
  end
  return o
end

-- Runs crun.optim for config c in dtype dt; returns the final parameters.
local function run(c, dt)
  local p, g = T.zeros({N}, dt), T.zeros({N}, dt)
  local fp, fg = util.flat(p), util.flat(g)
  for i = 1, N do fp[i] = p0(i) end
  local o = optim[c.kind]({p}, {g}, opts_of(c))
  for k = 1, STEPS do
    for i = 1, N do fg[i] = grad(i, k) end
    o:step()
  end
  return util.list(p)
end

-- torch.optim's answers for every config (torch importable): one line of
-- final parameters per config. Raises when the script fails.
local function torch_answers()
  local lines = {}
  for _, c in ipairs(CONFIGS) do
    local args = {}
    for k, v in pairs(c) do
      if k ~= "kind" then
        local val = type(v) == "table" and string.format("(%.17g, %.17g)", v[1], v[2]) or tostring(v)
        if val == "true" then val = "True" end
        args[#args + 1] = k .. "=" .. val
      end
    end
    lines[#lines + 1] = string.format("run(torch.optim.%s, dict(%s))", c.kind, table.concat(args, ", "))
  end
  local out = torch_ref.run(string.format([[
import math
import torch
def run(cls, kw):
    p = torch.tensor([0.5 - 0.17 * i for i in range(1, %d)], dtype=torch.float64, requires_grad=True)
    o = cls([p], **kw)
    for k in range(1, %d):
        p.grad = torch.tensor([math.sin(1.3 * i + 0.7 * k) * (1 + 0.1 * k) for i in range(1, %d)], dtype=torch.float64)
        o.step()
    print(" ".join(repr(float(x)) for x in p.detach()))
%s
]], N + 1, STEPS + 1, N + 1, table.concat(lines, "\n")))
  local res = {}
  for line in out:gmatch("[^\n]+") do
    local r = {}
    for w in line:gmatch("%S+") do r[#r + 1] = assert(tonumber(w), line) end
    assert.are.equal(N, #r, line)
    res[#res + 1] = r
  end
  return res
end

describe("optim update rules", function()
  for ci, c in ipairs(CONFIGS) do
    it(string.format("%s #%d matches torch's formulas in float64 and float32", c.kind, ci), function()
      local ref = reference(c)
      assert.is_true(util.max_rel_err(run(c, "float64"), ref) < 1e-12)
      assert.is_true(util.max_rel_err(run(c, "float32"), ref) < 1e-5)
    end)
  end

  it("matches torch.optim itself", function()
    local why = torch_ref.missing()
    if why then pending(why) return end
    local ans = torch_answers()
    assert.are.equal(#CONFIGS, #ans)
    for ci, c in ipairs(CONFIGS) do
      local e = util.max_rel_err(run(c, "float64"), ans[ci])
      assert.is_true(e < 1e-12, string.format("%s #%d differs from torch by %g", c.kind, ci, e))
    end
  end)

  it("takes a module and zero_grad clears its gradients", function()
    local nn = require "crun.nn"
    local m = nn.Linear(2, 2)
    m.gradWeight:fill(1)
    local o = optim.SGD(m, {lr = 0.5})
    local before = util.list(m.weight)
    o:step()
    local after = util.list(m.weight)
    for i = 1, 4 do assert.is_true(math.abs(before[i] - 0.5 - after[i]) < 1e-6) end
    o:zero_grad()
    for _, v in ipairs(util.list(m.gradWeight)) do assert.are.equal(0, v) end
  end)

  -- zero_grad(true) (torch's set_to_none=True) was taken and zero-filled: torch then skips a parameter that the
  -- next backward does not reach (no weight decay, no momentum), crun stepped it
  it("zero_grad(false) zero-fills; torch's set_to_none = true is ENOTSUP, the gradients left as they were", function()
    local nn = require "crun.nn"
    local m = nn.Linear(2, 2)
    local objs = {{m, "nn.Linear:zero_grad"}, {optim.SGD(m, {lr = 0.5}), "SGD:zero_grad"},
                  {optim.Adam(m), "Adam:zero_grad"}, {optim.AdamW(m), "AdamW:zero_grad"}}
    for _, c in ipairs(objs) do
      for _, arg in ipairs{true, {set_to_none = true}} do
        m.gradWeight:fill(1.5)
        local ok, err = pcall(c[1].zero_grad, c[1], arg)
        assert.is_false(ok)
        assert.matches("^ENOTSUP: " .. c[2]:gsub("%.", "%%.") .. ": set_to_none = true is not implemented: crun's " ..
          "gradients are tensors that backward accumulates into, and zero_grad zero%-fills them", err)
        assert.are.same({1.5, 1.5, 1.5, 1.5}, util.list(m.gradWeight))
      end
      for _, arg in ipairs{false, {set_to_none = false}, {}} do
        m.gradWeight:fill(1.5)
        c[1]:zero_grad(arg)
        assert.are.same({0, 0, 0, 0}, util.list(m.gradWeight))
      end
      local ok, err = pcall(c[1].zero_grad, c[1], 1)
      assert.is_false(ok)
      assert.matches("^EINVAL: " .. c[2]:gsub("%.", "%%.") .. ": set_to_none must be true or false, got 1", err)
    end
  end)

  -- optim.c: the updates run with FTZ/DAZ, so that state decaying under zero
  -- gradients becomes zero instead of a subnormal float (slow on the CPU);
  -- CRUN_OPTIM_DENORMALS=ieee keeps IEEE behaviour
  it("flushes momentum that decays into subnormals to zero (IEEE with CRUN_OPTIM_DENORMALS=ieee)", function()
    local script = [[
      local optim = require "crun.optim"
      local T = require "crun.tensor"
      local p, g = T.zeros({5}, "float32"), T.ones({5}, "float32")
      local adam = optim.Adam({p}, {g}, {lr = 1e-3})
      local q, h = T.ones({5}, "float32"), T.ones({5}, "float32")
      local sgd = optim.SGD({q}, {h}, {lr = 1e-3, momentum = 0.5})
      adam:step(); sgd:step()
      g:zero(); h:zero()
      -- 0.1 * 0.9^900 and 0.5^135 are below 1.2e-38, the smallest normal
      -- float32, and above 1.4e-45, the smallest subnormal one
      for k = 1, 900 do adam:step(); if k <= 135 then sgd:step() end end
      local m, b = adam.state[1].exp_avg[1], sgd.state[1].momentum_buffer[1]
      print(m == 0 and "zero" or (m > 0 and m < 1.18e-38) and "subnormal" or tostring(m),
            b == 0 and "zero" or (b > 0 and b < 1.18e-38) and "subnormal" or tostring(b))
    ]]
    local f = tmpname()
    local h = io.open(f, "w"); h:write(script); h:close()
    local function run(env)
      local pipe = io.popen(env .. " lua5.4 " .. f .. " 2>&1")
      local out = pipe:read("a"); pipe:close()
      return out
    end
    local flushed, ieee = run(""), run("CRUN_OPTIM_DENORMALS=ieee")
    os.remove(f)
    assert.are.equal("zero\tzero\n", flushed)
    assert.are.equal("subnormal\tsubnormal\n", ieee)
  end)

  it("saves and restores its state", function()
    local c = {lr = 0.01}
    local p, g = T.zeros({3}, "float64"), T.ones({3}, "float64")
    local o = optim.Adam({p}, {g}, c)
    o:step(); o:step()
    local sd = o:state_dict()
    local p2 = p:clone()
    local o2 = optim.Adam({p2}, {g}, c)
    o2:load_state_dict(sd)
    o:step(); o2:step()
    assert.are.same(util.list(p), util.list(p2))
    assert.are.equal(3, o2.state[1].step)
  end)

  it("state_dict carries the group's options, as torch's param_groups, and load_state_dict restores them", function()
    -- a run that lowered its rate and changed betas, saved, then resumed by an optimizer built as at the start
    local p, g = T.tensor({0.5, -1.25, 2}, "float64"), T.tensor({0.3, -0.7, 1.1}, "float64")
    local o = optim.AdamW({p}, {g}, {lr = 0.1, weight_decay = 0.2})
    o:step()
    o.param_groups[1].lr, o.param_groups[1].betas = 0.01, {0.5, 0.8}
    local path = tmpname()
    require("crun").save(path, o:state_dict())
    local sd = require("crun").load(path)
    os.remove(path)
    assert.are.same({1}, sd.param_groups[1].params)
    local p2 = p:clone()
    local o2 = optim.AdamW({p2}, {g}, {lr = 0.1, weight_decay = 0.2})
    o2:load_state_dict(sd)
    assert.are.equal(0.01, o2.param_groups[1].lr)
    assert.are.same({0.5, 0.8}, o2.param_groups[1].betas)
    -- step 2 by hand from the saved state: AdamW's decay, then Adam's rule with lr 0.01 and betas {0.5, 0.8}
    local x, m1, v1, want = util.list(p2), util.list(sd.state[1].exp_avg), util.list(sd.state[1].exp_avg_sq), {}
    for i, gi in ipairs{0.3, -0.7, 1.1} do
      local m, v = 0.5 * m1[i] + 0.5 * gi, 0.8 * v1[i] + 0.2 * gi * gi
      want[i] = x[i] * (1 - 0.01 * 0.2) - (0.01 / (1 - 0.5 ^ 2)) * m / (math.sqrt(v) / math.sqrt(1 - 0.8 ^ 2) + 1e-8)
    end
    o:step(); o2:step()
    assert.are.same(util.list(p), util.list(p2))
    for i, w in ipairs(want) do
      assert.is_true(math.abs(util.list(p2)[i] - w) < 1e-14, "element " .. i .. ": " .. util.list(p2)[i] .. " vs " .. w)
    end
    -- a group for another parameter count, or with an option of the wrong type, is refused and nothing changes
    local bad = o2:state_dict()
    bad.param_groups[1].params = {1, 2}
    local ok, err = pcall(o2.load_state_dict, o2, bad)
    assert.is_false(ok)
    assert.matches("^EINVAL: AdamW:load_state_dict: the state's parameter group has 2 parameters, the optimizer's 1", err)
    bad = o2:state_dict()
    bad.param_groups[1].lr = "0.5"
    ok, err = pcall(o2.load_state_dict, o2, bad)
    assert.is_false(ok)
    assert.matches("^EINVAL: AdamW:load_state_dict: option lr of the state's parameter group is a string", err)
    assert.are.equal(0.01, o2.opts.lr)
    -- a state without param_groups (an older crun's) keeps the optimizer's options
    local s = optim.SGD({p}, {g}, {lr = 0.25, momentum = 0.5})
    s:load_state_dict({kind = "SGD", state = {}})
    assert.are.equal(0.25, s.opts.lr)
  end)

  it("load_state_dict keeps its state when refused, casts tensors to the parameter's dtype, and SGD "
    .. "starts a missing momentum buffer", function()
    local p, g = T.zeros({3}, "float64"), T.ones({3}, "float64")
    local o = optim.Adam({p}, {g})
    o:step()
    local before = o.state[1]
    assert.has_error(function() o:load_state_dict({kind = "Adam", state = {{step = 1, exp_avg = T.zeros({3}),
      exp_avg_sq = T.zeros({3})}, {}}}) end)
    assert.are.equal(before, o.state[1])
    o:load_state_dict({kind = "Adam", state = {{step = 2, exp_avg = T.ones({3}), exp_avg_sq = T.ones({3})}}})
    assert.are.equal("float64", o.state[1].exp_avg:dtype())
    o:step()
    assert.are.equal(3, o.state[1].step)
    local s = optim.SGD({p}, {g}, {lr = 0.5, momentum = 0.9})
    s:load_state_dict({kind = "SGD", state = {{}}})
    s:step()
    assert.are.same({1, 1, 1}, util.list(s.state[1].momentum_buffer))
  end)

  -- torch's SGD(model.parameters(), lr=...) was EINVAL ("a module, or lists of
  -- params and grads of equal length"); clip_grad_norm_(model:parameters())
  -- clipped the parameters themselves
  it("takes torch's (model:parameters(), opts), stepping with the gradients the module holds at each step", function()
    local nn = require "crun.nn"
    local a, b = nn.Linear(3, 2, {seed = 8}), nn.Linear(3, 2, {seed = 8})
    local oa, ob = optim.SGD(a:parameters(), {lr = 0.5, momentum = 0.9}), optim.SGD(b, {lr = 0.5, momentum = 0.9})
    local x = T.new({{0.5, -1.25, 2}, {-0.75, 1.5, 0.25}})
    for _ = 1, 2 do
      for _, m in ipairs{a, b} do
        m:zero_grad()
        m:backward(x, m:forward(x):clone():mul(0.5):add(-0.125))
      end
      oa:step(); ob:step()
    end
    assert.is_true(a.weight:equal(b.weight) and a.bias:equal(b.bias))
    -- a gradient tensor swapped after the optimizer was built (DDP's bucket views) is the one stepped
    local g2 = T.new({-1.5, 2.25})
    a:_set_grad(2, g2)
    local before = a.bias:clone()
    optim.SGD(a:parameters(), {lr = 1}):step()
    assert.is_true(math.abs(a.bias[1] - (before[1] + 1.5)) < 1e-6 and math.abs(a.bias[2] - (before[2] - 2.25)) < 1e-6)
    -- clip_grad_norm_ of the parameters' list clips their gradients, not the parameters
    local w = a.weight:clone()
    a.gradWeight:fill(0)
    local total = nn.utils.clip_grad_norm_(a:parameters(), 0.5)
    assert.is_true(math.abs(total - math.sqrt(1.5 ^ 2 + 2.25 ^ 2)) < 1e-6)
    assert.is_true(a.weight:equal(w))
    assert.is_true(math.abs(a.gradBias[1] * 2.25 + a.gradBias[2] * 1.5) < 1e-6)
    assert.is_true(math.abs(math.sqrt(a.gradBias[1] ^ 2 + a.gradBias[2] ^ 2) - 0.5) < 1e-5)
  end)

  it("rejects bad arguments with EINVAL", function()
    local p, g = T.zeros({3}), T.zeros({3})
    local cases = {
      {function() optim.SGD({p}, {g}, {}) end, "^EINVAL: SGD: lr is required"},
      {function() optim.SGD({p}, {g}, {lr = -1}) end, "^EINVAL: SGD: lr must be a number >= 0, got %-1"},
      {function() optim.SGD({p}, {g}, {lr = 0.1, nesterov = true}) end,
       "^EINVAL: SGD: nesterov momentum requires a momentum > 0 and zero dampening"},
      {function() optim.SGD({p}, {T.zeros({4})}, {lr = 0.1}) end,
       "^EINVAL: SGD: parameter 1 %(float32%[3%]%) and its gradient %(float32%[4%]%) differ"},
      {function() optim.SGD({p}, {g}, {lr = 0.1, momentum = "0.9"}) end, "^EINVAL: SGD: momentum must be a number"},
      {function() optim.Adam({p}, {g, g}) end, "^EINVAL: Adam: a module, or lists of params and grads"},
      -- tensors that are no module's parameters, without gradients: was "a module, or lists of params and grads"
      {function() optim.SGD({p, g}, {lr = 0.1}) end,
       "^EINVAL: SGD: 2 parameters and no gradients %(torch's SGD%(model.parameters%(%), ...%)%): crun's gradients " ..
       "are tensors of their own; pass the module, SGD%(model, opts%), or SGD%(params, grads, opts%)"},
      {function() optim.Adam({p}) end, "^EINVAL: Adam: 1 parameters and no gradients"},
      {function() optim.Adam({p}, {g}, {betas = {0.9}}) end, "^EINVAL: Adam: betas must be a pair"},
      {function() optim.Adam({p}, {g}, {betas = {0.9, 1}}) end, "^EINVAL: Adam: betas%[2%] must be in %[0, 1%)"},
      {function() optim.AdamW({p}, {g}, {eps = -1e-8}) end, "^EINVAL: AdamW: eps must be a number >= 0"},
      {function() optim.Adam({p}, {g}, {amsgrad = 1}) end, "^EINVAL: Adam: amsgrad must be true or false, got 1"},
      {function() optim.Adam({p}, {g}):load_state_dict({kind = "SGD", state = {}}) end,
       "^EINVAL: Adam:load_state_dict: expected a Adam state, got SGD"},
      -- these were taken, then failed at the next step() with bare Lua errors
      -- ("attempt to perform arithmetic on a nil value (field 'step')") or not at all
      {function() optim.Adam({p}, {g}):load_state_dict({kind = "Adam"}) end,
       "^EINVAL: Adam:load_state_dict: expected a Adam state, got a state of type nil"},
      {function() optim.Adam({p}, {g}):load_state_dict({kind = "Adam", state = {5}}) end,
       "^EINVAL: Adam:load_state_dict: state of parameter 1 is a number, a table is expected"},
      {function() optim.Adam({p}, {g}):load_state_dict({kind = "Adam", state = {x = {}}}) end,
       "^EINVAL: Adam:load_state_dict: state for parameter x, the optimizer has 1"},
      {function() optim.Adam({p}, {g}):load_state_dict({kind = "Adam", state = {[2] = {}}}) end,
       "^EINVAL: Adam:load_state_dict: state for parameter 2, the optimizer has 1"},
      {function() optim.Adam({p}, {g}):load_state_dict({kind = "Adam", state = {{exp_avg = T.zeros({3}),
         exp_avg_sq = T.zeros({3})}}}) end,
       "^EINVAL: Adam:load_state_dict: step of parameter 1 must be an integer >= 0, got nil"},
      {function() optim.Adam({p}, {g}):load_state_dict({kind = "Adam", state = {{step = 1, exp_avg = T.zeros({3})}}}) end,
       "^EINVAL: Adam:load_state_dict: the state of parameter 1 has no exp_avg_sq"},
      {function() optim.Adam({p}, {g}, {amsgrad = true}):load_state_dict({kind = "Adam", state = {{step = 1,
         exp_avg = T.zeros({3}), exp_avg_sq = T.zeros({3})}}}) end,
       "^EINVAL: Adam:load_state_dict: the state of parameter 1 has no max_exp_avg_sq"},
      {function() optim.Adam({p}, {g}):load_state_dict({kind = "Adam", state = {{step = 1, exp_avg = T.zeros({4}),
         exp_avg_sq = T.zeros({3})}}}) end,
       "^EINVAL: Adam:load_state_dict: exp_avg of parameter 1 has 4 elements, the parameter 3"},
      {function() optim.SGD({p}, {g}, {lr = 0.1, momentum = 0.9}):load_state_dict({kind = "SGD",
         state = {{momentum_buffer = 3}}}) end,
       "^EINVAL: SGD:load_state_dict: momentum_buffer of parameter 1 is a number, a tensor is expected"},
    }
    each_raises(cases)
  end)

  it("rejects unknown options naming the accepted ones, and takes Torch7's names and torch's inert ones", function()
    local p, g = T.zeros({3}, "float64"), T.zeros({3}, "float64")
    local ok, err = pcall(optim.SGD, {p}, {g}, {lr = 0.1, momentom = 0.9})
    assert.is_false(ok)
    assert.are.equal("EINVAL: SGD: unknown option 'momentom' (accepted: capturable, dampening, differentiable, "
      .. "foreach, fused, learningRate, lr, maximize, momentum, nesterov, weightDecay, weight_decay)", err)
    ok, err = pcall(optim.Adam, {p}, {g}, {lr = 0.1, momentum = 0.9})
    assert.is_false(ok)
    assert.matches("^EINVAL: Adam: unknown option 'momentum' %(accepted: amsgrad, betas, ", err)
    -- learningRate / weightDecay / epsilon are the same options as lr / weight_decay / eps
    local c = {kind = "Adam", lr = 0.02, betas = {0.8, 0.99}, eps = 1e-6, weight_decay = 0.05}
    local q, h = T.zeros({N}, "float64"), T.zeros({N}, "float64")
    local fq, fh = util.flat(q), util.flat(h)
    for i = 1, N do fq[i] = p0(i) end
    local o = optim.Adam({q}, {h}, {learningRate = 0.02, betas = {0.8, 0.99}, epsilon = 1e-6, weightDecay = 0.05,
      foreach = true, fused = false})
    for k = 1, STEPS do
      for i = 1, N do fh[i] = grad(i, k) end
      o:step()
    end
    assert.is_true(util.max_rel_err(util.list(q), reference(c)) < 1e-12)
    ok, err = pcall(optim.SGD, {p}, {g}, {lr = 0.1, learningRate = 0.2})
    assert.is_false(ok)
    assert.matches("^EINVAL: SGD: options 'learningRate' and 'lr' name the same thing with different values", err)
  end)
end)

-- torch.optim.lr_scheduler: each rate against its closed form (written from
-- torch's documentation, computed here), to 1e-12 relative.
describe("optim.lr_scheduler", function()
  local L = optim.lr_scheduler
  local function opt()
    return optim.SGD({T.zeros({1})}, {T.zeros({1})}, {lr = 0.1})
  end
  local function rates(make, n)
    local o = opt()
    local s = make(o)
    local out = {o.opts.lr}
    for _ = 1, n do o:step(); s:step(); out[#out + 1] = o.opts.lr end
    assert.are.same({out[#out]}, s:get_last_lr())
    return out
  end
  local function check(name, got, want)
    for e = 0, #got - 1 do
      local w = want(e)
      assert.is_true(math.abs(got[e + 1] - w) <= 1e-12 * math.abs(w),
        string.format("%s epoch %d: %.17g vs %.17g", name, e, got[e + 1], w))
    end
  end

  it("gives each schedule's rates, epoch by epoch", function()
    local function count_le(list, e)
      local k = 0
      for _, m in ipairs(list) do if m <= e then k = k + 1 end end
      return k
    end
    local cases = {
      {"StepLR", function(o) return L.StepLR(o, {step_size = 3, gamma = 0.5}) end,
       function(e) return 0.1 * 0.5 ^ (e // 3) end},
      {"MultiStepLR", function(o) return L.MultiStepLR(o, {milestones = {2, 5, 5, 9}, gamma = 0.3}) end,
       function(e) return 0.1 * 0.3 ^ count_le({2, 5, 5, 9}, e) end},
      {"ExponentialLR", function(o) return L.ExponentialLR(o, {gamma = 0.9}) end, function(e) return 0.1 * 0.9 ^ e end},
      {"CosineAnnealingLR", function(o) return L.CosineAnnealingLR(o, {T_max = 5, eta_min = 0.01}) end,
       function(e) return 0.01 + (0.1 - 0.01) * (1 + math.cos(math.pi * e / 5)) / 2 end},
      {"LinearLR", function(o) return L.LinearLR(o, {start_factor = 0.25, end_factor = 0.75, total_iters = 6}) end,
       function(e) return 0.1 * (0.25 + 0.5 * math.min(e, 6) / 6) end},
      {"ConstantLR", function(o) return L.ConstantLR(o, {factor = 0.5, total_iters = 4}) end,
       function(e) return e < 4 and 0.05 or 0.1 end},
      {"LambdaLR", function(o) return L.LambdaLR(o, function(e) return 1 / (e + 1) end) end,
       function(e) return 0.1 / (e + 1) end},
      {"MultiplicativeLR", function(o) return L.MultiplicativeLR(o, function() return 0.95 end) end,
       function(e) return 0.1 * 0.95 ^ e end},
    }
    for _, c in ipairs(cases) do check(c[1], rates(c[2], 12), c[3]) end
    -- two on one optimizer chain, as torch's: the product of both factors
    local o = opt()
    local a, b = L.StepLR(o, {step_size = 3, gamma = 0.5}), L.ExponentialLR(o, {gamma = 0.9})
    local got = {o.opts.lr}
    for _ = 1, 12 do a:step(); b:step(); got[#got + 1] = o.opts.lr end
    check("StepLR+ExponentialLR", got, function(e) return 0.1 * 0.5 ^ (e // 3) * 0.9 ^ e end)
  end)

  it("ReduceLROnPlateau halves the rate after patience epochs without improvement, then cools down", function()
    local o = opt()
    local s = L.ReduceLROnPlateau(o, {patience = 2, cooldown = 1, factor = 0.5})
    -- by hand: best 5, 4; then 4.5, 4.2, 4.1 are 3 bad epochs > 2 -> 0.05 and a
    -- cooldown of 1 (4.3); 3 is the new best; 3.5, 3.6, 3.7 -> 0.025; cooldown (3.8); 3.9 bad
    local want = {0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025}
    for i, m in ipairs{5, 4, 4.5, 4.2, 4.1, 4.3, 3, 3.5, 3.6, 3.7, 3.8, 3.9} do
      s:step(m)
      assert.are.equal(want[i], o.opts.lr, "step " .. i)
    end
    -- mode max with an absolute threshold: 1.05 is no improvement over 1 by 0.1
    local o2 = opt()
    local s2 = L.ReduceLROnPlateau(o2, {mode = "max", threshold_mode = "abs", threshold = 0.1, patience = 0, min_lr = 0.02})
    for _, m in ipairs{1, 1.05, 1.2, 1.25, 1.26} do s2:step(m) end
    assert.are.equal(0.02, o2.opts.lr) -- 0.1 -> 0.01 floored at min_lr, then no change below eps
  end)

  it("state_dict resumes a schedule where it stopped, and bad arguments are EINVAL", function()
    local o = opt()
    local s = L.CosineAnnealingLR(o, {T_max = 7})
    for _ = 1, 4 do s:step() end
    local sd = s:state_dict()
    local want = {}
    for i = 1, 3 do s:step(); want[i] = o.opts.lr end
    local o2 = opt()
    local s2 = L.CosineAnnealingLR(o2, {T_max = 7})
    s2:load_state_dict(sd)
    for i = 1, 3 do s2:step(); assert.are.equal(want[i], o2.opts.lr, "step " .. i) end
    local cases = {
      {function() L.StepLR(opt(), {step_size = 0}) end, "^EINVAL: StepLR: step_size must be an integer >= 1, got 0"},
      {function() L.StepLR(opt(), {step_size = 2, gamm = 0.1}) end, "^EINVAL: StepLR: unknown option 'gamm'"},
      {function() L.ExponentialLR(opt()) end, "^EINVAL: ExponentialLR: gamma is required"},
      {function() L.MultiStepLR(opt(), {milestones = {3, 1.5}}) end, "^EINVAL: MultiStepLR: milestone 2 must be an integer"},
      {function() L.LinearLR(opt(), {start_factor = 0}) end, "^EINVAL: LinearLR: start_factor must be in %(0, 1%], got 0"},
      {function() L.StepLR({}, {step_size = 2}) end, "^EINVAL: StepLR: a crun.optim optimizer is expected"},
      {function() L.ReduceLROnPlateau(opt(), {mode = "lower"}) end, '^EINVAL: ReduceLROnPlateau: mode must be "min" or "max"'},
      {function() L.ReduceLROnPlateau(opt()):step("x") end, "^EINVAL: ReduceLROnPlateau:step: the metric must be a number"},
      {function() L.StepLR(opt(), {step_size = 2}):step(3) end, "^EINVAL: StepLR:step: an epoch argument is not supported"},
      {function() s2:load_state_dict(L.StepLR(opt(), {step_size = 2}):state_dict()) end,
       "^EINVAL: CosineAnnealingLR:load_state_dict: a state_dict%(%) of a CosineAnnealingLR is expected, got StepLR"},
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok)
      assert.is_truthy(tostring(err):match(c[2]), tostring(err))
    end
  end)
end)

describe("optim param_groups", function()
  it("is torch's one-group list, whose fields read and write opt.opts", function()
    local p, g = {T.zeros({3})}, {T.zeros({3})}
    for _, make in ipairs{function() return optim.SGD(p, g, {lr = 0.1, momentum = 0.9}) end,
                          function() return optim.Adam(p, g, {lr = 0.1}) end} do
      local o = make()
      assert.are.equal(1, #o.param_groups)
      assert.are.equal(0.1, o.param_groups[1].lr)
      assert.are.equal(p[1], o.param_groups[1].params[1])
      for _, group in ipairs(o.param_groups) do group.lr = 0.025 end
      assert.are.equal(0.025, o.opts.lr)
      o.opts = {lr = 0.5, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false, maximize = false,
        betas = {0.9, 0.999}, eps = 1e-8, amsgrad = false}
      assert.are.equal(0.5, o.param_groups[1].lr) -- follows a replaced opts
    end
    -- a scheduler's rate shows there too
    local o = optim.SGD(p, g, {lr = 0.1})
    local s = optim.lr_scheduler.StepLR(o, {step_size = 1, gamma = 0.5})
    s:step()
    assert.are.equal(0.05, o.param_groups[1].lr)
  end)

  it("Adam's and AdamW's betas read and write through param_groups, as torch's group['betas']", function()
    for _, kind in ipairs{"Adam", "AdamW"} do
      local n, lr, wd = 5, 0.02, 0.1
      local p, g = T.zeros({n}, "float64"), T.zeros({n}, "float64")
      local fp, fg = util.flat(p), util.flat(g)
      for i = 1, n do fp[i] = p0(i) end
      local o = optim[kind]({p}, {g}, {lr = lr, weight_decay = wd})
      assert.are.same({0.9, 0.999}, o.param_groups[1].betas)
      -- reference: torch's rule with betas {0.9, 0.999} for steps 1-2, then {0.5, 0.8}
      local rp, m, v = {}, {}, {}
      for i = 1, n do rp[i], m[i], v[i] = p0(i), 0, 0 end
      for k = 1, 4 do
        if k == 3 then
          for _, group in ipairs(o.param_groups) do group.betas = {0.5, 0.8} end
        end
        local b1, b2 = k < 3 and 0.9 or 0.5, k < 3 and 0.999 or 0.8
        for i = 1, n do
          fg[i] = grad(i, k)
          local gi = grad(i, k)
          if kind == "AdamW" then rp[i] = rp[i] * (1 - lr * wd) else gi = gi + wd * rp[i] end
          m[i] = m[i] * b1 + (1 - b1) * gi
          v[i] = v[i] * b2 + (1 - b2) * gi * gi
          rp[i] = rp[i] - (lr / (1 - b1 ^ k)) * m[i] / (math.sqrt(v[i]) / math.sqrt(1 - b2 ^ k) + 1e-8)
        end
        o:step()
      end
      assert.are.same({0.5, 0.8}, o.param_groups[1].betas)
      for i, x in ipairs(util.list(p)) do
        assert.is_true(math.abs(x - rp[i]) < 1e-12, kind .. " element " .. i .. ": " .. x .. " vs " .. rp[i])
      end
      o.param_groups[1].betas = {0.9, 1}
      local ok, err = pcall(o.step, o)
      assert.is_false(ok)
      assert.matches("^EINVAL: " .. kind .. ":step: betas%[2%] must be in %[0, 1%), got 1", err)
    end
  end)
end)
