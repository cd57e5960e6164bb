-- Multi-rank job of ddp_spec.lua: `crun-lua -n 2 spec/helpers/train_ddp_launch_job.lua OUTDIR`.
-- Records, on each rank, how many bucket all_reduces the reducer had
-- launched when each Linear's backward started and when backward ended
-- (before the final wait), for overlap on, overlap off and no_sync, plus
-- whether the gradients ended up identical on every rank; saves them to
-- OUTDIR/launch.r<rank>.crun.
local crun = require "crun"
local nn = require "crun.nn"
local T = require "crun.tensor"

local out = assert(arg[1], "usage: train_ddp_launch_job.lua OUTDIR")
crun.dist.init_process_group{backend = "auto"}
local rank = crun.dist.get_rank()
local l1, l2 = nn.Linear(3, 4), nn.Linear(4, 2)
local net = nn.Sequential(l1, nn.Tanh(), l2)
local events, current = {}, nil
for name, l in pairs{L1 = l1, L2 = l2} do
  local bw = l.backward
  l.backward = function(self, x, gy)
    events[#events + 1] = string.format("backward %s after %d launches", name, current.reducer:launched())
    return bw(self, x, gy)
  end
end
-- one bucket per layer: l2's weight+bias (10 floats) first, then l1's (16)
local function run(model, x, sync)
  current, events = model, {}
  local function step()
    model:forward(x)
    model:backward(x, T.ones({5, 2}))
  end
  if sync then step() else model:no_sync(step) end
  local grads = {}
  for _, g in ipairs(select(2, model:parameters())) do
    local flat = g:contiguous():view(g:numel())
    for k = 1, g:numel() do grads[#grads + 1] = flat[k] end
  end
  local all = crun.dist.all_gather_object(grads)
  local same = true
  for r = 2, #all do
    for k = 1, #grads do same = same and all[r][k] == all[1][k] end
  end
  return {events = events, launched = model.stats.launched_in_backward, steps = model.stats.steps,
    buckets = #model.buckets, same = same}
end
local x = T.randn({5, 3}, {seed = 1 + rank}) -- different inputs per rank
local res = {}
local m = crun.DDP(net, {first_bucket_mb = 40 / 2 ^ 20, bucket_cap_mb = 64 / 2 ^ 20})
res.overlap = run(m, x, true)
m:close()
net:zero_grad()
local seq = crun.DDP(net, {first_bucket_mb = 40 / 2 ^ 20, bucket_cap_mb = 64 / 2 ^ 20, overlap = false})
res.sequential = run(seq, x, true)
net:zero_grad()
res.no_sync = run(seq, x, false)
seq:close()
crun.save(string.format("%s/launch.r%d.crun", out, rank), res)
crun.dist.destroy_process_group()
