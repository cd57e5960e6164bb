-- dist_hier_disagree.lua <mode> <odd> [timeout] — run on fake hosts (CRUN_HOST_ID=
-- rank_div:K): every rank but <odd> calls all_reduce(sum) on float32[3]
-- holding 100 + rank; <odd> (a list "2,3" names several ranks) calls instead:
--   avg    all_reduce avg        max    all_reduce max
--   sum    all_reduce sum, the others avg
--   dtype  float64[3]            count  float32[5]
--   kind   broadcast from rank 0
--   all_gather / reduce_scatter / all_to_all   that collective (on TCP,
--          not in the hierarchical engine) of float32[3] per rank
-- [timeout] is the group's timeout in seconds (default 8).
-- Every rank prints "rank R: ok <values> after S s" or "rank R: failed after
-- S s: <error>", then "rank R: next ok" or "rank R: next <error>" for an
-- all_reduce that follows (a failed group must refuse it).
local crun = require "crun"
local dist, T = crun.dist, crun.tensor
dist.init_process_group{timeout = tonumber(arg[3]) or 8}
local r, mode = dist.get_rank(), arg[1]
local odd = false
for q in (arg[2] or ""):gmatch("%d+") do odd = odd or tonumber(q) == r end
local t = T.full({(mode == "count" and odd) and 5 or 3}, 100 + r, (mode == "dtype" and odd) and "float64" or "float32")
local op = "sum"
if odd and (mode == "avg" or mode == "max") then op = mode end
if mode == "sum" and not odd then op = "avg" end
local t0 = crun.clock()
local ok, err = pcall(function()
  if not odd then return dist.all_reduce(t, op) end
  local n = dist.get_world_size()
  if mode == "kind" then dist.broadcast(t, 0)
  elseif mode == "all_gather" then
    local out = {}
    for i = 1, n do out[i] = T.zeros({3}, "float32") end
    dist.all_gather(out, t)
  elseif mode == "reduce_scatter" then
    local ins = {}
    for i = 1, n do ins[i] = T.full({3}, 10 * r + i, "float32") end
    dist.reduce_scatter(t, ins)
  elseif mode == "all_to_all" then
    local ins, outs = {}, {}
    for i = 1, n do ins[i], outs[i] = T.full({3}, 10 * r + i, "float32"), T.zeros({3}, "float32") end
    dist.all_to_all(outs, ins)
  else dist.all_reduce(t, op) end
end)
if ok then
  print(string.format("rank %d: ok %s after %.2f s", r, table.concat(t:totable(), ","), crun.clock() - t0))
else
  print(string.format("rank %d: failed after %.2f s: %s", r, crun.clock() - t0, tostring(err)))
end
local ok2, err2 = pcall(dist.all_reduce, T.full({3}, 1, "float32"))
print(string.format("rank %d: next %s", r, ok2 and "ok" or tostring(err2)))
os.exit(0)
