-- bench/lat_phase.lua — a 2-rank small all_reduce timed the way jobs/bench.lua
-- times it (every op on its own, the max over ranks), with what decides that
-- figure printed beside it: each rank's own median, the median start skew
-- |d| between the ranks, and how often its sign flips from one op to the next
-- (runtime/transport/shm/README.md, third and fifth passes).
--
--   CRUN_SHM=1 crun-lua -n 2 bench/lat_phase.lua [OPS (20000)]
local crun = require "crun"
local dist, T = crun.dist, crun.tensor
dist.init_process_group{}
assert(dist.get_world_size() == 2, "lat_phase.lua runs on 2 ranks")
local t = T.ones({2}, "float32")
local N = tonumber(arg[1] or 20000)
local clock, ar = crun.clock, dist.all_reduce
for _ = 1, 50 do ar(t) end
local st, du = {}, {}
for i = 1, N do st[i] = 0; du[i] = 0 end
dist.barrier()
for i = 1, N do
  local t0 = clock()
  ar(t)
  local t1 = clock()
  st[i] = t0; du[i] = t1 - t0
end
local S, D = T.new(st, "float64"), T.new(du, "float64")
local starts, durs = {}, {}
for r = 0, 1 do
  local s, d = S:clone(), D:clone()
  dist.broadcast(s, r); dist.broadcast(d, r)
  starts[r], durs[r] = s:totable(), d:totable()
end
local function median(v)
  local c = {}
  for i = 1, #v do c[i] = v[i] end
  table.sort(c)
  return c[(#c + 1) // 2]
end
if dist.get_rank() == 0 then
  local mx, skew, flips = {}, {}, 0
  for i = 1, N do
    mx[i] = math.max(durs[0][i], durs[1][i])
    skew[i] = math.abs(starts[1][i] - starts[0][i])
    if i > 1 and (starts[1][i] > starts[0][i]) ~= (starts[1][i - 1] > starts[0][i - 1]) then flips = flips + 1 end
  end
  print(string.format("max %.0f ns  |d| %.0f  rank0 %.0f  rank1 %.0f  flips %.2f", median(mx) * 1e9,
                      median(skew) * 1e9, median(durs[0]) * 1e9, median(durs[1]) * 1e9, flips / (N - 1)))
end
dist.destroy_process_group()
