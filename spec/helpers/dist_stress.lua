-- dist_stress.lua — many small collectives on more ranks than cores (run
-- with 8 ranks on the 2-core machine): waiting must not starve anyone.
local crun = require "crun"
local dist, T = crun.dist, crun.tensor
dist.init_process_group{timeout = 60}
local r, n = dist.get_rank(), dist.get_world_size()
local t0 = crun.clock()
for k = 1, 200 do
  local t = T.full({k * 37}, r, "float32")
  dist.all_reduce(t, "sum")
  assert(t[1] == n * (n - 1) / 2)
  local list = {}
  for j = 1, n do list[j] = T.zeros({5}) end
  dist.all_gather(list, T.full({5}, r, "float32"))
  assert(list[n][1] == n - 1)
  dist.barrier()
end
local big = T.ones({1 << 20})
dist.all_reduce(big, "avg")
assert(big[1] == 1)
if r == 0 then print(string.format("%d ranks: 200 rounds in %.2f s", n, crun.clock() - t0)) end
dist.destroy_process_group()
