--- examples/classify.lua — a typical torch classification loop, ported:
-- DistributedSampler + set_epoch, DataLoader over a TensorDataset, DDP,
-- CrossEntropyLoss(reduction="none") averaged over the labelled samples
-- only, clip_grad_norm_, SGD with momentum, StepLR, eval mode and the
-- accuracy summed over ranks with all_reduce.
--
--   crun-lua -n 2 examples/classify.lua
--
-- What differs from torch: labels are 1-based, and backward is explicit: the
-- criterion's backward takes the gradient of our masked mean (mask / count).
local crun = require "crun"
local dist, T, nn, optim, data = crun.dist, crun.tensor, crun.nn, crun.optim, crun.data

dist.init_process_group("gloo")
local rank, world = dist.get_rank(), dist.get_world_size()

-- 3 classes: the largest of the first 3 features; about 1 in 5 training
-- samples unlabelled (mask 0). Every rank builds the same data set.
local function make(n, seed)
  local X = T.randn({n, 8}, {seed = seed})
  return X, X:narrow(2, 1, 3):argmax{dim = 2}, T.rand({n}, {seed = seed + 1}):gt(0.2):float()
end
local Xtr, ytr, mtr = make(600, 1)
local Xte, yte = make(300, 7)
local train = data.TensorDataset(Xtr, ytr, mtr)
local sampler = data.DistributedSampler(train, {shuffle = true, seed = 0})
local loader = data.DataLoader(train, {batch_size = 32, sampler = sampler})
local test = data.DataLoader(data.TensorDataset(Xte, yte), {batch_size = 100,
  sampler = data.DistributedSampler{size = 300, shuffle = false, drop_padding = true}})

T.manual_seed(0)                                  -- the same initial weights on every rank
local model = crun.DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3)))
local criterion = nn.CrossEntropyLoss{reduction = "none"}
local opt = optim.SGD(model:parameters(), {lr = 0.1, momentum = 0.9})
local sched = optim.lr_scheduler.StepLR(opt, {step_size = 4, gamma = 0.5})

for epoch = 0, 7 do
  sampler:set_epoch(epoch)
  model:train()
  for b, x, y, mask in loader:iter() do
    opt:zero_grad()
    local out = model(x)
    local count = math.max(mask:sum(), 1)
    local loss = criterion(out, y):mul(mask):sum() / count   -- (loss * mask).sum() / count
    model:backward(x, criterion:backward(out, y, mask:div(count)))
    nn.utils.clip_grad_norm_(model:parameters(), 1.0)
    opt:step()
    if rank == 0 and b == 1 then io.write(string.format("epoch %d  loss %.4f  lr %.3f", epoch, loss, sched:get_last_lr()[1])) end
  end
  sched:step()
  model:eval()                                    -- each rank scores its share of the test set
  local correct = T.zeros({2}, "int64")           -- {correct, seen}
  for _, x, y in test:iter() do
    correct[1] = correct[1] + model(x):argmax{dim = 2}:eq(y):sum():item()
    correct[2] = correct[2] + y:size(1)
  end
  dist.all_reduce(correct)
  if rank == 0 then print(string.format("  test accuracy %.1f %% (%d of %d)", 100 * correct[1] / correct[2], correct[1], correct[2])) end
end

-- DDP kept the replicas identical
local sums = {}
for i, p in ipairs(model:parameters()) do sums[i] = p:double():sum() end
for r, s in ipairs(dist.all_gather_object(sums)) do
  for i = 1, #sums do assert(s[i] == sums[i], "replica " .. (r - 1) .. " diverged") end
end
dist.destroy_process_group()
