-- dist_hier_die.lua — 4 ranks on fake hosts {0,1} {2,3} (CRUN_HOST_ID=
-- rank_div:2): rank 3 exits after one all_reduce; every other rank's next
-- all_reduce must fail within seconds (not at the 30 s timeout), and prints
-- "rank R failed after S s: <error>". The optional argument is the count of
-- the failing all_reduce (default 4; a large one runs the split pipeline).
local crun = require "crun"
local dist, T = crun.dist, crun.tensor
dist.init_process_group{timeout = 30}
local r = dist.get_rank()
local t = T.ones({4})
dist.all_reduce(t)
if r == 3 then os.exit(0) end
t = T.ones({tonumber(arg[1]) or 4})
local t0 = crun.clock()
local ok, err = pcall(dist.all_reduce, t)
print(string.format("rank %d failed after %.2f s: %s", r, crun.clock() - t0, ok and "no error" or tostring(err)))
