--- examples/ring_allreduce.lua — a ring all-reduce written by hand on
-- isend/recv, as in the tutorial (the cpu backend's own ring, in
-- runtime/algo/allreduce_ring.c, adds a reduce-scatter/all-gather split):
--
--   crun-lua -n 4 examples/ring_allreduce.lua
--
-- Each rank passes a buffer to its right neighbour size-1 times, adding what
-- arrives from its left neighbour, so every rank ends with the sum.
local crun = require "crun"
local dist, T = crun.dist, crun.tensor

--- Sums `send` over all ranks into `recv` with point-to-point messages only.
local function ring_allreduce(send, recv)
  local rank, size = dist.get_rank(), dist.get_world_size()
  local right, left = (rank + 1) % size, (rank - 1 + size) % size
  local send_buff, recv_buff = send:clone(), T.zeros_like(send)
  local accum = send:clone()
  for _ = 1, size - 1 do
    local req = dist.isend(send_buff, right)
    dist.recv(recv_buff, left)
    accum:add_(recv_buff)
    req:wait()
    send_buff:copy(recv_buff)   -- pass on what we received
  end
  recv:copy(accum)
end

dist.init_process_group{backend = "cpu"}
local rank, size = dist.get_rank(), dist.get_world_size()
local t = T.full({4}, rank + 1, "float32")
local result = T.zeros({4})
ring_allreduce(t, result)
local expected = size * (size + 1) / 2
print(string.format("Rank %d: ring all-reduce gave %s (expected %s)", rank, result[1], expected))
assert(result[1] == expected and result[4] == expected)

local check = t:clone()
dist.all_reduce(check, "sum")
assert(check:equal(result), "hand-written ring and dist.all_reduce disagree")
dist.destroy_process_group()
