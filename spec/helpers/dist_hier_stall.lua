-- dist_hier_stall.lua COUNT RANK — 4 ranks on fake hosts {0,1} {2,3}
-- (CRUN_HOST_ID=rank_div:2), timeout 2 s: after one all_reduce of COUNT
-- float32, rank RANK sleeps 4 s while the others run a second one; each of
-- them prints "rank R after S s: <error>".
local crun = require "crun"
local dist, T = crun.dist, crun.tensor
dist.init_process_group{timeout = 2}
local r = dist.get_rank()
local t = T.ones({tonumber(arg[1])})
dist.all_reduce(t)
if r == tonumber(arg[2]) then os.execute("sleep 4"); os.exit(0) end
local t0 = crun.clock()
local ok, err = pcall(dist.all_reduce, t)
print(string.format("rank %d after %.1f s: %s", r, crun.clock() - t0, ok and "no error" or tostring(err)))
os.exit(0)
