-- dist_matrix.lua — runs spec/helpers/dist_cases.lua as one job and checks
-- every rank's verdicts; shared by the collectives specs of each transport
-- mode (collectives_matrix_spec: default engines, full matrix;
-- collectives_tcp_spec: CRUN_TRANSPORT=tcp; collectives_hier_spec: fake
-- hosts through CRUN_HOST_ID, the hierarchical engine).
--   check(n, env, {subset = bool, limit = s})
--   verdicts(dir, n, job_output, want): the per-rank checks alone
--   expected_cases(n, subset): how many cases dist_cases.lua must run
local run = require "helpers.dist_run"
local assert = require "luassert"

local M = {}

-- The case count of dist_cases.lua, worked out here on its own lists (a dtype,
-- op, count or root that the job stops running makes the count differ).
function M.expected_cases(n, subset)
  local floats = {"float32", "float64", "float16", "bfloat16"}
  local ints = {"int32", "int64", "uint8", "int8", "int16"}
  local nops = {}
  for _, d in ipairs(floats) do nops[d] = 5 end  -- sum product min max avg
  for _, d in ipairs(ints) do nops[d] = 8 end    -- and band bor bxor
  nops.bool = 7                                  -- no avg on bool
  local moves = 5 + 3 * n -- all_gather x3, all_to_all x2; broadcast/gather/scatter per root
  local total = 0
  for d, k in pairs(nops) do
    for _, count in ipairs({0, 1, 7, "big"}) do
      local ops, mv
      if not subset then
        ops, mv = k, true
      else
        if d == "float32" and count == "big" then ops = 5
        elseif d == "int32" and count == "big" then ops = 8
        elseif count == 7 or d == "float32" then ops = 1 -- sum
        else ops = 0 end
        mv = count == 7 or d == "float32" or (d == "int32" and count == "big")
      end
      total = total + 4 * ops + (mv and moves or 0)
    end
  end
  -- premul_sum: all_reduce, reduce, reduce_scatter per float dtype (float32
  -- alone in the subset) x counts 7 and the large one, and its error case
  total = total + 3 * 2 * (subset and 1 or 4) + 1
  -- bitwise on float, avg on bool, async ordering, objects, send/recv, sub-groups
  return total + 6
end

-- Asserts that every rank of an n-rank job wrote only "ok" lines and then
-- "done N", the same N on every rank, exactly `want`.
function M.verdicts(dir, n, out, want)
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
  assert.are.equal(want, cases, "cases run (expected " .. tostring(want) .. ")")
end

function M.check(n, env, opts)
  opts = opts or {}
  local dir = run.tmpdir()
  local code, out = run.run(n, "spec/helpers/dist_cases.lua", dir .. (opts.subset and " subset" or ""),
                            {limit = opts.limit or 150, env = env})
  M.verdicts(dir, n, out, M.expected_cases(n, opts.subset))
  assert.are.equal(0, code, out)
  run.cleanup(dir)
end

return M
