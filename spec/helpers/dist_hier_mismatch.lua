-- dist_hier_mismatch.lua — 4 ranks on fake hosts {0,1} {2,3} (CRUN_HOST_ID=
-- rank_div:2); rank 3 calls something else than the others (argument):
--   bcast_root:  broadcast from rank 1, the others from rank 0
--   reduce_root: reduce to rank 1, the others to rank 0
--   kind:        reduce to rank 0, the others all_reduce
--   avg:         all_reduce avg, the others all_reduce sum
--   p2p_barrier: rank 0 sends int32[3] where rank 1 receives float32[3] (rank 1's
--                group fails); then every rank calls barrier (rank 1 stays 3 s)
--   host_root:   ranks 2-3 (one host) broadcast from rank 2, ranks 0-1 from rank 0
-- Every rank fills its tensor with 100 + rank and prints
-- "rank R: ok <values> after S s" or "rank R: failed after S s: <error>".
local crun = require "crun"
local dist, T = crun.dist, crun.tensor
dist.init_process_group{timeout = 8}
local r, mode = dist.get_rank(), arg[1]
local t = T.full({3}, 100 + r, "int32")
local t0 = crun.clock()
local ok, err = pcall(function()
  local odd = r == 3
  if mode == "bcast_root" then dist.broadcast(t, odd and 1 or 0)
  elseif mode == "reduce_root" then dist.reduce(t, odd and 1 or 0)
  elseif mode == "kind" then if odd then dist.reduce(t, 0) else dist.all_reduce(t) end
  elseif mode == "p2p_barrier" then
    if r == 0 then dist.send(t, 1) elseif r == 1 then pcall(dist.recv, T.zeros({3}), 0) end
    t0 = crun.clock()
    local ok, err = pcall(dist.barrier)
    if r == 1 then os.execute("sleep 3") end
    if not ok then error(err, 0) end
  elseif mode == "host_root" then dist.broadcast(t, r >= 2 and 2 or 0)
  elseif mode == "avg" then dist.all_reduce(t, odd and "avg" or "sum")
  else error("unknown mode " .. tostring(mode)) end
end)
if ok then
  print(string.format("rank %d: ok %s after %.2f s", r, table.concat(t:totable(), ","), crun.clock() - t0))
else
  print(string.format("rank %d: failed after %.2f s: %s", r, crun.clock() - t0, tostring(err)))
end
os.exit(0)
