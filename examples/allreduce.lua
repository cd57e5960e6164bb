--- examples/allreduce.lua — all_reduce, the tutorial's first collective:
--
--   crun-lua -n 4 examples/allreduce.lua
--
-- Every rank contributes a tensor of ones; after all_reduce(sum) every rank
-- holds the sum. A sub-group shows that a collective can involve only some
-- ranks (every rank creates the group; only members take part).
local crun = require "crun"
local dist, T = crun.dist, crun.tensor

dist.init_process_group{backend = "cpu"}
local rank, size = dist.get_rank(), dist.get_world_size()

local tensor = T.ones({1})
dist.all_reduce(tensor, dist.ReduceOp.SUM)
print(string.format("Rank %d has data %s (world of %d)", rank, tensor[1], size))
assert(tensor[1] == size)

local group = dist.new_group{0, 1}
tensor = T.ones({1})
dist.all_reduce(tensor, "sum", {group = group})    -- a no-op on ranks outside the group
print(string.format("Rank %d after the group all_reduce: %s", rank, tensor[1]))

local w = dist.all_reduce(T.full({3}, rank, "float32"), "max", {async_op = true})
w:wait()
dist.destroy_process_group()
