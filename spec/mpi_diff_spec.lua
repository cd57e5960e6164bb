-- mpi_diff_spec.lua — differential test of the mpi backend against the cpu
-- backend: spec/helpers/mpi_diff.lua runs once under `mpirun -np N crun-lua`
-- (mpi) and once under `crun-lua -n N` (cpu) on the same seeded random inputs
-- (every dtype, op and collective, uneven all_to_all, a p2p ring); every
-- rank's results must match: integers and data movement exactly, float
-- reductions within rounding (the backends add in other orders, and mpi sums
-- float16/bfloat16 in float32, rounding once).
local mpi = require "helpers.mpi_run"
local run = require "helpers.dist_run"

local ok, why = mpi.available()
local INT = {int32 = true, int64 = true, uint8 = true}
-- rtol = atol per float dtype: a few units in the last place of a sum of 4
local TOL = {float32 = 1e-5, float64 = 1e-12, float16 = 1e-2, bfloat16 = 4e-2}

-- Returns nil when the two results agree, else why not.
local function differ(name, a, b)
  if type(a) ~= "table" or type(b) ~= "table" then return "mpi: " .. tostring(a) .. ", cpu: " .. tostring(b) end
  if #a ~= #b then return #a .. " tensors from mpi, " .. #b .. " from cpu" end
  local exact = not name:match("^all_reduce") and not name:match("^reduce") or name:match(" min ")
                or name:match(" max ")
  for i = 1, #a do
    local x, y = a[i], b[i]
    if x:dtype() ~= y:dtype() or x:numel() ~= y:numel() then return "tensor " .. i .. ": shapes or dtypes differ" end
    local tol = not exact and not INT[x:dtype()] and TOL[x:dtype()]
    local same = tol and x:to("float64"):allclose(y:to("float64"), tol, tol) or (not tol and x:equal(y))
    if not same then return "tensor " .. i .. " differs:\nmpi " .. tostring(x) .. "\ncpu " .. tostring(y) end
  end
end

describe("the mpi and cpu backends", function()
  if not ok then
    pending("skipped: " .. why)
    return
  end
  local S = require "crun.serialize"

  for _, n in ipairs({2, 3, 4}) do
    it("give the same results for the same random inputs on " .. n .. " ranks", function()
      local dir = run.tmpdir()
      local code, out = mpi.run(n, "spec/helpers/mpi_diff.lua", dir .. " 3", {limit = 150})
      assert.are.equal(0, code, out)
      code, out = run.run(n, "spec/helpers/mpi_diff.lua", dir .. " 3", {limit = 150})
      assert.are.equal(0, code, out)
      local checked = 0
      for r = 0, n - 1 do
        local m, c = S.load(dir .. "/mpi/rank" .. r .. ".bin"), S.load(dir .. "/cpu/rank" .. r .. ".bin")
        assert.are.same(c.order, m.order)
        local bad = {}
        for _, name in ipairs(m.order) do
          local why_not = differ(name, m.results[name], c.results[name])
          if why_not then bad[#bad + 1] = "rank " .. r .. " " .. name .. ": " .. why_not end
          checked = checked + 1
        end
        assert.are.same({}, bad)
      end
      assert.is_true(checked > 150 * n, "only " .. checked .. " cases compared")
      run.cleanup(dir)
    end)
  end
end)
