-- ZeroRedundancyOptimizer: torch's assignment rule on hand-computed
-- examples; on 1-4 ranks (a 109-parameter model: no world size divides it)
-- parameters after k steps with SGD (momentum) and Adam match DDP + the same
-- optimizer, each rank's state covers only its own parameters, the
-- consolidated state equals the plain optimizer's and round-trips through
-- load_state_dict; a checkpoint saved at 4 ranks resumes at 2.
-- Every rank's observations come back from spec/helpers/zero_job.lua.
local util = require "helpers.train_util"
local serialize = require "crun.serialize"

-- Sizes of the job's model: Linear(5,9), Linear(9,4), Linear(4,3) weights and biases.
local SIZES = {45, 9, 36, 4, 12, 3}
local TOTAL = 109
-- Hand-computed owners of SIZES (largest first, to the emptiest rank, lowest on ties).
local OWNERS = {
  [1] = {0, 0, 0, 0, 0, 0},
  -- 45->0 [45,0]; 36->1 [45,36]; 12->1 [45,48]; 9->0 [54,48]; 4->1 [54,52]; 3->1 [54,55]
  [2] = {0, 0, 1, 1, 1, 1},
  -- 45->0; 36->1; 12->2 [45,36,12]; 9->2 [45,36,21]; 4->2 [45,36,25]; 3->2 [45,36,28]
  [3] = {0, 2, 1, 2, 2, 2},
  -- 45->0; 36->1; 12->2; 9->3 [45,36,12,9]; 4->3 [.., 13]; 3->2 [45,36,15,13]
  [4] = {0, 3, 1, 3, 2, 2},
}
local TOTALS = {[1] = {109}, [2] = {54, 55}, [3] = {45, 36, 28}, [4] = {45, 36, 15, 13}}
local STATE_PER_ELEMENT = {sgd = 1, adam = 2} -- momentum_buffer; exp_avg + exp_avg_sq

local function run_job(world, dir, mode)
  local ok, out = util.crun(world, "spec/helpers/zero_job.lua", dir .. " " .. mode)
  assert(ok, "crun-lua -n " .. world .. " zero_job " .. mode .. " failed:\n" .. out)
end

-- Asserts every rank's record of one case at `world` ranks.
local function check_case(name, rec, world, r)
  local where = string.format("%s, %d ranks, rank %d", name, world, r)
  local tol = name:match("f32") and 1e-5 or 1e-12
  assert.is_true(rec.param_err <= tol, where .. ": parameters differ from DDP's by " .. rec.param_err)
  assert.is_true(rec.roundtrip_err <= tol, where .. ": after load_state_dict, parameters differ by " .. rec.roundtrip_err)
  assert.are.same({1, 0.5}, rec.groups_lr, where .. ": param_groups")
  assert.are.equal(1, rec.loaded_lr, where .. ": the rate load_state_dict restored")
  assert.are.same(OWNERS[world], rec.owner, where)
  assert.are.same(TOTALS[world], rec.rank_numel, where)
  -- the state covers exactly this rank's parameters
  local own = {}
  for i, o in ipairs(OWNERS[world]) do if o == r then own[#own + 1] = i end end
  assert.are.same(own, rec.owned, where)
  assert.are.equal(#own, rec.local_entries, where)
  local per = STATE_PER_ELEMENT[name:match("^(%a+)_")]
  assert.are.equal(per * TOTALS[world][r + 1], rec.state_numel, where)
  -- about 1/N: at most the even share plus the largest parameter (greedy's bound)
  assert.is_true(rec.state_numel <= per * (TOTAL / world + 45), where)
  if r == world - 1 then
    assert.are.equal(6, rec.consolidated_entries, where)
    assert.is_nil(rec.consolidated_missing, where)
    assert.is_true(rec.consolidated_err <= tol, where .. ": consolidated state differs by " .. rec.consolidated_err)
  else
    assert.are.equal(string.format("ESTATE: ZeroRedundancyOptimizer:state_dict on rank %d: no consolidated "
      .. "state here; call consolidate_state_dict(to) on every rank (to = %d) after the last step", r, r),
      rec.state_dict_elsewhere)
  end
end

describe("ZeroRedundancyOptimizer", function()
  local have = util.have_launcher()

  it("assigns parameters by torch's greedy rule and lays out each owner's flat buffer", function()
    local zero = require "crun.zero"
    -- sorted 40 (#2), 40 (#3), 30 (#5), 10 (#1), 5 (#4), 1 (#6);
    -- sizes [40,0,0] [40,40,0] [40,40,30] [40,40,40] [45,40,40] [45,41,40]
    local owner, offset, totals, buckets = zero.partition({10, 40, 40, 5, 30, 1}, 3)
    assert.are.same({2, 0, 1, 0, 2, 1}, owner)
    assert.are.same({0, 0, 0, 40, 10, 40}, offset)
    assert.are.same({45, 41, 40}, totals)
    assert.are.same({45, 41, 40}, buckets)
    for world = 1, 4 do
      local o, _, t = zero.partition(SIZES, world)
      assert.are.same(OWNERS[world], o)
      assert.are.same(TOTALS[world], t)
    end
    -- two buffers per rank (keys), e.g. one per dtype
    local _, off2, _, b2 = zero.partition({10, 40, 40, 5, 30, 1}, 3, {0, 1, 0, 1, 1, 0}, 2)
    assert.are.same({0, 0, 0, 40, 0, 40}, off2)
    assert.are.same({0, 45, 41, 0, 10, 30}, b2)
    -- bad input
    assert.has_error(function() zero.partition({3, -1}, 2) end)
    assert.has_error(function() zero.partition({3, 1}, 0) end)
    assert.has_error(function() zero.partition({3, 1}, 2, {0, 2}, 2) end)
  end)

  it("checks its options, the wrapped optimizer's included", function()
    local crun = require "crun"
    local T = util.T()
    local p, g = {T.randn({3})}, {T.zeros({3})}
    local Z = crun.optim.ZeroRedundancyOptimizer
    local ok, err = pcall(Z, {p, g}, crun.optim.Adam, {lr = 0.1, momentum = 0.9})
    assert.is_false(ok)
    assert.is_truthy(tostring(err):match("^EINVAL: ZeroRedundancyOptimizer: unknown option 'momentum' %(accepted: "), err)
    ok, err = pcall(Z, {p, g}, crun.optim.SGD, {lr = 0.1, momentum = 0.9, betas = {0.9, 0.9}})
    assert.is_truthy(tostring(err):match("^EINVAL: ZeroRedundancyOptimizer: unknown option 'betas'"), err)
    ok, err = pcall(Z, {p, g}, "Adam", {lr = 0.1})
    assert.is_truthy(tostring(err):match("bad argument #2 to 'ZeroRedundancyOptimizer'"), err)
    ok, err = pcall(Z, {p}, crun.optim.Adam, {lr = 0.1})
    assert.is_truthy(tostring(err):match("bad argument #1 to 'ZeroRedundancyOptimizer'"), err)
    -- known keys pass the check; without a process group it stops there
    ok, err = pcall(Z, {p, g}, crun.optim.SGD, {lr = 0.1, momentum = 0.9, process_group = nil,
      parameters_as_bucket_view = true})
    assert.is_truthy(tostring(err):match("^ESTATE: ZeroRedundancyOptimizer needs a process group"), err)
    -- a tensor listed twice: a plain optimizer steps it twice, ZeRO's two
    -- owners each once and the later broadcast won (a silent difference)
    local q, gq = T.randn({2}), T.zeros({2})
    ok, err = pcall(Z, {{p[1], q, p[1]}, {g[1], gq, g[1]}}, crun.optim.SGD, {lr = 0.1})
    assert.are.equal("EINVAL: bad argument #1 to 'ZeroRedundancyOptimizer' (parameter 3 is the same tensor as "
      .. "parameter 1: list each tensor once)", err)
    -- a non-boolean parameters_as_bucket_view ("yes", 1) was taken as false
    for _, v in ipairs{"yes", 1} do
      ok, err = pcall(Z, {p, g}, crun.optim.SGD, {lr = 0.1, parameters_as_bucket_view = v})
      assert.are.equal("EINVAL: ZeroRedundancyOptimizer: parameters_as_bucket_view must be true or false, got "
        .. tostring(v), err)
    end
    -- the optimizers themselves check their keys too
    ok, err = pcall(crun.optim.SGD, p, g, {lr = 0.1, betas = {0.9, 0.9}})
    assert.is_truthy(tostring(err):match("^EINVAL: SGD: unknown option 'betas'"), err)
    -- raised at level 2 or 3, these began with the caller's position
    -- ("zero_spec.lua:NN: ESTATE: ...") when called from a Lua function, and the
    -- bad-argument ones had no status at all
    for _, c in ipairs{{function() local z = Z({p, g}, "Adam", {lr = 0.1}) return z end,
                        "^EINVAL: bad argument #2 to 'ZeroRedundancyOptimizer'"},
                       {function() local z = Z({p}, crun.optim.Adam, {lr = 0.1}) return z end,
                        "^EINVAL: bad argument #1 to 'ZeroRedundancyOptimizer'"},
                       {function() local z = Z({p, g}, crun.optim.SGD, {lr = 0.1}) return z end,
                        "^ESTATE: ZeroRedundancyOptimizer needs a process group"}} do
      ok, err = pcall(c[1])
      assert.is_false(ok)
      assert.is_truthy(tostring(err):match(c[2]), err)
    end
  end)

  -- with parameters_as_bucket_view the per-dtype buffers were broadcast in
  -- pairs() order of a dtype table, which follows the process's string-hash
  -- seed: two ranks started apart (another node, a restart) could pair a
  -- float32 broadcast with a float64 one. Each fresh process must give the
  -- same sequence: by owner, then float32, float64, float16, bfloat16.
  it("broadcasts the bucket views in the same order in every process", function()
    local want = "0:float32:6 0:float64:3 1:float32:4 1:float64:5"
    local src = os.getenv("CRUN_SOURCE_DIR") or "."
    for k = 1, 8 do
      local f = assert(io.popen("lua5.4 " .. src .. "/spec/helpers/zero_order.lua 2>&1"))
      local got = f:read("a"):gsub("%s+$", "")
      f:close()
      assert.are.equal(want, got, "process " .. k)
    end
  end)

  for world = 1, 4 do
    it(string.format("matches DDP + the same optimizer on %d rank(s), with 1/N of the state", world), function()
      if not have then pending("crun-lua / crun.dist not built") return end
      local dir = util.tmpdir()
      run_job(world, dir, "run")
      for r = 0, world - 1 do
        local res = serialize.load(string.format("%s/run.r%d.crun", dir, r))
        assert.are.equal(world, res.world)
        local n = 0
        for name, rec in pairs(res.cases) do
          check_case(name, rec, world, r)
          n = n + 1
        end
        assert.are.equal(5, n)
        if world >= 3 and r >= 1 then
          -- ZeRO on the sub-group of ranks 1..world-1 (group rank = global rank - 1)
          local sub = world - 1
          for _, name in ipairs{"sgd_f64_view", "adam_f64"} do
            local rec = res.group[name]
            local where = string.format("%s on the group of %d, rank %d", name, sub, r)
            assert.is_true(rec.param_err <= 1e-12, where .. ": parameters differ from DDP's by " .. rec.param_err)
            assert.are.same(TOTALS[sub], rec.rank_numel, where)
            assert.are.equal(STATE_PER_ELEMENT[name:match("^(%a+)_")] * TOTALS[sub][r], rec.state_numel, where)
            if r == 2 then
              assert.are.equal(6, rec.consolidated_entries, where)
              assert.is_true(rec.consolidated_err <= 1e-12, where)
            else
              -- on a sub-group a message names the global rank and then the group one
              assert.are.equal(string.format("ESTATE: ZeroRedundancyOptimizer:state_dict on rank %d (group rank %d): "
                .. "no consolidated state here; call consolidate_state_dict(to) on every rank (to = %d) after the "
                .. "last step", r, r - 1, r - 1), rec.state_dict_elsewhere, where)
            end
          end
        else
          assert.is_nil(res.group)
        end
        assert.are.equal(string.format("EINVAL: ZeroRedundancyOptimizer:load_state_dict: the state of parameter 2 "
          .. "has no exp_avg (rank %d)", r), res.load_missing)
        assert.are.equal(0, res.load_missing_numel)
        assert.are.equal(0, res.lr_change)
        -- (a fault found before the first collective is refused for the group: every rank refused it, it goes on)
        local refused = world > 1 and " %(every rank refused all_gather #%d+: the group goes on%)" or ""
        assert.matches("^" .. ("EINVAL: bad argument #1 to 'ZeroRedundancyOptimizer' (parameter 3 is the same tensor as "
          .. "parameter 1: list each tensor once)"):gsub("%p", "%%%0") .. refused .. "$", res.duplicate)
        if world == 1 then
          assert.are.equal("ok", res.consolidate_mismatch)
        else
          assert.are.equal(string.format("EMISMATCH: ZeroRedundancyOptimizer:consolidate_state_dict on rank %d: "
            .. "rank 1 names group rank %d as the destination, rank 0 names 0 (every rank must pass the same to)",
            r, world - 1), res.consolidate_mismatch)
        end
        assert.are.equal(r == 0 and 6 or 0, res.consolidate_after)
        if world == 1 then
          assert.are.equal("accepted", res.mismatch)
        else
          assert.are.equal(string.format("EMISMATCH: ZeroRedundancyOptimizer on rank %d: parameter 1 is "
            .. "float32[5x3] on rank %d but float32[4x3] on rank 0 (every rank must pass the same model)",
            r, world - 1), res.mismatch)
        end
      end
      os.execute("rm -rf " .. dir)
    end)
  end

  it("resumes at 2 ranks from a checkpoint saved at 4, still matching DDP", function()
    if not have then pending("crun-lua / crun.dist not built") return end
    local dir = util.tmpdir()
    run_job(4, dir, "run")
    assert.is_true(serialize.exists(dir .. "/ckpt.crun"), "no checkpoint written")
    run_job(2, dir, "resume")
    for r = 0, 1 do
      local res = serialize.load(string.format("%s/resume.r%d.crun", dir, r))
      local where = "rank " .. r
      assert.are.equal(2, res.world)
      assert.are.equal(0, res.start_err, where)
      assert.are.same(TOTALS[2], res.rank_numel, where)
      assert.are.equal(2 * TOTALS[2][r + 1], res.state_numel, where)
      assert.is_true(res.param_err <= 1e-12, where .. ": parameters differ from DDP's by " .. res.param_err)
      assert.is_true(res.moved > 1e-4, where .. ": the resumed steps did not move the parameters")
    end
    os.execute("rm -rf " .. dir)
  end)

  -- An option wrong on one rank alone (a typo'd key; the wrapped optimizer's
  -- bad lr) fails every rank's constructor within seconds, naming that rank
  -- and its fault (the peers' shape check is refused for them); the same
  -- fault on every rank stops nothing.
  it("fails every rank promptly when rank 1 alone passes a bad option (2 ranks)", function()
    if not util.have_launcher() then pending("crun-lua not built") return end
    require("helpers.ctor_refuse").one("zero", "ZeroRedundancyOptimizer: unknown option 'parameters_as_bucket_vew'",
      "all_gather")
  end)
  it("fails every rank promptly when rank 1 alone gives its optimizer a bad lr (2 ranks)", function()
    if not util.have_launcher() then pending("crun-lua not built") return end
    require("helpers.ctor_refuse").one("zerolr", "SGD: lr must be a number >= 0, got -0.5", "all_gather")
  end)
  it("goes on when every rank passes the same bad option (2 ranks)", function()
    if not util.have_launcher() then pending("crun-lua not built") return end
    require("helpers.ctor_refuse").all("zero", "ZeroRedundancyOptimizer: unknown option 'parameters_as_bucket_vew'",
      "all_gather")
  end)
end)
