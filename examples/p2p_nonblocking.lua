--- examples/p2p_nonblocking.lua — non-blocking point-to-point:
--
--   crun-lua -n 2 examples/p2p_nonblocking.lua
--
-- isend()/irecv() return a crun.Work at once; the tensor must not be read or
-- written until req:wait() returned (the transfer runs on the group's
-- progress thread meanwhile, so the rank can compute).
local crun = require "crun"
local dist, T = crun.dist, crun.tensor

dist.init_process_group{backend = "cpu"}
local rank = dist.get_rank()
local tensor = T.zeros({1})
local req
if rank == 0 then
  tensor[1] = tensor[1] + 1
  req = dist.isend(tensor, 1)
  print("Rank 0 started sending")
elseif rank == 1 then
  req = dist.irecv(tensor, 0)
  print("Rank 1 started receiving")
end
if req then
  req:wait()
  print(string.format("Rank %d has data %s (completed: %s)", rank, tensor[1], tostring(req:is_completed())))
end
dist.destroy_process_group()
