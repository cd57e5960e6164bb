-- crun.FSDP: on 1-4 ranks (a 181-parameter model: no world size divides it)
-- parameters after k steps under FULL_SHARD, SHARD_GRAD_OP and NO_SHARD,
-- with and without auto_wrap, with SGD (momentum) and Adam, match DDP + the
-- same optimizer; each rank holds its padded 1/N slice and, while sharded,
-- its leaves hold no parameter elements; between steps it holds its shards
-- and nothing pooled; the gathers per step follow the strategy; a model with
-- three equal-size units (they take turns with the same pooled buffers)
-- matches DDP under FULL_SHARD and SHARD_GRAD_OP; a sharded checkpoint saved at 4 ranks (with Adam's state)
-- resumes at 1, 2, 3 and 4 ranks and continues exactly at 4.
-- Every rank's observations come back from spec/helpers/fsdp_job.lua.
local tmpname = require("helpers.common").tmpname -- os.tmpname() under TMPDIR
local util = require "helpers.train_util"
local serialize = require "crun.serialize"

local STEPS = 3
local SIZES_WRAP = {21, 88, 72} -- root unit {Linear(6,3)}, Linear(7,11), Linear(11,6)
local SIZES_EQUAL = {21, 48, 42, 42, 42} -- root unit {Linear(6,3)}, Linear(7,6), 3 x Linear(6,6)

local function ceil_div(a, b) return (a + b - 1) // b end

local function run_job(world, dir, mode)
  local ok, out = util.crun(world, "spec/helpers/fsdp_job.lua", dir .. " " .. mode)
  assert(ok, "crun-lua -n " .. world .. " fsdp_job " .. mode .. " failed:\n" .. out)
end

describe("FSDP", function()
  local have = util.have_launcher()
  local dir = tmpname()
  os.remove(dir)

  it("splits a flat buffer into padded shards", function()
    local fsdp = require "crun.fsdp"
    assert.are.same({0, 46, 46}, {fsdp.shard_range(181, 4, 0)})
    assert.are.same({138, 43, 46}, {fsdp.shard_range(181, 4, 3)})
    assert.are.same({2, 0, 1}, {fsdp.shard_range(2, 3, 2)})
  end)

  -- the bindings read an absent trailing argument after pushing their arrays:
  -- fsdp_layout({7}, 3) took the array for no_shard = true (shard 7, not 3),
  -- zero_partition({...}, 2) took it for the key list (EINVAL, table expected)
  it("core.fsdp_layout and core.zero_partition read absent trailing arguments as nil", function()
    local core = require "crun.core"
    assert.are.same({{0}, 7, 9, 3}, {core.fsdp_layout({7}, 3)})
    assert.are.same({{0}, 7, 7, 7}, {core.fsdp_layout({7}, 3, true)})
    assert.are.same({1, 0, 1}, (core.zero_partition({10, 40, 5}, 2)))
  end)

  for world = 1, 4 do
    it(string.format("matches DDP under every strategy on %d rank(s)", world), function()
      if not have then pending("crun-lua not built") return end
      assert(os.execute("mkdir -p " .. dir))
      run_job(world, dir, "run")
      for r = 0, world - 1 do
        local rec = serialize.load(string.format("%s/run.r%d.crun", dir, r))
        for _, c in ipairs(rec.cases) do
          local where = string.format("%s, %d ranks, rank %d", c.name, world, r)
          local wrap = c.name:match("_wrap") ~= nil
          local equal = c.name:match("_equal") ~= nil
          local no_shard = c.name:match("^NO_SHARD") ~= nil
          local sizes = equal and SIZES_EQUAL or wrap and SIZES_WRAP or {181}
          assert.are.equal(#sizes, c.units, where)
          if r == 0 then
            local tol = c.name:match("float32") and 1e-5 or 1e-12
            assert.are.equal(equal and 10 or 6, c.nparams, where)
            assert.is_true(c.param_err <= tol, where .. ": parameters differ from DDP's by " .. c.param_err)
          else
            assert.is_true(c.state_dict_elsewhere, where .. ": the full state_dict is rank 0's only")
          end
          local want = 0
          for _, n in ipairs(sizes) do want = want + (no_shard and n or ceil_div(n, world)) end
          assert.are.equal(want, c.shard_numel, where)
          assert.are.equal(no_shard and 181 or 0, c.leaf_numel, where)
          -- between steps a rank holds its shards (NO_SHARD: and its full gradient buffer), no pooled buffer
          assert.are.same({params = want * c.elsize, grads = (no_shard and 2 or 1) * want * c.elsize, pool = 0},
            c.mem, where .. ": bytes held between steps")
          local per_step = c.name:match("^FULL_SHARD") and 2 or c.name:match("^SHARD_GRAD_OP") and 1 or 0
          assert.are.equal(per_step * c.units * STEPS, c.gathers, where .. ": gathers")
        end
        assert.matches("^EINVAL: FSDP: sharding_strategy must be", rec.bad_strategy)
        assert.matches("^ENOTSUP: FSDP: mixed_precision param_dtype = float16", rec.half)
        -- a fault found before FSDP's first collective is refused for the group:
        -- on more than one rank, every rank refused it and the group goes on
        local function unrefused(text)
          local body, n = text:gsub(" %(every rank refused all_gather #%d+: the group goes on%)$", "")
          assert.are.equal(world > 1 and 1 or 0, n, text)
          return body
        end
        assert.are.equal(string.format("ENOTSUP: FSDP: mixed_precision param_dtype = float32 but unit 1's parameters "
          .. "are float64: crun computes in the parameters' dtype (convert the module instead) (rank %d)", r),
          unrefused(rec.param32))
        assert.are.equal("accepted", rec.param64)
        local suffix = string.format(" (rank %d)", r)
        assert.are.same({"EINVAL: FSDP: auto_wrap must be {min_params = N} with N >= 1, got min_params = " .. (0 / 0)
          .. suffix, "EINVAL: FSDP: forward_prefetch must be true or false, got no" .. suffix,
          "EINVAL: FSDP: backward_prefetch must be true or false, got 0" .. suffix,
          "EINVAL: FSDP: mixed_precision must be a table {reduce_dtype=, param_dtype=, buffer_dtype=}, got string"
          .. suffix}, {unrefused(rec.bad_opts[1]), unrefused(rec.bad_opts[2]), unrefused(rec.bad_opts[3]),
          unrefused(rec.bad_opts[4])})
        local why = ": the module's parameters are sharded by crun.FSDP: build the optimizer from the FSDP model "
          .. "it returned, not from the module it wraps" .. suffix
        assert.are.same({"EINVAL: SGD" .. why, "EINVAL: Adam" .. why, "EINVAL: ZeroRedundancyOptimizer" .. why},
          {rec.inner_opt[1], rec.inner_opt[2], unrefused(rec.inner_opt[3])})
        assert.are.equal("EINVAL: bad argument #1 to 'ZeroRedundancyOptimizer' (an FSDP model: its parameters are "
          .. "already this rank's shards, step them with a plain crun.optim optimizer)" .. suffix, unrefused(rec.zero_over_fsdp))
        assert.are.same({"EINVAL: DDP: an FSDP model is already data parallel (it averages its gradients itself)"
          .. suffix,
          "EINVAL: DDP: the module's parameters are sharded by crun.FSDP: train the FSDP model it returned, not the "
          .. "module it wraps" .. suffix,
          "EINVAL: FSDP: the module's parameters are sharded by crun.FSDP: wrap a module once" .. suffix},
          {unrefused(rec.rewrap[1]), unrefused(rec.rewrap[2]), unrefused(rec.rewrap[3])})
        if world == 1 then
          assert.are.equal("accepted", rec.mismatch)
        else
          assert.are.equal(string.format("EMISMATCH: FSDP: parameter 1 is float32[6x2] (unit 1) on rank %d but "
            .. "float32[3x5] (unit 1) on rank 0 (every rank must wrap the same model, with the same auto_wrap) "
            .. "(rank %d)", world - 1, r), rec.mismatch)
        end
        assert.is_true(rec.usable_after)
        if world >= 3 and r >= 1 then
          assert.are.equal(string.format("EMISMATCH: FSDP: parameter 1 is float32[6x2] (unit 1) on rank %d "
            .. "(group rank %d) but float32[3x5] (unit 1) on rank 1 (group rank 0) (every rank must wrap the same model, "
            .. "with the same auto_wrap) (rank %d)", world - 1, world - 2, r), rec.group_mismatch, "rank " .. r)
        end
      end
    end)
  end

  for _, world in ipairs{4, 2, 3, 1} do
    it(string.format("resumes a 4-rank sharded checkpoint on %d rank(s)", world), function()
      if not have then pending("crun-lua not built") return end
      run_job(world, dir, "resume")
      local rec = serialize.load(dir .. "/resume.r0.crun")
      assert.is_true(rec.load_err <= 1e-15, "parameters after loading differ by " .. rec.load_err)
      assert.are.equal(STEPS, rec.steps_in_state)
      assert.are.same({lr = 0.01, betas = {0.8, 0.99}}, rec.resumed_opts)
      if world == 4 then
        assert.is_true(rec.after_err <= 1e-12, "two more steps differ from DDP's by " .. rec.after_err)
      end
    end)
  end

  -- each rank passing its own part only (or a list with a part missing or
  -- doubled) loaded the wrong slices without a word: every rank must get
  -- every old rank's part, and EINVAL says which is missing
  for world = 1, 4 do
    it(string.format("load_sharded_state_dict checks it has every rank's part, on %d rank(s)", world), function()
      if not have then pending("crun-lua not built") return end
      assert(os.execute("mkdir -p " .. dir))
      run_job(world, dir, "parts")
      for r = 0, world - 1 do
        local p = serialize.load(string.format("%s/parts.r%d.crun", dir, r)).parts
        local where = string.format("%d ranks, rank %d", world, r)
        assert.are.equal("loaded 0", p.reversed, where)
        local pre, post = "EINVAL: FSDP:load_sharded_state_dict: ", string.format(" (rank %d)", r)
        if world == 1 then
          assert.are.equal("loaded 0", p.own, where)
          assert.are.equal(pre .. "a list of every rank's sharded_state_dict is expected" .. post, p.missing, where)
          assert.are.equal("loaded 0", p.dup, where)
        else
          local want = r == 0 and 1 or 0
          assert.are.equal(pre .. string.format("rank %d's part is missing (the checkpoint was saved at %d ranks, "
            .. "1 part given: pass every rank's sharded_state_dict)", want, world) .. post, p.own, where)
          assert.are.equal(pre .. string.format("rank %d's part is missing (the checkpoint was saved at %d ranks, "
            .. "%d %s given: pass every rank's sharded_state_dict)", world - 1, world, world - 1,
            world == 2 and "part" or "parts") .. post, p.missing, where)
          assert.are.equal(pre .. string.format("parts 1 and %d are both rank 0's", world) .. post, p.dup, where)
        end
        assert.are.equal(string.format("EMISMATCH: FSDP:load_sharded_state_dict: the parts hold %d of unit 1's 181 "
          .. "elements (rank 0's shard has 1)", 1 + (world - 1) * ceil_div(181, world)) .. post, p.short, where)
        assert.are.equal("EMISMATCH: FSDP:load_sharded_state_dict: the checkpoint holds 2 units (rank 0's part), "
          .. "this model 1" .. post, p.extra, where)
        -- the optimizer's state: another kind, another model's optimizer, a
        -- part without it: refused on every rank, nothing loaded
        local o = serialize.load(string.format("%s/parts.r%d.crun", dir, r)).optim
        assert.are.same({pre .. "the checkpoint holds Adam state, the optimizer is SGD" .. post, true}, o.into_sgd,
          where)
        assert.are.same({pre .. "the optimizer does not step this model's shards (build it from this FSDP model)"
          .. post, true}, o.foreign, where)
        if world > 1 then
          assert.are.same({pre .. "rank 1's part has no optimizer state for unit 1, rank 0's has" .. post, true},
            o.without, where)
        end
        -- the caller's list is not reordered
        assert.are.equal(world - 1, serialize.load(string.format("%s/parts.r%d.crun", dir, r)).parts_order, where)
      end
    end)
  end

  -- a model with BatchNorm: the full state_dict left the buffers out
  for _, world in ipairs{1, 3} do
    it(string.format("state_dict holds the buffers too, as the module's does, on %d rank(s)", world), function()
      if not have then pending("crun-lua not built") return end
      assert(os.execute("mkdir -p " .. dir))
      run_job(world, dir, "bn")
      local rec = serialize.load(dir .. "/bn.r0.crun").bn
      assert.is_true(type(rec.state_err) == "number" and rec.state_err <= 1e-12, tostring(rec.state_err))
    end)
  end

  -- FSDP had no clip_grad_norm_; nn.utils.clip_grad_norm_ of the shards
  -- alone would clip each rank by its own shards' norm
  for _, world in ipairs{1, 3} do
    it(string.format("clip_grad_norm_ takes the norm over every rank's shards, as DDP's whole gradients, "
      .. "on %d rank(s)", world), function()
      if not have then pending("crun-lua not built") return end
      assert(os.execute("mkdir -p " .. dir))
      run_job(world, dir, "clip")
      for r = 0, world - 1 do
        local got = serialize.load(string.format("%s/clip.r%d.crun", dir, r)).clip
        local n = 0
        for name, c in pairs(got) do
          n = n + 1
          local where = string.format("%d ranks, rank %d, %s", world, r, name)
          assert.is_true(c.want > 0.05, where .. ": the case must clip, norm " .. c.want)
          assert.is_true(math.abs(c.got - c.want) <= 1e-12 * c.want, string.format("%s: %.17g vs %.17g", where,
            c.got, c.want))
          if r == 0 then assert.is_true(c.param_err <= 1e-12, where .. ": parameters " .. c.param_err) end
        end
        assert.are.equal(9, n)
      end
    end)
  end

  -- FSDP had no load_state_dict: torch's model.load_state_dict(full) was
  -- a raw 'attempt to call a nil value'
  for _, world in ipairs{1, 3} do
    it(string.format("load_state_dict takes the full state_dict back on every rank, on %d rank(s)", world), function()
      if not have then pending("crun-lua not built") return end
      assert(os.execute("mkdir -p " .. dir))
      run_job(world, dir, "bn")
      for r = 0, world - 1 do
        local rec = serialize.load(string.format("%s/bn.r%d.crun", dir, r)).bn
        local where = string.format("%d ranks, rank %d", world, r)
        assert.are.equal("loaded", rec.load, where)
        assert.are.equal(string.format("EINVAL: FSDP:load_state_dict: tensor 1 has shape 7x6, the model's has 6x7 "
          .. "(rank %d)", r), rec.bad_shape, where)
        assert.are.equal(string.format("EINVAL: FSDP:load_state_dict: expected 9 tensors (6 parameters, 3 buffers) "
          .. "or the 6 parameters, got 8 (rank %d)", r), rec.bad_count, where)
        assert.are.equal(string.format("EINVAL: FSDP:load_state_dict: a state dict keyed by names (key \"0.weight\") "
          .. "is not supported yet: FSDP loads the list form (state_dict() without keyed) (rank %d)", r),
          rec.keyed_load, where)
        assert.are.equal(string.format("EINVAL: FSDP:state_dict: options are not supported (a keyed state dict is "
          .. "Module:state_dict's, not yet FSDP's: FSDP gives the list form) (rank %d)", r), rec.keyed_sd, where)
        if r == 0 then
          assert.is_true(type(rec.load_err) == "number" and rec.load_err <= 1e-12, tostring(rec.load_err))
          assert.is_true(type(rec.unchanged_err) == "number" and rec.unchanged_err <= 1e-12,
            tostring(rec.unchanged_err))
        end
      end
    end)
  end

  -- An option value wrong on one rank alone fails every rank's FSDP within
  -- seconds, naming that rank and its fault (the peers' layout check is
  -- refused for them); the same fault on every rank stops nothing.
  it("fails every rank promptly when rank 1 alone passes a bad option (2 ranks)", function()
    if not have then pending("crun-lua / crun.dist not built") return end
    require("helpers.ctor_refuse").one("fsdp", "FSDP: sharding_strategy must be FULL_SHARD, SHARD_GRAD_OP or NO_SHARD, "
      .. "got FULL", "all_gather")
  end)
  it("goes on when every rank passes the same bad option (2 ranks)", function()
    if not have then pending("crun-lua / crun.dist not built") return end
    require("helpers.ctor_refuse").all("fsdp", "FSDP: sharding_strategy must be FULL_SHARD, SHARD_GRAD_OP or NO_SHARD, "
      .. "got FULL", "all_gather")
  end)

  teardown(function() os.execute("rm -rf " .. dir) end)
end)
