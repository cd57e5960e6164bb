-- Multi-rank job of fsdp_spec.lua:
--   crun-lua -n W spec/helpers/fsdp_job.lua OUTDIR run      -- cases; at W = 4 also a sharded checkpoint
--   crun-lua -n W spec/helpers/fsdp_job.lua OUTDIR resume   -- resumes OUTDIR/ckpt.r<k>.crun (saved at 4)
-- Each rank trains the same model with DDP + an optimizer (the reference)
-- and with FSDP + the same optimizer, and saves what it saw to
-- OUTDIR/<mode>.r<rank>.crun; the spec asserts on every rank's file.
package.path = (os.getenv("CRUN_SOURCE_DIR") or ".") .. "/spec/?.lua;" .. package.path
local crun = require "crun"
local nn = require "crun.nn"
local util = require "helpers.train_util"
local T = crun.tensor

local out, mode = assert(arg[1], "usage: fsdp_job.lua OUTDIR run|resume"), arg[2] or "run"
crun.dist.init_process_group{backend = "auto"}
local rank, world = crun.dist.get_rank(), crun.dist.get_world_size()
local STEPS = 3

-- 7*11+11 + 11*6+6 + 6*3+3 = 88 + 72 + 21 = 181 parameters (prime).
-- kind "equal": 48 + 3 x 42 + 21 = 195, three adjacent units of one size,
-- so they take turns with the same pooled buffers.
local function model(dtype, seed, kind)
  nn.set_default_dtype(dtype)
  nn.manual_seed(seed)
  local m
  if kind == "equal" then
    m = nn.Sequential(nn.Linear(7, 6), nn.Tanh(), nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6), nn.ReLU(),
      nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 3))
  else
    m = nn.Sequential(nn.Linear(7, 11), nn.Tanh(), nn.Linear(11, 6), nn.ReLU(), nn.Linear(6, 3))
  end
  nn.set_default_dtype("float32")
  return m
end

local function fwd_bwd(m, dtype, s)
  local X = T.randn({4, 7}, {seed = 7919 * s + 104729 * rank + 5, dtype = dtype})
  local y = T.new({(s + rank) % 3 + 1, (2 * s + rank + 1) % 3 + 1, (s * s + 2) % 3 + 1, (rank * rank + s) % 3 + 1}, "int64")
  local crit = nn.CrossEntropyCriterion()
  local o = m:forward(X)
  local loss = crit:forward(o, y)
  m:backward(X, crit:backward(o, y))
  return loss
end

local CLASSES = {sgd = crun.optim.SGD, adam = crun.optim.Adam}
local OPTS = {sgd = {lr = 0.1, momentum = 0.9}, adam = {lr = 0.01, betas = {0.8, 0.99}}}

-- Every parameter of `net` as one list of tensors (the module's own order).
local function flat_params(net)
  local l = {}
  for i, p in ipairs((net:parameters())) do l[i] = p:clone() end
  return l
end

local function train(m, opt, dtype, first, last)
  for s = first, last do
    opt:zero_grad()
    fwd_bwd(m, dtype, s)
    opt:step()
  end
end

local rec = {cases = {}}
local CASES = {}
for _, strat in ipairs{"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"} do
  for _, o in ipairs{"sgd", "adam"} do
    for _, wrap in ipairs{false, true} do
      CASES[#CASES + 1] = {strategy = strat, opt = o, wrap = wrap, dtype = "float64"}
    end
  end
end
CASES[#CASES + 1] = {strategy = "FULL_SHARD", opt = "adam", wrap = true, dtype = "float32"}
CASES[#CASES + 1] = {strategy = "FULL_SHARD", opt = "sgd", wrap = true, dtype = "float32", reduce = "float64"}
for _, strat in ipairs{"FULL_SHARD", "SHARD_GRAD_OP"} do
  CASES[#CASES + 1] = {strategy = strat, opt = "adam", wrap = true, dtype = "float64", kind = "equal"}
end

if mode == "run" then
  for ci, c in ipairs(CASES) do
    local ref = model(c.dtype, 1 + rank, c.kind)
    local ddp = crun.DDP(ref)
    local ropt = CLASSES[c.opt](ddp, OPTS[c.opt])
    local net = model(c.dtype, 1 + rank, c.kind)
    local fs = crun.FSDP(net, {sharding_strategy = c.strategy,
      auto_wrap = c.wrap and {min_params = c.kind == "equal" and 40 or 60} or nil,
      mixed_precision = c.reduce and {reduce_dtype = c.reduce} or nil})
    local fopt = CLASSES[c.opt](fs, OPTS[c.opt])
    train(ddp, ropt, c.dtype, 1, STEPS)
    train(fs, fopt, c.dtype, 1, STEPS)
    local mem = fs:memory() -- between steps
    local full = fs:state_dict()
    local r = {name = string.format("%s_%s_%s%s%s%s", c.strategy, c.opt, c.dtype, c.wrap and "_wrap" or "",
      c.reduce and "_reduce64" or "", c.kind and "_" .. c.kind or ""), units = #fs.units, gathers = fs.stats.gathers,
      mem = mem, elsize = c.dtype == "float64" and 8 or 4}
    if rank == 0 then
      r.param_err = 0
      local want = flat_params(ref)
      r.nparams = #full
      for i = 1, #want do r.param_err = math.max(r.param_err, util.max_rel_err(want[i], full[i])) end
    else
      r.state_dict_elsewhere = full == nil
    end
    -- this rank's shard is its slice of the padded flat parameters
    local sn = 0
    for _, p in ipairs((fs:parameters())) do sn = sn + p:numel() end
    r.shard_numel = sn
    -- while sharded, the leaves hold no parameter elements (FULL_SHARD, SHARD_GRAD_OP after backward)
    local held = 0
    for _, p in ipairs((net:parameters())) do held = held + p:numel() end
    r.leaf_numel = held
    rec.cases[ci] = r
    -- a sharded checkpoint at 4 ranks for the resume mode
    if world == 4 and ci == 3 then -- FULL_SHARD, adam, float64, no wrap
      crun.save(string.format("%s/ckpt.r%d.crun", out, rank), {sd = fs:sharded_state_dict(fopt),
        ref = flat_params(ref), ref_opt = ropt:state_dict()})
      -- two more steps from here: what the resumed job must reach
      train(ddp, ropt, c.dtype, STEPS + 1, STEPS + 2)
      if rank == 0 then crun.save(out .. "/after.crun", flat_params(ref)) end
    end
  end
  -- misuse
  local ok, e = pcall(crun.FSDP, model("float32", 1), {sharding_strategy = "HYBRID"})
  rec.bad_strategy = ok and "accepted" or tostring(e)
  ok, e = pcall(crun.FSDP, model("float32", 1), {mixed_precision = {param_dtype = "float16"}})
  rec.half = ok and "accepted" or tostring(e)
  -- a param_dtype other than the parameters' was accepted and ignored (compute stayed in float64)
  ok, e = pcall(crun.FSDP, model("float64", 1), {mixed_precision = {param_dtype = "float32"}})
  rec.param32 = ok and "accepted" or tostring(e)
  ok, e = pcall(crun.FSDP, model("float64", 1), {mixed_precision = {param_dtype = "float64", reduce_dtype = "float32"}})
  rec.param64 = ok and "accepted" or tostring(e)
  -- options that were taken without a check: a NaN min_params (nothing
  -- wrapped), a string prefetch flag (read as true), a non-table
  -- mixed_precision (a raw error from pairs)
  rec.bad_opts = {}
  for i, o in ipairs{{auto_wrap = {min_params = 0 / 0}}, {forward_prefetch = "no"}, {backward_prefetch = 0},
                      {mixed_precision = "float64"}} do
    ok, e = pcall(crun.FSDP, model("float64", 1), o)
    rec.bad_opts[i] = ok and "accepted" or tostring(e)
  end
  -- an optimizer built from the wrapped module (its parameters are empty
  -- tensors while sharded) stepped nothing, silently
  do
    local inner = model("float64", 1)
    local _ = crun.FSDP(inner)
    rec.inner_opt = {}
    for i, f in ipairs{function() return crun.optim.SGD(inner, {lr = 0.1}) end,
                       function() return crun.optim.Adam(inner) end,
                       function() return crun.optim.ZeroRedundancyOptimizer(inner, crun.optim.SGD, {lr = 0.1}) end} do
      ok, e = pcall(f)
      rec.inner_opt[i] = ok and "accepted" or tostring(e)
    end
    -- wrapped again: DDP over the FSDP model (a raw error), DDP or FSDP over
    -- the module it wraps (empty parameters: training through them did nothing)
    rec.rewrap = {}
    for i, f in ipairs{function() return crun.DDP(crun.FSDP(model("float64", 1))) end,
                       function() return crun.DDP(inner) end, function() return crun.FSDP(inner) end} do
      ok, e = pcall(f)
      rec.rewrap[i] = ok and "accepted" or tostring(e)
    end
  end
  -- ZeRO over an FSDP model broadcast each owner's shard over the other
  -- ranks' different shards
  do
    local fsm = crun.FSDP(model("float64", 1))
    ok, e = pcall(crun.optim.ZeroRedundancyOptimizer, fsm, crun.optim.SGD, {lr = 0.1})
    rec.zero_over_fsdp = ok and "accepted" or tostring(e)
  end
  -- a model that differs on the last rank but has as many elements: it used
  -- to be wrapped, rank 0's values poured into the other shapes
  local last = world > 1 and rank == world - 1
  nn.manual_seed(1)
  ok, e = pcall(crun.FSDP, nn.Sequential(last and nn.Linear(2, 6) or nn.Linear(5, 3)))
  rec.mismatch = ok and "accepted" or tostring(e)
  rec.usable_after = pcall(crun.dist.barrier)
  -- the same on the group of ranks 1..world-1: the message names group and global ranks
  if world >= 3 then
    local members = {}
    for r = 1, world - 1 do members[#members + 1] = r end
    local g = crun.dist.new_group(members)
    if rank >= 1 then
      nn.manual_seed(1)
      ok, e = pcall(crun.FSDP, nn.Sequential(last and nn.Linear(2, 6) or nn.Linear(5, 3)), {group = g})
      rec.group_mismatch = ok and "accepted" or tostring(e)
    end
  end
elseif mode == "bn" then
  -- a model with buffers (BatchNorm's running statistics), the same batch on
  -- every rank: FSDP's full state_dict must equal the plain module's, the
  -- buffers included, and load back into a fresh FSDP model
  local function bn_model(seed)
    nn.set_default_dtype("float64")
    nn.manual_seed(seed)
    local m = nn.Sequential(nn.Linear(7, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3))
    nn.set_default_dtype("float32")
    return m
  end
  local function steps(m, opt)
    for s = 1, STEPS do
      opt:zero_grad()
      local X = T.randn({5, 7}, {seed = 31 * s + 3, dtype = "float64"})
      local y = T.new({1, 3, 2, 2, 1}, "int64")
      local crit = nn.CrossEntropyCriterion()
      local o = m:forward(X)
      crit:forward(o, y)
      m:backward(X, crit:backward(o, y))
      opt:step()
    end
  end
  local ref = bn_model(1)
  steps(ref, crun.optim.SGD(ref, OPTS.sgd))
  local fs = crun.FSDP(bn_model(1), {auto_wrap = {min_params = 20}})
  steps(fs, crun.optim.SGD(fs, OPTS.sgd))
  local want = ref:state_dict()
  local function sd_err(sd)
    if #sd ~= #want then return "entries " .. #sd .. " of " .. #want end
    local e = 0
    for i = 1, #want do e = math.max(e, util.max_rel_err(want[i], sd[i])) end
    return e
  end
  local sd = fs:state_dict()
  rec.bn = {}
  if rank == 0 then rec.bn.state_err = sd_err(sd) end
  -- every rank loads the full list into a model of other weights
  sd = crun.dist.broadcast_object(sd, 0)
  local fresh = crun.FSDP(bn_model(7), {auto_wrap = {min_params = 20}})
  local ok, e = pcall(fresh.load_state_dict, fresh, sd)
  rec.bn.load = ok and "loaded" or tostring(e)
  local sd2 = fresh:state_dict()
  if rank == 0 then rec.bn.load_err = sd_err(sd2) end
  -- a wrong shape, a missing entry: refused, nothing loaded
  local bad = {}
  for i, t in ipairs(sd) do bad[i] = t end
  bad[1] = T.zeros({7, 6}, "float64")
  ok, e = pcall(fresh.load_state_dict, fresh, bad)
  rec.bn.bad_shape = ok and "loaded" or tostring(e)
  bad[1], bad[#bad] = sd[1], nil
  ok, e = pcall(fresh.load_state_dict, fresh, bad)
  rec.bn.bad_count = ok and "loaded" or tostring(e)
  -- the keyed form (Module:state_dict{keyed = true}) is not FSDP's yet: refused, not misread
  ok, e = pcall(fresh.load_state_dict, fresh, {["0.weight"] = sd[1]})
  rec.bn.keyed_load = ok and "loaded" or tostring(e)
  ok, e = pcall(fresh.state_dict, fresh, {keyed = true})
  rec.bn.keyed_sd = ok and "returned" or tostring(e)
  sd2 = fresh:state_dict()
  if rank == 0 then rec.bn.unchanged_err = sd_err(sd2) end
elseif mode == "clip" then
  -- clip_grad_norm_ of an FSDP model (the norm over every rank's shards)
  -- against nn.utils.clip_grad_norm_ of the DDP reference, which holds
  -- whole averaged gradients; then one SGD step on each, and the parameters
  -- compared. Saved per case: both totals and the parameters' error (rank 0).
  rec.clip = {}
  for _, strat in ipairs{"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"} do
    for _, nt in ipairs{2, "inf", 3} do
      local ddp = crun.DDP(model("float64", 1 + rank))
      local fs = crun.FSDP(model("float64", 1 + rank), {sharding_strategy = strat, auto_wrap = {min_params = 60}})
      local ropt, fopt = crun.optim.SGD(ddp, {lr = 0.5}), crun.optim.SGD(fs, {lr = 0.5})
      fwd_bwd(ddp, "float64", 1)
      fwd_bwd(fs, "float64", 1)
      local c = {want = nn.utils.clip_grad_norm_(ddp, 0.05, nt)}
      -- FSDP through nn.utils (which hands it to the model) and directly
      c.got = nt == 2 and nn.utils.clip_grad_norm_(fs, 0.05) or fs:clip_grad_norm_(0.05, nt)
      ropt:step()
      fopt:step()
      local full = fs:state_dict()
      if rank == 0 then
        c.param_err = 0
        local want = flat_params(ddp)
        for i = 1, #want do c.param_err = math.max(c.param_err, util.max_rel_err(want[i], full[i])) end
      end
      ddp:close()
      rec.clip[strat .. "_" .. tostring(nt)] = c
    end
  end
elseif mode == "parts" then
  -- load_sharded_state_dict given an incomplete or inconsistent list of parts
  local fs = crun.FSDP(model("float64", 1), {sharding_strategy = "FULL_SHARD"})
  crun.save(string.format("%s/part.r%d.crun", out, rank), fs:sharded_state_dict())
  crun.dist.barrier()
  local all = {}
  for k = 0, world - 1 do all[k + 1] = crun.load(string.format("%s/part.r%d.crun", out, k)) end
  -- "loaded <max difference from the saved shards>" or the error
  local function attempt(parts)
    local g = crun.FSDP(model("float64", 2), {sharding_strategy = "FULL_SHARD"})
    local ok, e = pcall(g.load_sharded_state_dict, g, parts)
    if not ok then return tostring(e) end
    local err, want, got = 0, fs:parameters(), g:parameters()
    for i = 1, #want do err = math.max(err, util.max_rel_err(want[i], got[i])) end
    return "loaded " .. err
  end
  local reversed, missing, dup = {}, {}, {}
  for k = world, 1, -1 do reversed[#reversed + 1] = all[k] end
  for k = 1, world - 1 do missing[k], dup[k] = all[k], all[k] end
  dup[world] = all[1]
  rec.parts = {own = attempt({all[rank + 1]}), reversed = attempt(reversed), missing = attempt(missing),
    dup = attempt(dup)}
  rec.parts_order = reversed[1].rank -- the caller's list is left as it was
  -- a part whose shard is cut short (one element): zero-filled before
  local short = {}
  for k, p in ipairs(all) do
    short[k] = {world = p.world, rank = p.rank, units = {{numel = p.units[1].numel,
      shard = k == 1 and p.units[1].shard:narrow(1, 1, 1):clone() or p.units[1].shard}}}
  end
  rec.parts.short = attempt(short)
  -- a checkpoint with one unit more than this model (its first unit fits)
  local extra = {}
  for k, p in ipairs(all) do
    extra[k] = {world = p.world, rank = p.rank, units = {p.units[1], {numel = 4, shard = T.zeros({4}, "float64")}}}
  end
  rec.parts.extra = attempt(extra)
  -- the optimizer's part of the checkpoint: saved with Adam's state
  local fopt = crun.optim.Adam(fs, OPTS.adam)
  train(fs, fopt, "float64", 1, 1)
  crun.save(string.format("%s/opart.r%d.crun", out, rank), fs:sharded_state_dict(fopt))
  crun.dist.barrier()
  local oall = {}
  for k = 0, world - 1 do oall[k + 1] = crun.load(string.format("%s/opart.r%d.crun", out, k)) end
  -- the error, and whether the model's shards were left as they were
  local function refused(parts, make_opt)
    local g = crun.FSDP(model("float64", 2), {sharding_strategy = "FULL_SHARD"})
    local before = {}
    for i, p in ipairs((g:parameters())) do before[i] = p:clone() end
    local ok, e = pcall(g.load_sharded_state_dict, g, parts, make_opt(g))
    local err = 0
    for i, p in ipairs((g:parameters())) do err = math.max(err, util.max_rel_err(before[i], p)) end
    return {ok and "loaded" or tostring(e), err == 0}
  end
  local without = {}
  for k, p in ipairs(oall) do
    without[k] = {world = p.world, rank = p.rank, optim_kind = p.optim_kind, units = {}}
    for u, r in ipairs(p.units) do
      without[k].units[u] = {numel = r.numel, shard = r.shard, optim = k == 1 and r.optim or nil}
    end
  end
  local other = crun.FSDP(model("float64", 3), {sharding_strategy = "FULL_SHARD"})
  rec.optim = {
    into_sgd = refused(oall, function(g) return crun.optim.SGD(g, OPTS.sgd) end),
    foreign = refused(oall, function() return crun.optim.Adam(other, OPTS.adam) end),
    without = world > 1 and refused(without, function(g) return crun.optim.Adam(g, OPTS.adam) end) or nil,
  }
else
  -- resume at this world size the checkpoint saved at 4 ranks
  local parts = {}
  for k = 0, 3 do parts[#parts + 1] = crun.load(string.format("%s/ckpt.r%d.crun", out, k)).sd end
  local net = model("float64", 99) -- other weights: the checkpoint must replace them
  local fs = crun.FSDP(net, {sharding_strategy = "FULL_SHARD"})
  -- other options too: the checkpoint's param_groups must replace them
  local fopt = crun.optim.Adam(fs, {lr = 0.5, betas = {0.5, 0.6}})
  fs:load_sharded_state_dict(parts, fopt)
  rec.resumed_opts = {lr = fopt.param_groups[1].lr, betas = fopt.param_groups[1].betas}
  local ref = crun.load(out .. "/ckpt.r0.crun").ref
  local full = fs:state_dict()
  if rank == 0 then
    rec.load_err = 0
    for i = 1, #ref do rec.load_err = math.max(rec.load_err, util.max_rel_err(ref[i], full[i])) end
  end
  -- continue two steps; the 4-rank job's DDP went on with the same data only
  -- at 4 ranks, so compare at 4 only; at other sizes check the optimizer
  -- state came along (the step counter)
  rec.steps_in_state = fopt.state[1] and fopt.state[1].step
  if world == 4 then
    train(fs, fopt, "float64", STEPS + 1, STEPS + 2)
    full = fs:state_dict()
    if rank == 0 then
      local want = crun.load(out .. "/after.crun")
      rec.after_err = 0
      for i = 1, #want do rec.after_err = math.max(rec.after_err, util.max_rel_err(want[i], full[i])) end
    end
  end
end

crun.save(string.format("%s/%s.r%d.crun", out, mode, rank), rec)
crun.dist.destroy_process_group()
