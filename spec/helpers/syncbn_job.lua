-- Multi-rank job of nn_layers_spec.lua: crun-lua -n W spec/helpers/syncbn_job.lua
-- Every rank builds the same global batch (float64), runs BatchNorm on all of
-- it (the reference) and SyncBatchNorm on its own uneven slice, and checks
-- the output slice, the input-gradient slice, the parameter gradients
-- (summed over ranks) and the running statistics; then that DDP's
-- broadcast_buffers hands rank 0's running statistics to every rank.
-- Prints "SYNCBN OK rank r" when every check held; raises otherwise.
package.path = (os.getenv("CRUN_SOURCE_DIR") or ".") .. "/spec/?.lua;" .. package.path
local crun = require "crun"
local nn = require "crun.nn"
local util = require "helpers.train_util"
local T = crun.tensor

crun.dist.init_process_group{backend = "auto"}
local rank, world = crun.dist.get_rank(), crun.dist.get_world_size()
local C, N = 3, 3 * world + 1 -- N does not divide by the world: slices differ

-- Rows [first, first + count) of rank r's slice: the first N % world ranks get one more.
local function slice(r)
  local base, extra = N // world, N % world
  local first = r * base + math.min(r, extra) + 1
  return first, base + (r < extra and 1 or 0)
end

local function check(cond, what) if not cond then error(string.format("rank %d: %s", rank, what), 0) end end

local function close(a, b, what, tol)
  local e = util.max_rel_err(a, b)
  check(e <= (tol or 1e-10), string.format("%s off by %g", what, e))
end

local function build(cls)
  local m = nn[cls](C, {momentum = 0.2, dtype = "float64"})
  m.weight:copy(T.randn({C}, {seed = 5, dtype = "float64"}))
  m.bias:copy(T.randn({C}, {seed = 6, dtype = "float64"}))
  return m
end

local first, count = slice(rank)
local ref, sync = build("BatchNorm2d"), nn.SyncBatchNorm.convert(build("BatchNorm2d"))
check(getmetatable(sync) == nn.SyncBatchNormClass, "convert did not make a SyncBatchNorm")
for step = 1, 2 do
  local X = T.randn({N, C, 3, 5}, {seed = 40 + step, dtype = "float64"})
  local R = T.randn({N, C, 3, 5}, {seed = 50 + step, dtype = "float64"})
  local x, r = X:narrow(1, first, count):contiguous(), R:narrow(1, first, count):contiguous()
  ref:zero_grad(); sync:zero_grad()
  local Y = ref:forward(X)
  local GX = ref:backward(X, R)
  local y = sync:forward(x)
  local gx = sync:backward(x, r)
  close(y, Y:narrow(1, first, count), "output of step " .. step)
  close(gx, GX:narrow(1, first, count), "gradInput of step " .. step)
  local gw, gb = sync.gradWeight:clone(), sync.gradBias:clone()
  crun.dist.all_reduce(gw, "sum")
  crun.dist.all_reduce(gb, "sum")
  close(gw, ref.gradWeight, "gradWeight (summed over ranks) of step " .. step)
  close(gb, ref.gradBias, "gradBias (summed over ranks) of step " .. step)
  close(sync.running_mean, ref.running_mean, "running_mean after step " .. step)
  close(sync.running_var, ref.running_var, "running_var after step " .. step)
end

-- An empty batch on every rank: an empty output and gradInput, the running statistics
-- kept, the batch counted (torch 1.13); then rank 0 empty and the others not: rank 0
-- still takes part in the reductions and every rank gets the others' statistics.
do
  local s = nn.SyncBatchNorm(C, {dtype = "float64", momentum = 0.5})
  s.running_mean:fill(0.75)
  local e = T.zeros({0, C, 2, 2}, "float64")
  check(#s:forward(e):size() == 4 and s.output:numel() == 0, "output of an empty batch")
  check(s:backward(e, e):numel() == 0, "gradInput of an empty batch")
  close(s.running_mean, {0.75, 0.75, 0.75}, "running_mean after an empty batch", 0)
  check(s.num_batches_tracked[1] == 1, "num_batches_tracked after an empty batch")
  local X = T.randn({world - 1 + 2, C, 2, 2}, {seed = 90, dtype = "float64"})
  local b = build("BatchNorm2d")
  s.weight:copy(b.weight)
  s.bias:copy(b.bias)
  b.running_mean:fill(0.75)
  b.momentum = 0.5
  local Y = b:forward(X)
  local f, n = rank <= 1 and 1 or rank + 2, rank == 0 and 0 or (rank == 1 and 3 or 1) -- (rows 1-3 on rank 1, one each after)
  local y = s:forward(X:narrow(1, f, n):contiguous())
  close(y, Y:narrow(1, f, n), "output with rank 0's slice empty")
  close(s.running_mean, b.running_mean, "running_mean with rank 0's slice empty")
end

-- group=: on 4 ranks, ranks {0, 1} and {2, 3} each normalise over their own pair's batch.
if world == 4 then
  local groups = {crun.dist.new_group({0, 1}), crun.dist.new_group({2, 3})}
  local pair, gr = rank // 2, rank % 2
  local s = nn.SyncBatchNorm(C, {group = groups[pair + 1], dtype = "float64", momentum = 0.5})
  local b = build("BatchNorm2d")
  s.weight:copy(b.weight)
  s.bias:copy(b.bias)
  local X = T.randn({5, C, 2, 3}, {seed = 70 + pair, dtype = "float64"})
  local R = T.randn({5, C, 2, 3}, {seed = 80 + pair, dtype = "float64"})
  local f, n = gr == 0 and 1 or 4, gr == 0 and 3 or 2
  local Y, GX = b:forward(X), b:backward(X, R)
  local x = X:narrow(1, f, n):contiguous()
  close(s:forward(x), Y:narrow(1, f, n), "output within the pair's group")
  close(s:backward(x, R:narrow(1, f, n):contiguous()), GX:narrow(1, f, n), "gradInput within the pair's group")
end

-- DDP broadcast_buffers: rank-specific running statistics become rank 0's.
local net = nn.Sequential(nn.Conv2d(1, 2, 1, {dtype = "float64", seed = 3}), nn.BatchNorm2d(2, {dtype = "float64"}))
local bn = net.modules[2]
bn.running_mean:fill(rank + 0.5)
bn.running_var:fill(2 * rank + 1.25)
local ddp = crun.DDP(net)
ddp:evaluate()
ddp:forward(T.randn({2, 1, 2, 2}, {seed = 9, dtype = "float64"}))
close(bn.running_mean, {0.5, 0.5}, "running_mean after DDP's buffer broadcast", 0)
close(bn.running_var, {1.25, 1.25}, "running_var after DDP's buffer broadcast", 0)
ddp:close()

print("SYNCBN OK rank " .. rank)
crun.dist.destroy_process_group()
