-- ctor_refuse.lua — runs spec/helpers/ctor_refuse_job.lua on 2 ranks and
-- asserts what every rank saw after a constructor (DDP, FSDP,
-- ZeroRedundancyOptimizer) refused its arguments on the last rank alone or
-- on every rank (see the job for the faults).
local assert = require "luassert"
local run = require "helpers.dist_run"

local M = {}

-- The lines of each of the n ranks, and the job's output.
local function job(n, ctor, who)
  local dir = run.tmpdir()
  local _, out = run.run(n, "spec/helpers/ctor_refuse_job.lua", dir .. " " .. ctor .. " " .. who, {limit = 60})
  local res = {}
  for r = 0, n - 1 do res[r] = run.lines(dir, r) end
  run.cleanup(dir)
  return res, out
end

--- Rank 1 alone refused: it fails with the EINVAL naming `why`; rank 0 fails
--- the same constructor within seconds (not the group's 30 s timeout) with
--- that text and "rank 1 refused its part of <call>", never an EMISMATCH;
--- the group has stopped (the all_reduce after fails on both).
function M.one(ctor, why, call)
  local res, out = job(2, ctor, "one")
  for r = 0, 1 do
    local l, says = res[r], "rank " .. r .. ": " .. table.concat(res[r], "\n") .. "\n" .. out
    assert.is_truthy(l[1] and l[1]:match("^error EINVAL: ") and l[1]:find(why, 1, true), says)
    -- rank 1 names itself (crun.opts's " (rank 1)" or "<ctor> on rank 1: "); the
    -- peer's note names it once more, never after a second "(rank 1)"
    if r == 1 then assert.is_truthy(l[1]:find("(rank 1)", 1, true) or l[1]:find(" on rank 1: ", 1, true), says) end
    if r == 0 then assert.is_truthy(l[1]:find(" (rank 1 refused its part of " .. call, 1, true), says) end
    assert.is_falsy(l[1]:find("(rank 1) (rank 1", 1, true), says)
    assert.is_truthy(l[2] and l[2]:match("^error E") and not l[2]:find("EMISMATCH", 1, true), says)
    assert.is_truthy(l[3] and tonumber(l[3]:match("^elapsed (%S+)")) < 10, says)
  end
end

--- Every rank refused the same: each gets its EINVAL naming `why` (a %d
--- there: that rank) and that
--- every rank refused <call> (the group goes on); the all_reduce after
--- succeeds: -3.5 + -2.5 = -6.
function M.all(ctor, why, call)
  local res, out = job(2, ctor, "all")
  for r = 0, 1 do
    local l, says = res[r], "rank " .. r .. ": " .. table.concat(res[r], "\n") .. "\n" .. out
    assert.is_truthy(l[1] and l[1]:match("^error EINVAL: ") and l[1]:find(why:format(r), 1, true)
                     and (l[1]:find(string.format("(rank %d)", r), 1, true)
                          or l[1]:find(string.format(" on rank %d: ", r), 1, true)), says)
    assert.is_truthy(l[1]:find("every rank refused " .. call .. " #1: the group goes on", 1, true), says)
    assert.are.equal("ok -6.00", l[2], says)
    assert.is_truthy(l[3] and tonumber(l[3]:match("^elapsed (%S+)")) < 10, says)
  end
end

return M
