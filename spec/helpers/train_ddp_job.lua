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
crun.dist.barrier()
crun.save(string.format("%s/done.r%d", out, rank), {world = world})
crun.dist.destroy_process_group()
