-- dist_hier_check.lua — all_reduce (sum, avg, max) at counts around the
-- hierarchical engine's split threshold, every element checked; prints
-- "hier check ok <n> cases" on rank 0. Run with CRUN_HOST_ID to fake hosts.
local crun = require "crun"
local dist, T = crun.dist, crun.tensor
dist.init_process_group{timeout = 60}
local r, n = dist.get_rank(), dist.get_world_size()
local cases = 0
for _, count in ipairs({1, 16383, 16384, 16388, 65536, 100003, 1 << 20}) do
  for _, dtype in ipairs({"float32", "int64", "float64"}) do
    for _, op in ipairs({"sum", "max", "avg"}) do
      local t = T.arange(count, dtype) + r
      dist.all_reduce(t, op)
      -- element i (0-based) of rank q is i + q
      local i = T.arange(count, "float64")
      local want
      if op == "sum" then want = i * n + n * (n - 1) // 2
      elseif op == "max" then want = i + (n - 1)
      elseif dtype == "int64" then want = i + (n - 1) // 2   -- integer avg truncates
      else want = i + (n - 1) / 2 end
      assert(t:to("float64"):allclose(want, 1e-9, 1e-9),
             string.format("rank %d: all_reduce %s %s x %d: got %s..., want %s...", r, op, dtype, count,
                           tostring(t[1]), tostring(want[1])))
      cases = cases + 1
    end
  end
end
if r == 0 then print("hier check ok " .. cases .. " cases") end
dist.destroy_process_group()
