-- shm_direct_spec.lua — under crun-lua large tensors live in the node's
-- shared heap and same-host collectives take the direct path (peers' buffers
-- read and written in place); without the launcher, or with CRUN_HEAP=0, the
-- same job runs on the bounce path. The results themselves are checked by
-- dist_stress and, for every collective x dtype x op, by collectives_matrix.
local run = require "helpers.dist_run"

local LOG = "CRUN_TRANSPORT=shm CRUN_DEBUG=INFO CRUN_DEBUG_SUBSYS=SHM"

local function count(out, needle)
  local k = 0
  for _ in out:gmatch(needle:gsub("%p", "%%%0")) do k = k + 1 end
  return k
end

describe("shared-memory direct path", function()
  it("is on for every rank of a crun-lua job", function()
    local code, out = run.run(4, "spec/helpers/dist_stress.lua", "", {limit = 60, env = LOG})
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find("4 ranks: 200 rounds in", 1, true), out)
    assert.are.equal(4, count(out, "direct path on"), out)
  end)

  it("is off with CRUN_HEAP=0, and the job still passes", function()
    local code, out = run.run(4, "spec/helpers/dist_stress.lua", "",
                              {limit = 60, env = LOG .. " CRUN_HEAP=0"})
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find("4 ranks: 200 rounds in", 1, true), out)
    assert.are.equal(4, count(out, "direct path off"), out)
  end)

  it("is off without the launcher (lua5.4 processes)", function()
    local code, out = run.run(3, "spec/helpers/dist_stress.lua", "",
                              {limit = 60, env = LOG, direct = true})
    assert.are.equal(0, code, out)
    assert.are.equal(3, count(out, "direct path off"), out)
  end)
end)
