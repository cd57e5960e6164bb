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
  -- {what, ranks, extra env, run without the launcher, expected state}
  local cases = {
    {"is on for every rank of a crun-lua job", 4, "", false, "on"},
    {"is off with CRUN_HEAP=0, and the job still passes", 4, " CRUN_HEAP=0", false, "off"},
    {"is off without the launcher (lua5.4 processes)", 3, "", true, "off"},
  }
  for _, c in ipairs(cases) do
    local what, n, env, direct, state = table.unpack(c)
    it(what, function()
      local code, out = run.run(n, "spec/helpers/dist_stress.lua", "",
                                {limit = 60, env = LOG .. env, direct = direct})
      assert.are.equal(0, code, out)
      assert.is_truthy(out:find(n .. " ranks: 200 rounds in", 1, true), out)
      assert.are.equal(n, count(out, "direct path " .. state), out)
    end)
  end
end)

-- The engine spins while it waits when every rank can have a CPU of its own,
-- and yields when ranks must share CPUs. Judged from the whole group's
-- affinity masks: ranks that crun-lua pinned one per CPU spin (a pinned
-- rank's own mask, one CPU, once made every group yield, and 8-byte
-- all_reduce at 2 ranks took twice as long).
describe("shared-memory wait policy", function()
  local p = io.popen("nproc")
  local ncpu = tonumber(p:read("a")) or 1
  p:close()
  -- {what, ranks, extra env (and a command prefix: env runs it), expected policy}
  local cases = {
    {"spins for ranks pinned one per CPU", math.min(ncpu, 4), "", ncpu >= 2 and "spin" or "yield"},
    {"yields with more ranks than CPUs", ncpu + 1, "", "yield"},
    {"yields when every rank may only run on one CPU", 2, " taskset -c 0", "yield"},
  }
  for _, c in ipairs(cases) do
    local what, n, extra, policy = table.unpack(c)
    it(what, function()
      local code, out = run.run(n, "spec/helpers/dist_stress.lua", "", {limit = 60, env = LOG .. extra})
      assert.are.equal(0, code, out)
      assert.are.equal(n, count(out, ", " .. policy .. ", direct path"), out)
    end)
  end
end)
