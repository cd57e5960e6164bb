-- The fault-injection job (jobs/fault_inject.lua), short: 5 runs that each
-- kill a random rank or the launcher during random collectives, then check
-- the survivors' errors, the launcher's summary and that nothing is left.
-- `make fault-inject` runs 100.
local C = require "helpers.common"

describe("fault injection", function()
  it("5 random kills during collectives: named errors, the summary, nothing left", function()
    local seed = os.time() % 100000
    local cmd = string.format("cd %s && timeout -s KILL 300 lua5.4 jobs/fault_inject.lua --runs 5 " ..
      "--seed %d --crun %s 2>&1", C.q(C.SOURCE), seed, C.q(C.CRUN_LUA))
    local p = io.popen(cmd)
    local out = p:read("a")
    local ok = p:close()
    assert.is_true(ok and true or false, out)
    assert.is_truthy(out:find("fault injection: 5 of 5 runs passed", 1, true), out)
  end)
end)
