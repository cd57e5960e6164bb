-- Multi-rank job of zero_spec.lua:
--   crun-lua -n W spec/helpers/zero_job.lua OUTDIR run      -- cases; at W = 4 also a checkpoint
--   crun-lua -n W spec/helpers/zero_job.lua OUTDIR resume   -- resumes OUTDIR/ckpt.crun
-- Each rank trains the same model twice from the same start, with DDP + a
-- plain optimizer (the reference) and with DDP + ZeroRedundancyOptimizer,
-- and saves what it saw (errors, element counts, messages) to
-- OUTDIR/<mode>.r<rank>.crun; the spec asserts on every rank's file.
package.path = (os.getenv("CRUN_SOURCE_DIR") or ".") .. "/spec/?.lua;" .. package.path
local crun = require "crun"
local nn = require "crun.nn"
local util = require "helpers.train_util"
local T = crun.tensor

local out, mode = assert(arg[1], "usage: zero_job.lua OUTDIR run|resume"), arg[2] or "run"
crun.dist.init_process_group{backend = "auto"}
local rank, world = crun.dist.get_rank(), crun.dist.get_world_size()
local STEPS = 3

-- 45 + 9 + 36 + 4 + 12 + 3 = 109 parameters (prime: no world size divides it).
local function model(dtype, seed)
  nn.set_default_dtype(dtype)
  nn.manual_seed(seed)
  local m = nn.Sequential(nn.Linear(5, 9), nn.Tanh(), nn.Linear(9, 4), nn.ReLU(), nn.Linear(4, 3))
  nn.set_default_dtype("float32")
  return m
end

-- One forward/backward on this rank's batch of step s (signed inputs).
local function fwd_bwd(ddp, dtype, s)
  local X = T.randn({4, 5}, {seed = 7919 * s + 104729 * rank + 17, dtype = dtype})
  local y = T.new({(s + rank) % 3 + 1, (2 * s + rank + 1) % 3 + 1, (s * s + 2) % 3 + 1, (rank * rank + s) % 3 + 1}, "int64")
  local crit = nn.CrossEntropyCriterion()
  local o = ddp:forward(X)
  crit:forward(o, y)
  ddp:backward(X, crit:backward(o, y))
end

local function train(ddp, opt, dtype, first, last)
  for s = first, last do
    opt:zero_grad()
    fwd_bwd(ddp, dtype, s)
    opt:step()
  end
end

-- Largest relative difference between two parameter lists.
local function params_err(a, b)
  local m = 0
  for i = 1, #a do m = math.max(m, util.max_rel_err(a[i], b[i])) end
  return m
end

-- Largest difference between two optimizer states {[i] = {k = tensor|number}};
-- also counts entries and notes a key present in one only.
local function state_err(a, b)
  local m, n, missing = 0, 0, nil
  for i, sa in pairs(a) do
    n = n + 1
    local sb = b[i]
    if not sb then missing = "entry " .. i
    else
      for k, v in pairs(sa) do
        if sb[k] == nil then missing = k .. " of " .. i
        elseif type(v) == "userdata" then m = math.max(m, util.max_rel_err(v, sb[k]))
        else m = math.max(m, math.abs(v - sb[k])) end
      end
    end
  end
  for i in pairs(b) do if not a[i] then missing = "entry " .. i end end
  return m, n, missing
end

local CLASSES = {sgd = crun.optim.SGD, adam = crun.optim.Adam}
local OPTS = {sgd = {lr = 0.1, momentum = 0.9}, adam = {lr = 0.01, betas = {0.8, 0.99}}}

-- Reference and ZeRO pair for case c: {net, ddp, opt} each (on group g, or the world).
local function pair(c, g)
  local dopts = g and {process_group = g} or nil
  local ref = {net = model(c.dtype, 1 + rank)}
  ref.ddp = crun.DDP(ref.net, dopts)
  ref.opt = CLASSES[c.opt](ref.ddp, OPTS[c.opt])
  local z = {net = model(c.dtype, 1 + rank)}
  z.ddp = crun.DDP(z.net, dopts)
  local o = {parameters_as_bucket_view = c.view, process_group = g}
  for k, v in pairs(OPTS[c.opt]) do o[k] = v end
  z.opt = crun.optim.ZeroRedundancyOptimizer(z.ddp, CLASSES[c.opt], o)
  return ref, z
end

local CASES = {
  {name = "sgd_f64", opt = "sgd", dtype = "float64", view = false},
  {name = "sgd_f64_view", opt = "sgd", dtype = "float64", view = true},
  {name = "adam_f64", opt = "adam", dtype = "float64", view = false},
  {name = "adam_f64_view", opt = "adam", dtype = "float64", view = true},
  {name = "adam_f32", opt = "adam", dtype = "float32", view = false},
}

-- One case: k steps, state size, consolidation onto the last rank, and a
-- round trip through load_state_dict into a fresh ZeRO; returns its record.
local function run_case(c)
  local ref, z = pair(c)
  train(ref.ddp, ref.opt, c.dtype, 1, STEPS)
  train(z.ddp, z.opt, c.dtype, 1, STEPS)
  local rec = {param_err = params_err(ref.net:parameters(), z.net:parameters()),
    state_numel = z.opt:state_numel(), owned = z.opt.own, owner = z.opt.owner, rank_numel = z.opt.rank_numel,
    local_entries = 0}
  for _ in pairs(z.opt.optim.state) do rec.local_entries = rec.local_entries + 1 end
  -- torch's param_groups: one group, whose lr writes through to the wrapped optimizer
  local lr = z.opt.opts.lr
  for _, grp in ipairs(z.opt.param_groups) do grp.lr = lr / 2 end
  rec.groups_lr = {#z.opt.param_groups, z.opt.optim.opts.lr / lr}
  z.opt.opts.lr = lr
  local to = world - 1
  z.opt:consolidate_state_dict(to)
  local sd
  if rank == to then
    sd = z.opt:state_dict()
    rec.consolidated_err, rec.consolidated_entries, rec.consolidated_missing = state_err(sd.state, ref.opt:state_dict().state)
  else
    local ok, err = pcall(z.opt.state_dict, z.opt)
    rec.state_dict_elsewhere = ok and "returned" or tostring(err)
  end
  sd = crun.dist.broadcast_object(sd, to)
  local z2 = crun.optim.ZeroRedundancyOptimizer(z.ddp, CLASSES[c.opt], OPTS[c.opt])
  z2.opts.lr = lr * 7 -- the state's param_groups bring the saved rate back, as torch's
  z2:load_state_dict(sd)
  rec.loaded_lr = z2.opts.lr / lr
  train(ref.ddp, ref.opt, c.dtype, STEPS + 1, STEPS + 2)
  train(z.ddp, z2, c.dtype, STEPS + 1, STEPS + 2)
  rec.roundtrip_err = params_err(ref.net:parameters(), z.net:parameters())
  ref.ddp:close()
  z.ddp:close()
  return rec
end

-- Clones of a parameter list.
local function clones(list)
  local o = {}
  for i, p in ipairs(list) do o[i] = p:clone() end
  return o
end

if mode == "run" then
  local res = {world = world, cases = {}}
  for _, c in ipairs(CASES) do
    res.cases[c.name] = run_case(c)
  end
  if world == 4 then
    -- a fresh Adam pair trained STEPS steps, then checkpointed by rank 0
    local c = CASES[3]
    local ref, z = pair(c)
    train(ref.ddp, ref.opt, c.dtype, 1, STEPS)
    train(z.ddp, z.opt, c.dtype, 1, STEPS)
    z.opt:consolidate_state_dict(0)
    if rank == 0 then
      crun.save(out .. "/ckpt.crun", {ref_params = clones(ref.net:parameters()), ref_state = ref.opt:state_dict(),
        params = clones(z.net:parameters()), state = z.opt:state_dict()})
    end
    ref.ddp:close()
    z.ddp:close()
  end
  -- on the sub-group of ranks 1..world-1 (world >= 3): group ranks differ
  -- from global ranks in every broadcast, send and recv; consolidated onto
  -- group rank 1 (global rank 2)
  if world >= 3 then
    local members = {}
    for r = 1, world - 1 do members[#members + 1] = r end
    local g = crun.dist.new_group(members)
    if rank >= 1 then
      for _, c in ipairs{CASES[2], CASES[3]} do
        local ref, z = pair(c, g)
        train(ref.ddp, ref.opt, c.dtype, 1, STEPS)
        train(z.ddp, z.opt, c.dtype, 1, STEPS)
        local rec = {param_err = params_err(ref.net:parameters(), z.net:parameters()), rank_numel = z.opt.rank_numel,
          state_numel = z.opt:state_numel()}
        z.opt:consolidate_state_dict(1)
        if rank == 2 then
          rec.consolidated_err, rec.consolidated_entries = state_err(z.opt:state_dict().state, ref.opt:state_dict().state)
        else
          local ok, err = pcall(z.opt.state_dict, z.opt)
          rec.state_dict_elsewhere = ok and "returned" or tostring(err)
        end
        res.group = res.group or {}
        res.group[c.name] = rec
        ref.ddp:close()
        z.ddp:close()
      end
    end
  end
  -- a model that differs on the last rank is refused on every rank, by name
  do
    local h = (rank == world - 1 and world > 1) and 5 or 4
    local net = nn.Sequential(nn.Linear(3, h), nn.ReLU(), nn.Linear(h, 2))
    local ok, err = pcall(crun.optim.ZeroRedundancyOptimizer, net, crun.optim.SGD, {lr = 0.1})
    res.mismatch = ok and "accepted" or tostring(err)
  end
  -- a loaded state missing parameter 2's exp_avg: refused on every rank
  -- (not only on its owner), naming the model's parameter index, nothing loaded
  do
    local z = crun.optim.ZeroRedundancyOptimizer({model("float64", 1):parameters()}, crun.optim.Adam, OPTS.adam)
    local st = {}
    for i, n in ipairs{45, 9, 36, 4, 12, 3} do
      st[i] = {step = 2, exp_avg = T.zeros({n}, "float64"), exp_avg_sq = T.zeros({n}, "float64")}
    end
    st[2].exp_avg = nil
    local ok, err = pcall(z.load_state_dict, z, {kind = "Adam", state = st})
    res.load_missing = ok and "accepted" or tostring(err)
    res.load_missing_numel = z:state_numel()
  end
  -- crun's learning-rate idiom, opt.opts.lr = x (jobs/train.lua), on ZeRO
  -- as on the plain optimizer: same parameters after a change of lr
  do
    local a, b = model("float64", 1), model("float64", 1)
    local pa, ga = a:parameters()
    local pb, gb = b:parameters()
    local plain = crun.optim.SGD(pa, ga, OPTS.sgd)
    local z = crun.optim.ZeroRedundancyOptimizer({pb, gb}, crun.optim.SGD, OPTS.sgd)
    local ok, err = pcall(function()
      for s = 1, 3 do
        for i, g in ipairs(ga) do g:copy(T.randn(g:size(), {seed = 100 * s + i, dtype = "float64"})) end
        for i, g in ipairs(gb) do g:copy(ga[i]) end
        plain.opts.lr, z.opts.lr = 0.1 / s, 0.1 / s
        plain:step()
        z:step()
      end
    end)
    res.lr_change = ok and params_err(pa, pb) or tostring(err)
  end
  -- a tensor listed twice (a plain optimizer steps it twice; ZeRO's owners once each)
  do
    local a, b = T.randn({4}, {seed = 3}), T.randn({3}, {seed = 4})
    local ga, gb = T.ones({4}), T.ones({3})
    local ok, err = pcall(crun.optim.ZeroRedundancyOptimizer, {{a, b, a}, {ga, gb, ga}}, crun.optim.SGD, {lr = 0.1})
    res.duplicate = ok and "accepted" or tostring(err)
  end
  -- consolidate_state_dict with rank 0 naming itself and the others the
  -- last rank (sends and receives that do not pair up): EMISMATCH everywhere
  do
    local net = model("float64", 1)
    local z = crun.optim.ZeroRedundancyOptimizer(net, crun.optim.Adam, OPTS.adam)
    z:step()
    local ok, err = pcall(z.consolidate_state_dict, z, rank == 0 and 0 or world - 1)
    res.consolidate_mismatch = ok and "ok" or tostring(err)
    z:consolidate_state_dict(0) -- still usable
    res.consolidate_after = rank == 0 and #z:state_dict().state or 0
  end
  crun.save(string.format("%s/run.r%d.crun", out, rank), res)
elseif mode == "resume" then
  local ck = crun.load(out .. "/ckpt.crun")
  local c = CASES[3]
  local ref, z = pair(c)
  for i, p in ipairs(ref.net:parameters()) do p:copy(ck.ref_params[i]) end
  for i, p in ipairs(z.net:parameters()) do p:copy(ck.params[i]) end
  ref.opt:load_state_dict(ck.ref_state)
  z.opt:load_state_dict(ck.state)
  local res = {world = world, start_err = params_err(ref.net:parameters(), z.net:parameters()),
    state_numel = z.opt:state_numel(), rank_numel = z.opt.rank_numel}
  train(ref.ddp, ref.opt, c.dtype, STEPS + 1, STEPS + 3)
  train(z.ddp, z.opt, c.dtype, STEPS + 1, STEPS + 3)
  res.param_err = params_err(ref.net:parameters(), z.net:parameters())
  res.moved = util.max_rel_err(z.net:parameters()[1], ck.params[1])
  crun.save(string.format("%s/resume.r%d.crun", out, rank), res)
end
crun.dist.barrier()
crun.dist.destroy_process_group()
