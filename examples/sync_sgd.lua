--- examples/sync_sgd.lua — distributed synchronous SGD on a toy problem,
-- following the tutorial: every rank computes the gradient on its own shard
-- of the data, the gradients are averaged with all_reduce, and every rank
-- applies the same update, so the replicas stay identical.
--
--   crun-lua -n 4 examples/sync_sgd.lua
--
-- The problem: linear regression y = X w* (+ noise) with plain tensor ops.
local crun = require "crun"
local dist, T = crun.dist, crun.tensor

dist.init_process_group{backend = "cpu"}
local rank, size = dist.get_rank(), dist.get_world_size()

local D, N = 8, 512                         -- features, samples in the whole set
local w_true = T.arange(D, "float32"):add(1):div(D):view(D, 1)

-- Each rank builds its own shard (samples rank, rank+size, ...) from a seeded generator.
local per = N // size
local X = T.randn({per, D}, {seed = 100 + rank})
local y = X:matmul(w_true):add(T.randn({per, 1}, {seed = 200 + rank}):mul(0.01))

-- Every rank starts from the same weights: rank 0's, broadcast.
local w = T.randn({D, 1}, {seed = 7 + rank})
dist.broadcast(w, 0)

local lr = 0.1
for epoch = 1, 60 do
  local err = X:matmul(w):sub(y)                         -- per x 1
  local grad = X:t():matmul(err):mul(2 / per)            -- D x 1, local gradient
  dist.all_reduce(grad, dist.ReduceOp.AVG)               -- the average over ranks
  w:sub_(grad:mul(lr))
  local loss = T.new({err:square():mean()})
  dist.all_reduce(loss, "avg")
  if rank == 0 and (epoch % 10 == 0 or epoch == 1) then
    print(string.format("epoch %3d  loss %.6f", epoch, loss[1]))
  end
end

-- The replicas never diverged: every rank holds bitwise the same weights.
local all = dist.all_gather_object(w:totable())
for r = 2, size do
  for i = 1, D do assert(all[r][i][1] == all[1][i][1], "replicas diverged") end
end
local dist_to_truth = w:sub(w_true):abs():max()
if rank == 0 then print(string.format("max |w - w*| = %.4f", dist_to_truth)) end
assert(dist_to_truth < 0.05, "SGD did not converge")
dist.destroy_process_group()
