-- Multi-rank job of ddp_spec.lua: `crun-lua -n W spec/helpers/train_ddp_job.lua OUTDIR`.
-- Runs every DDP case and saves each rank's final parameters to
-- OUTDIR/<case>.r<rank>.crun, plus OUTDIR/done.r<rank> when all went well.
package.path = (os.getenv("CRUN_SOURCE_DIR") or ".") .. "/spec/?.lua;" .. package.path
local crun = require "crun"
local cases = require "helpers.train_ddp_cases"

local out = assert(arg[1], "usage: train_ddp_job.lua OUTDIR")
crun.dist.init_process_group{backend = "auto"}
local rank, world = crun.dist.get_rank(), crun.dist.get_world_size()
for _, c in ipairs(cases.LIST) do
  local params = cases.run_ddp(c, rank, world)
  crun.save(string.format("%s/%s.r%d.crun", out, c.name, rank), params)
end
-- throw_on_early_termination: rank r has 2 + r batches; every rank must
-- raise EINTR at the third step (rank 0 is out of data by then).
do
  local c = cases.LIST[1]
  local net = cases.model(c.dtype, 1)
  local model = crun.DDP(net, c.ddp)
  local opt = cases.optimizer(net, "sgd")
  local steps = 0
  local ok, err = pcall(crun.join, {model}, function()
    for s = 1, cases.join_batches("inc", rank, world) do
      opt:zero_grad()
      cases.fwd_bwd(model, cases.batch(c.dtype, s, rank))
      opt:step()
      steps = steps + 1
    end
  end, {throw_on_early_termination = true})
  model:close()
  crun.save(string.format("%s/throw.r%d.crun", out, rank), {raised = not ok, msg = tostring(err), steps = steps})
end
-- a model that differs across ranks is refused on every rank, by name
do
  local nn = require "crun.nn"
  local h = rank == world - 1 and 5 or 4
  local net = nn.Sequential(nn.Linear(3, h), nn.ReLU(), nn.Linear(h, 2))
  local ok, err = pcall(crun.DDP, net)
  crun.save(string.format("%s/mismatch.r%d.crun", out, rank), {ok = ok, msg = tostring(err)})
end
crun.dist.barrier()
crun.save(string.format("%s/done.r%d", out, rank), {world = world})
crun.dist.destroy_process_group()
