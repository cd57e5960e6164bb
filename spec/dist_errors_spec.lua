-- dist_errors_spec.lua — what ranks see when a job goes wrong: a collective
-- mismatch, a count mismatch, a late rank (timeout report read from the
-- store's progress board) and a peer killed mid all_reduce. Every rank must
-- fail with a message naming the ranks and calls, never hang.
local run = require "helpers.dist_run"
local expect = require "helpers.dist_expect"

local SCRIPT = "spec/helpers/dist_errors.lua"

-- Over TCP alone (CRUN_SHM=0): the shared-memory engine words its own reports.
local function scenario(mode, opts)
  opts = opts or {limit = 60}
  opts.env = opts.env or "CRUN_SHM=0"
  local dir = run.tmpdir()
  local _, out = run.run(3, SCRIPT, mode .. " " .. dir, opts)
  local res = {}
  for r = 0, 2 do res[r] = run.text(dir, r) end
  run.cleanup(dir)
  return res, out
end

describe("dist failures", function()
  it("report a different collective on every rank, naming both calls", function()
    expect.mismatch(scenario("mismatch"))
  end)

  it("report a mismatch on every rank with the shared-memory engine too", function()
    local res, out = scenario("count", {limit = 60, env = "CRUN_SHM=1"})
    for r = 0, 2 do
      assert.is_truthy(res[r]:match("^error EMISMATCH: "), "rank " .. r .. ": " .. res[r] .. "\n" .. out)
      assert.is_truthy(res[r]:find("float32[512]", 1, true), res[r])
    end
  end)

  it("report a different count on every rank", function()
    expect.count(scenario("count"))
  end)

  it("time out naming the late rank and where every rank is", function()
    local res, out = scenario("timeout")
    for r = 0, 1 do
      local t = res[r]
      assert.is_truthy(t:match("^error ETIMEDOUT: "), "rank " .. r .. ": " .. t .. "\n" .. out)
      assert.is_truthy(t:find("all_reduce #2", 1, true), t)
      assert.is_truthy(t:find("rank 2 is at barrier #1", 1, true), t)
      assert.is_true(tonumber(t:match("elapsed ([%d.]+)")) < 5, t)
    end
    -- rank 1 waits on rank 2 itself: its own report names it
    assert.is_truthy(res[1]:find("no data from rank 2 after 1.0 s", 1, true), res[1])
    assert.is_truthy(res[1]:find("ranks 0-1 are at all_reduce #2", 1, true), res[1])
    -- the late rank fails too instead of hanging
    assert.is_truthy(res[2]:match("^error E"), res[2] .. "\n" .. out)
  end)

  it("fail promptly with EPEERDIED when a peer is killed mid all_reduce", function()
    local res, out = scenario("kill", {limit = 60, direct = true})
    for r = 0, 1 do
      local t = res[r]
      assert.is_truthy(t:match("^error EPEERDIED: ") or t:match("^error ECONNRESET: "), "rank " .. r .. ": " .. t .. "\n" .. out)
      assert.is_truthy(t:find("rank 2", 1, true), t)
      assert.is_true(tonumber(t:match("elapsed ([%d.]+)")) < 10, t)
    end
  end)
end)
