-- collectives_matrix_spec.lua — every collective x op x dtype x world sizes
-- 1-4 x counts 0, 1, 7, 100003, in-place and out-of-place, async ordering,
-- sub-groups, objects and send/recv matching: one job per world size runs
-- spec/helpers/dist_cases.lua and every rank's verdicts are checked here.
local run = require "helpers.dist_run"

local SCRIPT = "spec/helpers/dist_cases.lua"

-- Each world size runs with the default engines (shared memory takes what it
-- supports on one host) and, from 2 ranks, over TCP alone (CRUN_SHM=0).
local RUNS = {{1, "CRUN_SHM=1"}, {2, "CRUN_SHM=1"}, {3, "CRUN_SHM=1"}, {4, "CRUN_SHM=1"},
              {2, "CRUN_SHM=0"}, {3, "CRUN_SHM=0"}, {4, "CRUN_SHM=0"}}

describe("collectives over the cpu backend", function()
  for _, job in ipairs(RUNS) do
    local n, env = job[1], job[2]
    it("pass every case on every rank of a " .. n .. "-rank job with " .. env, function()
      local dir = run.tmpdir()
      local code, out = run.run(n, SCRIPT, dir, {limit = 150, env = env})
      local cases
      for r = 0, n - 1 do
        local lines = run.lines(dir, r)
        assert.is_true(#lines > 0, "rank " .. r .. " wrote nothing; job output:\n" .. out)
        local last = lines[#lines]
        local done = tonumber(last:match("^done (%d+)$"))
        assert.is_not_nil(done, "rank " .. r .. " did not finish (last line: " .. last .. "); output:\n" .. out)
        local failed = {}
        for i = 1, #lines - 1 do
          if not lines[i]:match("^ok ") then failed[#failed + 1] = lines[i] end
        end
        assert.are.same({}, failed)
        assert.are.equal(done, #lines - 1)
        cases = cases or done
        assert.are.equal(cases, done)
      end
      assert.is_true(cases > 650, "only " .. tostring(cases) .. " cases ran")
      assert.are.equal(0, code, out)
      run.cleanup(dir)
    end)
  end
end)
