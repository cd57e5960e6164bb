-- nccl_spec.lua — the nccl backend on CUDA tensors (issue 12): the
-- collectives matrix (every op x dtype x world size 1..4 x counts 0, 1, 7,
-- 4099, every root, uneven all_to_all, send/recv), premul_sum, async work,
-- a sub-group, and the error cases (bitwise and int16 ENOTSUP, CPU tensor
-- EINVAL, mismatch, a rank that never calls: ETIMEDOUT naming it from the
-- signature check and from the watchdog, ESTATE after the abort). Each job
-- runs spec/helpers/nccl_cases.lua; every rank's verdicts are checked here.
-- ctest runs it as gpudouble.nccl through the NCCL/CUDA test doubles; the
-- real build's spec.nccl_spec runs it on GPUs and is pending (with the
-- reason) on a machine without one.
local run = require "helpers.dist_run"
local matrix = require "helpers.dist_matrix"

local ok_cuda, cuda = pcall(require, "crun.cuda")
local have_gpu = ok_cuda and cuda.is_available()
local core = require "crun.core"
local why = not ok_cuda and "crun.cuda is not in this build"
  or not have_gpu and "no CUDA device on this machine (crun.cuda.is_available() is false)"
  or not core.have_nccl and "the nccl backend is not in this build (CRUN_WITH_NCCL, NCCL not found)"
  or nil
-- NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU
-- detected"), so on real GPUs an n-rank job needs n devices; the double
-- (CRUN_GPU_DOUBLE=1) has no such limit and runs every size.
local DOUBLE = os.getenv("CRUN_GPU_DOUBLE") == "1"
local ndev = have_gpu and cuda.device_count() or 0
local function fits(n)
  if DOUBLE or n <= ndev then return true end
  pending(("SKIPPED: a %d-rank job needs %d GPUs (NCCL puts one rank on each); this machine has %d"):format(n, n, ndev))
  return false
end

-- The case count of nccl_cases.lua for n ranks, worked out on its own lists.
local function expected(n)
  local reductions = 0
  for _, d in ipairs({"float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "int8", "int16", "bool"}) do
    local ops = d == "bool" and 4 or 5
    reductions = reductions + ops * 4 * (d == "int16" and 1 or 3)
  end
  local moves = 10 * 4 * (3 * n + 2 + (n > 1 and 1 or 0))
  -- premul, bitwise, CPU tensor, async, objects, barrier; sub-group
  return reductions + moves + 6 + (n == 4 and 1 or 0)
end

local function job(n, mode, env)
  local dir = run.tmpdir()
  local code, out = run.run(n, "spec/helpers/nccl_cases.lua", dir .. " " .. mode, {limit = 200, env = env})
  return dir, code, out
end

describe("the nccl backend", function()
  if why then
    pending("SKIPPED: " .. why)
    return
  end

  for n = 1, 4 do
    if fits(n) then it("passes the collectives matrix on CUDA tensors on every rank of a " .. n .. "-rank job", function()
      local dir, code, out = job(n, "matrix")
      matrix.verdicts(dir, n, out, expected(n))
      assert.are.equal(0, code, out)
      run.cleanup(dir)
    end) end
  end

  it("jobs/bench.lua --device cuda prints an nccl-tests table over the nccl backend", function()
    local code, out = run.run(DOUBLE and 2 or math.min(2, ndev), "jobs/bench.lua", "all_reduce --device cuda --sizes 8,4K --warmup 1 --budget 0.2",
                              {limit = 120})
    assert.are.equal(0, code, out)
    assert.truthy(out:find("backend nccl, float32 on cuda, sum", 1, true), out)
    assert.truthy(out:find("%s4096%s+1024%s+float32%s+sum%s+[%d.]+%s+[%d.]+%s+[%d.]+"), out)
  end)

  if fits(3) then it("fails a mismatch with EMISMATCH on every rank, then ESTATE", function()
    local dir, code, out = job(3, "mismatch")
    matrix.verdicts(dir, 3, out, 2)
    assert.are.equal(0, code, out)
    run.cleanup(dir)
  end) end

  if fits(3) then for _, check in ipairs({"1", "0"}) do
    it("names the rank that never called (" .. (check == "1" and "signature check" or "watchdog, CRUN_NCCL_CHECK=0")
       .. ") and is ESTATE after the abort", function()
      local dir, code, out = job(3, "hang", "CRUN_NCCL_CHECK=" .. check)
      for r = 0, 1 do
        local lines = run.lines(dir, r)
        assert.are.same({"ok timeout names the missing rank", "ok estate after the abort", "done 2"}, lines, out)
      end
      assert.are.same({"done 0"}, run.lines(dir, 2), out)
      if check == "0" then assert.truthy(out:find("the watchdog aborted the communicator", 1, true), out) end
      assert.are.equal(0, code, out)
      run.cleanup(dir)
    end)
  end end

  -- A rank whose own check refuses a call (all_to_all_single's split sizes)
  -- fails the group; the nccl backend's abort notice reaches the peers in
  -- the signature check, or (CRUN_NCCL_CHECK=0) through the watchdog while
  -- they wait inside NCCL, so they fail that call naming rank 1 and why.
  for _, n in ipairs({2, 3}) do for _, check in ipairs({"1", "0"}) do for _, m in ipairs({"refuse", "refuse_auto"}) do
    if fits(n) then it(("tells every rank why rank 1 refused all_to_all_single (%s, CRUN_NCCL_CHECK=%s, %d ranks)")
                       :format(m == "refuse" and "nccl" or "auto", check, n), function()
      local dir, code, out = job(n, m, "CRUN_NCCL_CHECK=" .. check)
      for r = 0, n - 1 do
        assert.are.same({"ok every rank fails all_to_all_single naming rank 1", "ok estate after the refusal", "done 2"},
                        run.lines(dir, r), "rank " .. r .. ": " .. out)
      end
      assert.are.equal(0, code, out)
      run.cleanup(dir)
    end) end
  end end end

  -- The same for the root's own check of its gather list (bindings).
  for _, check in ipairs({"1", "0"}) do
    if fits(2) then it(("tells every rank why the root refused its gather list (CRUN_NCCL_CHECK=%s, 2 ranks)"):format(check), function()
      local dir, code, out = job(2, "refuse_gather", "CRUN_NCCL_CHECK=" .. check)
      for r = 0, 1 do
        assert.are.same({"ok every rank fails gather, or a sender its next call, naming the root", "ok estate after the refusal",
                         "done 2"},
                        run.lines(dir, r), "rank " .. r .. ": " .. out)
      end
      assert.are.equal(0, code, out)
      run.cleanup(dir)
    end) end
  end
end)
