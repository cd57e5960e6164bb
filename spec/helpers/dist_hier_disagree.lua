-- dist_hier_disagree.lua <mode> <odd> — run on fake hosts (CRUN_HOST_ID=
-- rank_div:K): every rank but <odd> calls all_reduce(sum) on float32[3]
-- holding 100 + rank; <odd> (a list "2,3" names several ranks) calls instead:
--   avg    all_reduce avg        max    all_reduce max
--   sum    all_reduce sum, the others avg
--   dtype  float64[3]            count  float32[5]
--   kind   broadcast from rank 0
-- Every rank prints "rank R: ok <values> after S s" or "rank R: failed after
-- S s: <error>", then "rank R: next ok" or "rank R: next <error>" for an
-- all_reduce that follows (a failed group must refuse it).
local crun = require "crun"
local dist, T = crun.dist, crun.tensor
dist.init_process_group{timeout = 8}
local r, mode = dist.get_rank(), arg[1]
local odd = false
for q in (arg[2] or ""):gmatch("%d+") do odd = odd or tonumber(q) == r end
local t = T.full({(mode == "count" and odd) and 5 or 3}, 100 + r, (mode == "dtype" and odd) and "float64" or "float32")
local op = "sum"
if odd and (mode == "avg" or mode == "max") then op = mode end
if mode == "sum" and not odd then op = "avg" end
local t0 = crun.clock()
local ok, err = pcall(function()
  if mode == "kind" and odd then dist.broadcast(t, 0) else dist.all_reduce(t, op) end
end)
if ok then
  print(string.format("rank %d: ok %s after %.2f s", r, table.concat(t:totable(), ","), crun.clock() - t0))
else
  print(string.format("rank %d: failed after %.2f s: %s", r, crun.clock() - t0, tostring(err)))
end
local ok2, err2 = pcall(dist.all_reduce, T.full({3}, 1, "float32"))
print(string.format("rank %d: next %s", r, ok2 and "ok" or tostring(err2)))
os.exit(0)
