-- One process of zero_spec.lua's "same broadcast order" case: ZeRO with
-- parameters_as_bucket_view over a stub crun.dist of 2 ranks (this one rank
-- 0), float32 and float64 parameters on both owners; prints the sequence of
-- broadcasts one step makes ("src:dtype:numel ...").
local calls = {}
package.loaded["crun.dist"] = {
  is_initialized = function() return true end,
  get_world_size = function() return 2 end,
  get_rank = function() return 0 end,
  all_gather_object = function(o) return {o, o} end,
  broadcast = function(t, src) calls[#calls + 1] = string.format("%d:%s:%d", src, t:dtype(), t:numel()) end,
}
local crun = require "crun"
local T = crun.tensor
local p, g = {}, {}
for i, s in ipairs{{6, "float32"}, {5, "float64"}, {4, "float32"}, {3, "float64"}} do
  p[i] = T.randn({s[1]}, {seed = i, dtype = s[2]})
  g[i] = T.randn({s[1]}, {seed = 10 + i, dtype = s[2]})
end
local z = crun.optim.ZeroRedundancyOptimizer({p, g}, crun.optim.SGD, {lr = 0.1, parameters_as_bucket_view = true})
z:step()
print(table.concat(calls, " "))
