-- collectives_matrix_spec.lua — every collective x op x dtype x world sizes
-- 1-4 x counts 0, 1, 7, 100003, in-place and out-of-place, async ordering,
-- sub-groups, objects and send/recv matching with the default engines (the
-- shared-memory engine on one host): one job per world size runs
-- spec/helpers/dist_cases.lua and every rank's verdicts are checked here.
-- The same cases run trimmed over TCP alone (collectives_tcp_spec) and
-- across fake hosts (collectives_hier_spec).
local matrix = require "helpers.dist_matrix"

describe("collectives over the cpu backend with the default engines", function()
  for n = 1, 4 do
    it("pass every case on every rank of a " .. n .. "-rank job", function()
      matrix.check(n, "CRUN_TRANSPORT=auto")
    end)
  end
end)
