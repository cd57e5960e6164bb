--- examples/checkpoint.lua — save and resume training with crun.save /
-- crun.load, surviving a crash under `crun-lua --max-restarts`.
--
--   crun-lua -n 2 --max-restarts 1 examples/checkpoint.lua
--
-- Trains a small model for 6 "epochs", checkpointing after each one. On the
-- first run, rank 1 crashes after epoch 3; the launcher restarts every rank,
-- which find the checkpoint and continue at epoch 4 instead of starting over.
-- crun.save writes to a temporary file, fsyncs and renames it, so a crash in
-- the middle of a save never leaves a torn checkpoint behind.
local crun = require "crun"
local nn, optim, T, dist = crun.nn, crun.optim, crun.tensor, crun.dist

dist.init_process_group{backend = "auto"}
local rank = dist.get_rank()
local restarts = tonumber(os.getenv("CRUN_RESTART_COUNT") or "0")
local path = (arg[1] or ("/tmp/crun-checkpoint-example-" .. (os.getenv("USER") or "user"))) .. ".crun"
if restarts == 0 and rank == 0 then os.remove(path) end -- a fresh start on the first run
dist.barrier()

nn.manual_seed(0)
local net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
local opt = optim.Adam(net, {lr = 0.01})
local first = 1
if crun.serialize.exists(path) then
  local ck = crun.load(path)
  net:load_state_dict(ck.model)
  opt:load_state_dict(ck.optim)
  first = ck.epoch + 1
  if rank == 0 then print(string.format("restart %d: resuming after epoch %d", restarts, ck.epoch)) end
end
local model = crun.DDP(net)
local crit = nn.MSECriterion()

for epoch = first, 6 do
  local x = T.randn({32, 4}, {seed = 10 * epoch + rank})
  local out = model:forward(x)
  local loss = crit:forward(out, T.zeros({32, 2}))
  opt:zero_grad()
  model:backward(x, crit:backward(out, T.zeros({32, 2})))
  opt:step()
  if rank == 0 then
    crun.save(path, {epoch = epoch, model = net:state_dict(), optim = opt:state_dict()})
    print(string.format("epoch %d loss %.5f (checkpoint saved)", epoch, loss))
  end
  dist.barrier()
  if epoch == 3 and rank == 1 and restarts == 0 then
    print("rank 1: simulated crash after epoch 3")
    os.exit(1)
  end
end
if rank == 0 then print("done after " .. restarts .. " restart(s)") end
dist.destroy_process_group()
