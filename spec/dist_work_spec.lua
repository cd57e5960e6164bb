-- dist_work_spec.lua — async Work handles: barriers, result/exception/
-- get_future, tensors kept alive and unclosable while an op is in flight,
-- rank/root/tag arguments range-checked (no narrowing to int).
local run = require "helpers.dist_run"

local function job(n, case, shm)
  local code, out = run.run(n, "spec/helpers/dist_work.lua", case, {limit = 60, env = "CRUN_SHM=" .. shm})
  assert.are.equal(0, code, out)
  for r = 0, n - 1 do assert.is_truthy(out:find("rank " .. r .. " ok " .. case, 1, true), out) end
end

describe("dist Work", function()
  for _, shm in ipairs{"0", "1"} do
    local mode = shm == "0" and "tcp" or "shm"
    for _, case in ipairs{"barrier", "result", "pinned", "ranks", "failed", "waits"} do
      for _, n in ipairs{2, 3} do
        it(string.format("%s, %d ranks, %s", case, n, mode), function() job(n, case, shm) end)
      end
    end
  end
end)
