--- examples/uneven_inputs.lua — DDP with a different number of batches per
-- rank, kept in step by crun.join (torch's Join context manager).
--
--   crun-lua -n 4 examples/uneven_inputs.lua
--
-- Rank r trains on 5 + r batches. Without join, rank 0 would leave after 5
-- steps while the others wait forever in their 6th all_reduce. Inside
-- crun.join, a rank that runs out of batches keeps answering the others'
-- collectives with zeros until every rank is done; then all ranks take the
-- parameters of the rank that trained longest, so the model is identical
-- everywhere.
local crun = require "crun"
local nn, optim, T, dist = crun.nn, crun.optim, crun.tensor, crun.dist

dist.init_process_group{backend = "auto"}
local rank, world = dist.get_rank(), dist.get_world_size()

nn.manual_seed(0)
local net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
local model = crun.DDP(net)
local opt = optim.SGD(model, {lr = 0.05})
local crit = nn.MSECriterion()

local batches = 5 + rank
crun.join({model}, function()
  for b = 1, batches do
    local x = T.randn({16, 8}, {seed = 100 * rank + b})
    local y = T.zeros({16, 1})
    for i = 1, 16 do y[i][1] = x[i][1] - 0.5 * x[i][2] end -- a target to fit
    local out = model:forward(x)
    local loss = crit:forward(out, y)
    opt:zero_grad()
    model:backward(x, crit:backward(out, y))
    opt:step()
    print(string.format("rank %d batch %d/%d loss %.4f", rank, b, batches, loss))
  end
  print(string.format("rank %d is out of data; shadowing the others", rank))
end)

-- Every rank now holds the same parameters: compare a checksum.
local sum = 0
for _, p in ipairs((net:parameters())) do
  local f = p:view(p:numel())
  for i = 1, p:numel() do sum = sum + f[i] end
end
local all = dist.all_gather_object(sum)
local same = true
for _, s in ipairs(all) do same = same and s == all[1] end
if rank == 0 then print(string.format("parameters identical on all %d ranks: %s", world, tostring(same))) end
dist.destroy_process_group()
