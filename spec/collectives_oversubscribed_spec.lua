-- collectives_oversubscribed_spec.lua — 8 ranks on a 2-core machine: 200
-- rounds of all_reduce/all_gather/barrier plus a 4 MiB all_reduce finish in
-- seconds, over TCP alone and with the shared-memory engine (the
-- hierarchical engine's 8-rank runs are in collectives_hier_spec).
local run = require "helpers.dist_run"

describe("collectives with more ranks than cores", function()
  for _, env in ipairs({"CRUN_TRANSPORT=tcp", "CRUN_TRANSPORT=shm"}) do
    it("run 8 ranks with " .. env, function()
      local code, out = run.run(8, "spec/helpers/dist_stress.lua", "", {limit = 120, env = env})
      assert.are.equal(0, code, out)
      assert.is_truthy(out:find("8 ranks: 200 rounds in", 1, true), out)
    end)
  end
end)
