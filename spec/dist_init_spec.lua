-- dist_init_spec.lua — init_process_group with env://, tcp://, file:// and
-- store=, destroy and re-init, and the misuse errors, on 2 and 3 ranks.
local tmpname = require("helpers.common").tmpname -- os.tmpname() under TMPDIR
local run = require "helpers.dist_run"

describe("dist.init_process_group", function()
  for _, n in ipairs({2, 3}) do
    it("works in every form on " .. n .. " ranks", function()
      local dir = run.tmpdir()
      local code, out = run.run(n, "spec/helpers/dist_init.lua", dir, {limit = 60})
      for r = 0, n - 1 do
        local lines = run.lines(dir, r)
        assert.is_true(#lines > 0, "rank " .. r .. " wrote nothing:\n" .. out)
        assert.are.equal("done 11", lines[#lines], table.concat(lines, "\n") .. "\n" .. out)
        for i = 1, #lines - 1 do assert.is_truthy(lines[i]:match("^ok "), lines[i]) end
      end
      assert.are.equal(0, code, out)
      run.cleanup(dir)
    end)
  end
end)

-- torch's capability probes, which porting code calls before choosing a
-- backend or reading torchrun's variables; they were missing (a nil call)
describe("dist.is_*_available and is_torchelastic_launched", function()
  it("answer as torch's for crun's backends and launcher", function()
    local dist, core = require "crun.dist", require "crun.core"
    assert.is_true(dist.is_gloo_available())
    assert.are.equal(core.have_mpi == true, dist.is_mpi_available())
    assert.are.equal(core.have_nccl == true, dist.is_nccl_available())
    assert.is_false(dist.is_ucc_available())
    local path = tmpname()
    local f = assert(io.open(path, "w"))
    f:write('print("launched", require("crun.dist").is_torchelastic_launched())\n')
    f:close()
    local function run_it(cmd)
      local p = assert(io.popen(cmd .. " 2>&1"))
      local out = p:read("a"); p:close()
      return out
    end
    -- under crun-lua (which sets TORCHELASTIC_RUN_ID, as torchrun) and alone
    local launched = run_it(string.format("env -u TORCHELASTIC_RUN_ID %s -n 1 --master-port 0 %s", os.getenv("CRUN_LUA"), path))
    local alone = run_it(string.format("env -u TORCHELASTIC_RUN_ID lua5.4 %s", path))
    os.remove(path)
    assert.is_truthy(launched:find("launched\ttrue", 1, true), launched)
    assert.is_truthy(alone:find("launched\tfalse", 1, true), alone)
  end)
end)
