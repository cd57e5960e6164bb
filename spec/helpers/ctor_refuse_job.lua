-- ctor_refuse_job.lua OUTDIR CTOR WHO — a DDP, FSDP or ZeroRedundancyOptimizer
-- constructor whose arguments are wrong on some ranks (group timeout 30 s).
--   CTOR  ddp     bucket_cap_mbb = 5 (a typo'd option key)
--         fsdp    sharding_strategy = "FULL" (a value no rank but the bad one sees)
--         zero    parameters_as_bucket_vew = true (a typo'd option key)
--         zerolr  the wrapped SGD's lr = -0.5 (its optimizer's own check)
--         ddpgroup  DDP on g = new_group() (every rank), the bad one's
--                 process_group misspelled proces_group (then the all_reduce
--                 is g's)
--         ddpnotgroup / fsdpnotgroup / zeronotgroup  process_group = 5 (no
--                 group at all; the good ranks pass none)
--   WHO   one     the last rank alone; the others pass good options
--         all     every rank
-- Then every rank all_reduces {rank - 3.5, ...} on the default group. Each
-- rank writes OUTDIR/rank<r>.txt: the constructor's "ok" or "error <text>",
-- the all_reduce's "ok <sum>" or "error <text>", "elapsed <s>".
package.path = (os.getenv("CRUN_SOURCE_DIR") or ".") .. "/spec/?.lua;" .. package.path
local crun = require "crun"
local nn = require "crun.nn"
local dist, T = crun.dist, crun.tensor

local outdir, ctor, who = arg[1], arg[2], arg[3]
dist.init_process_group{timeout = 30}
local rank, world = dist.get_rank(), dist.get_world_size()
local out = assert(io.open(outdir .. "/rank" .. rank .. ".txt", "w"))
local function record(ok, err) out:write(ok and "ok" or ("error " .. tostring(err)), "\n"); out:flush() end

local bad = who == "all" or rank == world - 1
nn.manual_seed(11)
local m = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
local g = ctor == "ddpgroup" and dist.new_group() or nil
local t0 = crun.clock()
if ctor == "ddpgroup" then
  record(pcall(crun.DDP, m, bad and {proces_group = g} or {process_group = g}))
elseif ctor == "ddpnotgroup" then
  record(pcall(crun.DDP, m, bad and {process_group = 5} or nil))
elseif ctor == "fsdpnotgroup" then
  record(pcall(crun.FSDP, m, bad and {process_group = 5} or nil))
elseif ctor == "zeronotgroup" then
  record(pcall(crun.optim.ZeroRedundancyOptimizer, m, crun.optim.SGD, {lr = 0.1, process_group = bad and 5 or nil}))
elseif ctor == "ddp" then
  record(pcall(crun.DDP, m, bad and {bucket_cap_mbb = 5} or {bucket_cap_mb = 5}))
elseif ctor == "fsdp" then
  record(pcall(crun.FSDP, m, {sharding_strategy = bad and "FULL" or "FULL_SHARD"}))
elseif ctor == "zero" then
  local o = bad and {lr = 0.1, parameters_as_bucket_vew = true} or {lr = 0.1, parameters_as_bucket_view = true}
  record(pcall(crun.optim.ZeroRedundancyOptimizer, m, crun.optim.SGD, o))
elseif ctor == "zerolr" then
  record(pcall(crun.optim.ZeroRedundancyOptimizer, m, crun.optim.SGD, {lr = bad and -0.5 or 0.5}))
end
local u = T.full({4}, rank - 3.5, "float32")
local ok, err = pcall(dist.all_reduce, u, "sum", g)
out:write(ok and string.format("ok %.2f", u[1]) or ("error " .. tostring(err)), "\n")
out:write(string.format("elapsed %.3f\n", crun.clock() - t0))
out:close()
