-- Multi-rank job of eval_spec.lua: `crun-lua -n W spec/helpers/train_eval_job.lua OUTDIR`.
-- Runs the exactly-once evaluation for several data set sizes and saves, per
-- rank, the reduced metrics and the indices this rank evaluated.
local crun = require "crun"
local data = crun.data

local out = assert(arg[1], "usage: train_eval_job.lua OUTDIR")
crun.dist.init_process_group{backend = "auto"}
local rank = crun.dist.get_rank()
local res = {}
for _, n in ipairs{0, 1, 5, 7, 10, 101, 1003} do
  local seen = {}
  local m = data.evaluate{size = n, batch_size = 4, metrics = {"idxsum", "batches"}, fn = function(idx)
    local s = 0
    for _, i in ipairs(idx) do seen[#seen + 1] = i; s = s + i end
    return {idxsum = s, batches = 1}
  end}
  res[n] = {count = m.count, idxsum = m.idxsum, seen = seen}
end
crun.save(string.format("%s/eval.r%d.crun", out, rank), res)
crun.dist.destroy_process_group()
