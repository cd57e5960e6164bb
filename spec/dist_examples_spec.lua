-- dist_examples_spec.lua — the tutorial examples run and print what they promise.
local run = require "helpers.dist_run"

local function example(n, name)
  local code, out = run.run(n, "examples/" .. name .. ".lua", "", {limit = 60})
  assert.are.equal(0, code, out)
  return out
end

describe("examples", function()
  it("p2p_blocking delivers rank 0's tensor to rank 1", function()
    assert.is_truthy(example(2, "p2p_blocking"):find("Rank 1 has data 1.0", 1, true))
  end)
  it("p2p_nonblocking completes both requests", function()
    local out = example(2, "p2p_nonblocking")
    assert.is_truthy(out:find("Rank 1 has data 1.0 (completed: true)", 1, true), out)
  end)
  it("allreduce sums over 4 ranks and over a sub-group", function()
    local out = example(4, "allreduce")
    assert.is_truthy(out:find("Rank 3 has data 4.0 (world of 4)", 1, true), out)
    assert.is_truthy(out:find("Rank 1 after the group all_reduce: 2.0", 1, true), out)
    assert.is_truthy(out:find("Rank 3 after the group all_reduce: 1.0", 1, true), out)
  end)
  it("ring_allreduce by hand matches dist.all_reduce", function()
    local out = example(3, "ring_allreduce")
    assert.is_truthy(out:find("ring all-reduce gave 6.0 (expected 6.0)", 1, true), out)
  end)
  it("sync_sgd converges with identical replicas", function()
    local out = example(4, "sync_sgd")
    assert.is_truthy(out:find("max |w - w*| = ", 1, true), out)
  end)
end)
