-- hello.lua — the smallest crun job: every rank meets the others at a store
-- barrier, says hello, and exits.
--
--   crun-lua -n 8 examples/hello.lua
--
-- crun-lua gives each rank RANK and WORLD_SIZE and serves a TCP store at
-- MASTER_ADDR:MASTER_PORT; crun.store.from_env() connects to it. Also runs
-- under `mpirun -np 8 crun-lua examples/hello.lua` (rank 0 hosts the store).
local crun = require "crun"

local rank = tonumber(os.getenv("RANK") or "0")
local world_size = tonumber(os.getenv("WORLD_SIZE") or "1")
local store = crun.store.from_env{timeout = 60}
crun.store.barrier(store, "hello", world_size, rank, 60)
print(string.format("hello from rank %d of %d", rank, world_size))
-- Under mpirun/srun rank 0 hosts the store itself (under crun-lua the
-- launcher does): it must stay until every rank is done with the store.
if rank == 0 then
  local keys = {}
  for r = 1, world_size - 1 do keys[#keys + 1] = "hello/bye/" .. r end
  store:wait(keys, 60)
else
  store:set("hello/bye/" .. rank, "1")
end
store:close()
