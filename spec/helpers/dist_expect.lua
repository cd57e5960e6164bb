-- dist_expect.lua — what every rank of a 3-rank job must report in the
-- mismatch scenarios of spec/helpers/dist_errors.lua; shared by the cpu
-- backend's spec (dist_errors_spec) and the mpi backend's (mpi_collectives_spec).
-- res[r] is the text rank r wrote; out is the job's output, shown on failure.
local assert = require "luassert"

local M = {}

-- Rank 2 called all_gather float32[512] where the others called all_reduce.
function M.mismatch(res, out)
  for r = 0, 2 do
    local t = res[r]
    assert.is_truthy(t:match("^error EMISMATCH: "), "rank " .. r .. ": " .. t .. "\n" .. out)
    for _, want in ipairs({"all_reduce", "all_gather", "float32[512]", "rank 2"}) do
      assert.is_truthy(t:find(want, 1, true), t)
    end
  end
end

-- Rank 2 called all_reduce with 512 elements where the others gave 1024.
function M.count(res, out)
  for r = 0, 2 do
    local t = res[r]
    assert.is_truthy(t:match("^error EMISMATCH: all_reduce #1 on rank %d"), "rank " .. r .. ": " .. t .. "\n" .. out)
    assert.is_truthy(t:find("float32[1024]", 1, true) and t:find("float32[512]", 1, true), t)
  end
end

-- Rank 0, the root, refused its part of a gather/scatter (rootgather,
-- rootscatter, rootlist* modes): every rank's first error names its reason
-- `why`, and no rank sees an EMISMATCH between unrelated calls.
function M.root_refused(res, out, why)
  for r = 0, 2 do
    local first = res[r]:match("^ok\n([^\n]*)") or res[r]:match("^[^\n]*")
    assert.is_truthy(first:match("^error EINVAL: ") and first:find(why, 1, true), "rank " .. r .. ": " .. res[r] .. "\n" .. out)
    assert.is_falsy(res[r]:find("EMISMATCH", 1, true), res[r])
  end
end

-- Asserts what each of the n ranks saw in scenario objroot:fname (rank 1's
-- bad root `what` on a subgroup, then on the default group): each call and
-- the group's next fail on every rank naming rank 1 and the fault.
function M.objroot_refused(res, out, n, fname, what)
  for r = 0, n - 1 do
    local l = {}
    for line in (res[r] .. "\n"):gmatch("(.-)\n") do l[#l + 1] = line end
    for i, why in ipairs{what .. " " .. (n + 3) .. " is not in the group", what .. " " .. n .. " is out of range (0.."
                         .. (n - 1) .. ")"} do
      why = fname .. " on rank 1: " .. why
      local a, b = l[2 * i - 1], l[2 * i]
      assert.is_truthy(a and a:match("^error EINVAL: ") and a:find(why, 1, true), "rank " .. r .. ": " .. res[r] .. "\n" .. out)
      assert.is_truthy(b and b:match("^error E") and b:find(why, 1, true), "rank " .. r .. ": " .. res[r])
    end
    assert.is_falsy(res[r]:find("EMISMATCH", 1, true), res[r])
  end
end

return M
