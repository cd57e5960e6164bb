-- jobs/doctor.lua: the environment check a user runs first.
local common = require "helpers.common"

describe("jobs/doctor.lua", function()
  it("reports every rank and passes its checks on 3 ranks", function()
    local r = common.run("-n 3 --master-port 0 jobs/doctor.lua", {timeout = 60})
    assert.are.equal(0, r.code, r.out .. r.err)
    for rank = 0, 2 do
      assert.truthy(r.out:find(string.format("%%[0%%]%%s+%d%%s+%%S+%%s+%%d+ cpu", rank)), r.out)
    end
    assert.truthy(r.out:find("[0] all checks passed", 1, true), r.out)
  end)

  it("passes over TCP alone too", function()
    local r = common.run("-n 2 --master-port 0 jobs/doctor.lua", {env = "CRUN_SHM=0", timeout = 60})
    assert.are.equal(0, r.code, r.out .. r.err)
    assert.truthy(r.out:find("all checks passed", 1, true), r.out)
  end)
end)
