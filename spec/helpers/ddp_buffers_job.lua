-- Multi-rank job of ddp_spec.lua's buffer cases:
-- `crun-lua -n 3 spec/helpers/ddp_buffers_job.lua OUTDIR`. Saves each
-- rank's observations to OUTDIR/buffers.r<rank>.crun.
package.path = (os.getenv("CRUN_SOURCE_DIR") or ".") .. "/spec/?.lua;" .. package.path
local crun = require "crun"
local nn, T, dist = crun.nn, crun.tensor, crun.dist
local out = assert(arg[1], "usage: ddp_buffers_job.lua OUTDIR")
dist.init_process_group{backend = "auto", timeout = 20}
local rank, world = dist.get_rank(), dist.get_world_size()
local rec = {rank = rank}

local function net(seed)
  nn.set_default_dtype("float64")
  nn.manual_seed(seed)
  local m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 2))
  nn.set_default_dtype("float32")
  return m
end
local function batch(s, r)
  local x = T.randn({5, 3}, {seed = 100 * s + 7 * r, dtype = "float64"})
  local y = T.randn({5, 2}, {seed = 100 * s + 7 * r + 1, dtype = "float64"})
  return x, y
end
local function fwd_bwd(m, x, y)
  local crit = nn.MSECriterion()
  local o = m:forward(x)
  crit:forward(o, y)
  m:backward(x, crit:backward(o, y))
end
local function pcall_msg(f) local ok, err = pcall(f); return ok and "ok" or tostring(err) end
-- The uneven schedule of the join cases (rank r trains 2 + r steps) on one
-- process: step s sums the gradients of the ranks that still train, divided
-- by the world size (SGD with lr / world).
local function train_ref(m)
  local o = crun.optim.SGD(m, {lr = 0.1 / world})
  for s = 1, 2 + world - 1 do
    o:zero_grad()
    for r = 0, world - 1 do if s <= 2 + r then fwd_bwd(m, batch(s, r)) end end
    o:step()
  end
end

-- (1) DDP over the group {1, 2}: eval forward takes the buffers of the
-- group's rank 0 (global rank 1)
local g = dist.new_group({1, 2})
if rank ~= 0 then
  local m = net(1)
  rec.sub = pcall_msg(function()
    m:leaves()[2].running_var:fill_(rank * 2 + 0.25)
    local d = crun.DDP(m, {group = g})
    rec.wrap_var = m:leaves()[2].running_var[1] -- wrapping broadcasts the buffers too
    m:evaluate()
    m:leaves()[2].running_mean:fill_(rank * 10 - 3.5)
    d:forward(T.ones({2, 3}, "float64"))
    rec.sub_mean = m:leaves()[2].running_mean[1]
    d:close()
  end)
end

-- (2) crun.join with uneven batches (rank r trains 2 + r) and BatchNorm
local m = net(1 + rank)
local ref = net(1)
local opt = crun.optim.SGD(m, {lr = 0.1})
local d = crun.DDP(m)
rec.join = pcall_msg(function()
  crun.join({d}, function()
    for s = 1, 2 + rank do
      opt:zero_grad()
      fwd_bwd(d, batch(s, rank))
      opt:step()
    end
  end)
end)
d:close()
train_ref(ref)
rec.params, rec.ref = {}, {}
for i, p in ipairs((m:parameters())) do rec.params[i] = p:clone() end
for i, p in ipairs((ref:parameters())) do rec.ref[i] = p:clone() end
rec.buffers = {}
for i, b in ipairs(m:buffers()) do rec.buffers[i] = b:clone() end
-- (2c) crun.join with an evaluation forward after each step (its buffer
-- broadcast is replayed by joined ranks), and (2d) training in evaluation
-- mode (frozen BatchNorm: a forward in eval mode, then a synchronised
-- backward, which joined ranks are told of at backward). Saved: "ok" and the
-- parameters' largest relative error against one process doing the same.
local function max_err(a, b)
  local e = 0
  for i, p in ipairs((a:parameters())) do
    local q = (b:parameters())[i]
    e = math.max(e, (p - q):abs():max() / math.max(q:abs():max(), 1e-300))
  end
  return e
end
for _, mode in ipairs{"eval_after", "eval_train"} do
  local mm, rm = net(1 + rank), net(1)
  local o = crun.optim.SGD(mm, {lr = 0.1})
  local dd = crun.DDP(mm)
  if mode == "eval_train" then mm:evaluate(); rm:evaluate() end
  rec[mode] = pcall_msg(function()
    crun.join({dd}, function()
      for s = 1, 2 + rank do
        o:zero_grad()
        fwd_bwd(dd, batch(s, rank))
        o:step()
        if mode == "eval_after" then
          mm:evaluate(); dd:forward(batch(s, rank)); mm:train()
        end
      end
    end)
  end)
  dd:close()
  train_ref(rm)
  rec[mode .. "_err"] = max_err(mm, rm)
end

-- (2b) two models in one join, each trained in turn (torch shadows each
-- joinable's buffer broadcast and all_reduces in list order)
do
  local ma, mb = crun.DDP(net(1 + rank)), crun.DDP(net(7 + rank))
  rec.join_two = pcall_msg(function()
    crun.join({ma, mb}, function()
      for s = 1, 2 + rank do
        ma:zero_grad(); mb:zero_grad()
        fwd_bwd(ma, batch(s, rank)); fwd_bwd(mb, batch(s, rank))
      end
    end)
  end)
  ma:close(); mb:close()
end

-- (3) no_sync is read at forward time, as torch: a forward inside no_sync
-- and its backward outside do not synchronise; a forward outside and its
-- backward inside do. Saved: the error of the gradients against this rank's
-- own and against the average over the ranks.
local function grads_of(m)
  local _, gs = m:parameters()
  local out = {}
  for i, gr in ipairs(gs) do out[i] = gr:clone() end
  return out
end
local function lin(seed)
  nn.set_default_dtype("float64")
  nn.manual_seed(seed)
  local mm = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
  nn.set_default_dtype("float32")
  return mm
end
local own, avg = lin(5), lin(5)
own:zero_grad(); fwd_bwd(own, batch(9, rank))
avg:zero_grad()
for r = 0, world - 1 do fwd_bwd(avg, batch(9, r)) end
local own_g, avg_g = grads_of(own), grads_of(avg)
for _, p in ipairs(avg_g) do p:div_(world) end
rec.no_sync = {}
for _, how in ipairs{"forward_inside", "backward_inside"} do
  local mm = lin(5)
  local dd = crun.DDP(mm, {bucket_cap_mb = 0.00005})
  mm:zero_grad()
  local x, y = batch(9, rank)
  local crit = nn.MSECriterion()
  local o
  if how == "forward_inside" then
    dd:no_sync(function() o = dd:forward(x) end)
    crit:forward(o, y)
    dd:backward(x, crit:backward(o, y))
  else
    o = dd:forward(x)
    crit:forward(o, y)
    dd:no_sync(function() dd:backward(x, crit:backward(o, y)) end)
  end
  local g, e_own, e_avg = grads_of(mm), 0, 0
  for i = 1, #g do
    e_own = math.max(e_own, require("helpers.train_util").max_rel_err(g[i], own_g[i]))
    e_avg = math.max(e_avg, require("helpers.train_util").max_rel_err(g[i], avg_g[i]))
  end
  rec.no_sync[how] = {own = e_own, avg = e_avg}
  dd:close()
end
crun.save(string.format("%s/buffers.r%d.crun", out, rank), rec)
dist.barrier()
dist.destroy_process_group()
