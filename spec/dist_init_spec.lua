-- dist_init_spec.lua — init_process_group with env://, tcp://, file:// and
-- store=, destroy and re-init, and the misuse errors, on 2 and 3 ranks.
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
