-- dist_matrix.lua — runs spec/helpers/dist_cases.lua as one job and checks
-- every rank's verdicts; shared by the collectives specs of each transport
-- mode (collectives_matrix_spec: default engines, full matrix;
-- collectives_tcp_spec: CRUN_TRANSPORT=tcp; collectives_hier_spec: fake
-- hosts through CRUN_HOST_ID, the hierarchical engine).
--   check(n, env, {subset = bool, min_cases = k, limit = s})
--   verdicts(dir, n, job_output, min_cases): the per-rank checks alone
local run = require "helpers.dist_run"
local assert = require "luassert"

local M = {}

-- Asserts that every rank of an n-rank job wrote only "ok" lines and then
-- "done N", the same N on every rank, at least min_cases.
function M.verdicts(dir, n, out, min_cases)
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
  assert.is_true(cases >= (min_cases or 650), "only " .. tostring(cases) .. " cases ran")
end

function M.check(n, env, opts)
  opts = opts or {}
  local dir = run.tmpdir()
  local code, out = run.run(n, "spec/helpers/dist_cases.lua", dir .. (opts.subset and " subset" or ""),
                            {limit = opts.limit or 150, env = env})
  M.verdicts(dir, n, out, opts.min_cases)
  assert.are.equal(0, code, out)
  run.cleanup(dir)
end

return M
