--- examples/p2p_blocking.lua — blocking point-to-point, as in the tutorial
-- "Writing Distributed Applications with PyTorch":
--
--   crun-lua -n 2 examples/p2p_blocking.lua
--
-- Rank 0 sends a tensor to rank 1. send() returns once the bytes are handed
-- to the transport; recv() blocks until they arrived and returns the sender.
local crun = require "crun"
local dist, T = crun.dist, crun.tensor

dist.init_process_group{backend = "cpu"}
local rank = dist.get_rank()
local tensor = T.zeros({1})
if rank == 0 then
  tensor[1] = tensor[1] + 1
  dist.send(tensor, 1)            -- to rank 1
elseif rank == 1 then
  local from = dist.recv(tensor, 0)  -- from rank 0 (leave it out: any source)
  assert(from == 0)
end
print(string.format("Rank %d has data %s", rank, tensor[1]))
dist.destroy_process_group()
