-- DDP: k steps on 2 and 4 ranks end with the parameters of 1 process on the
-- concatenated global batches (float64 within 1e-5, float32 within 1e-4);
-- no_sync accumulation and Join with uneven batch counts likewise.
local util = require "helpers.train_util"
local cases = require "helpers.train_ddp_cases"
local serialize = require "crun.serialize"

local function check_world(world)
  local dir = util.tmpdir()
  local ok, out = util.crun(world, "spec/helpers/train_ddp_job.lua", dir)
  assert(ok, "crun-lua -n " .. world .. " failed:\n" .. out)
  for r = 0, world - 1 do
    assert.is_true(serialize.exists(string.format("%s/done.r%d", dir, r)), "rank " .. r .. " did not finish")
  end
  for _, c in ipairs(cases.LIST) do
    local ref = cases.run_reference(c, world)
    local tol = c.dtype == "float64" and 1e-5 or 1e-4
    for r = 0, world - 1 do
      local got = serialize.load(string.format("%s/%s.r%d.crun", dir, c.name, r))
      assert.are.equal(#ref, #got)
      for i = 1, #ref do
        local e = util.max_rel_err(got[i], ref[i])
        assert.is_true(e < tol, string.format("%s, %d ranks, rank %d, parameter %d: relative error %g",
          c.name, world, r, i, e))
      end
    end
  end
  for r = 0, world - 1 do
    local t = serialize.load(string.format("%s/throw.r%d.crun", dir, r))
    if world == 1 then
      assert.is_false(t.raised, t.msg)
      assert.are.equal(2, t.steps)
    else
      assert.is_true(t.raised, "rank " .. r .. " did not raise")
      assert.is_truthy(t.msg:match("^EINTR: join on rank " .. r .. ": "), t.msg)
      assert.are.equal(2, t.steps)
    end
  end
  for r = 0, world - 1 do
    local m = serialize.load(string.format("%s/mismatch.r%d.crun", dir, r))
    if world == 1 then
      assert.is_true(m.ok, m.msg)
    else
      assert.is_false(m.ok)
      assert.are.equal(string.format("EMISMATCH: DDP on rank %d: parameter 1 is float32[5x3] on rank %d but "
        .. "float32[4x3] on rank 0 (every rank must wrap the same model)", r, world - 1), m.msg)
    end
  end
  os.execute("rm -rf " .. dir)
end

describe("DDP equivalence", function()
  local have = util.have_launcher()

  it("groups gradients into buckets in reverse order, capped by size and dtype", function()
    local ddp = require "crun.ddp"
    local T = util.T()
    -- float32 parameters of 400, 40, 800, 20 bytes, then a float64 one
    local params = {T.zeros({100}), T.zeros({2, 5}), T.zeros({200}), T.zeros({5}), T.zeros({3}, "float64")}
    local b = ddp._make_buckets(params, 500, 1000)
    local function ids(bucket)
      local l = {}
      for _, e in ipairs(bucket.entries) do l[#l + 1] = e.param end
      return l
    end
    assert.are.equal(3, #b)
    assert.are.same({5}, ids(b[1]))           -- a dtype change closes the bucket
    assert.are.same({4, 3, 2}, ids(b[2]))     -- 20 + 800 + 40 <= 1000
    assert.are.same({1}, ids(b[3]))
    assert.are.same({0, 5, 205}, {b[2].entries[1].offset, b[2].entries[2].offset, b[2].entries[3].offset})
    assert.are.equal(215, b[2].numel)
    assert.are.equal("float64", b[1].dtype)
    -- the first bucket has its own (smaller) cap
    local f = ddp._make_buckets({T.zeros({100}), T.zeros({200}), T.zeros({50})}, 500, 1200)
    assert.are.same({{3}, {2, 1}}, {ids(f[1]), ids(f[2])})
    f = ddp._make_buckets({T.zeros({100}), T.zeros({200}), T.zeros({50})}, 500, 1000)
    assert.are.same({{3}, {2}, {1}}, {ids(f[1]), ids(f[2]), ids(f[3])})
    -- one huge cap: everything of one dtype in one bucket
    local one = ddp._make_buckets({params[1], params[2], params[3]}, 1 << 30, 1 << 30)
    assert.are.equal(1, #one)
    assert.are.same({3, 2, 1}, ids(one[1]))
  end)

  it("launches a bucket's all_reduce during backward, as soon as the bucket is ready", function()
    if not have then pending("crun-lua / crun.dist not built") return end
    -- 2 real ranks (the reducer all-reduces on the C process group): the
    -- job records the reducer's launch count at the start of each Linear's
    -- backward and when backward ends, before the final wait
    local dir = util.tmpdir()
    local ok, out = util.crun(2, "spec/helpers/train_ddp_launch_job.lua", dir)
    assert(ok, "crun-lua -n 2 failed:\n" .. out)
    for r = 0, 1 do
      local res = serialize.load(string.format("%s/launch.r%d.crun", dir, r))
      -- one bucket per layer: l2's (10 floats) launches before l1's backward starts
      assert.are.equal(2, res.overlap.buckets)
      assert.are.same({"backward L2 after 0 launches", "backward L1 after 1 launches"}, res.overlap.events)
      assert.are.equal(2, res.overlap.launched)
      assert.is_true(res.overlap.same, "rank " .. r .. ": gradients differ after an averaged backward")
      -- overlap=false: every all_reduce after backward
      assert.are.same({"backward L2 after 0 launches", "backward L1 after 0 launches"}, res.sequential.events)
      assert.are.equal(0, res.sequential.launched)
      assert.is_true(res.sequential.same)
      assert.are.equal(1, res.sequential.steps)
      -- no_sync: no communication at all (different inputs: the gradients differ)
      assert.are.same({"backward L2 after 0 launches", "backward L1 after 0 launches"}, res.no_sync.events)
      assert.are.equal(1, res.no_sync.steps)
      assert.is_false(res.no_sync.same)
    end
    os.execute("rm -rf " .. dir)
  end)

  it("checks its arguments and refuses use after close", function()
    -- a recording stand-in for crun.dist (rank 0 of 2), installed for this test only
    local events = {}
    local fake = {
      is_initialized = function() return true end,
      get_rank = function() return 0 end,
      get_world_size = function() return 2 end,
      broadcast = function() events[#events + 1] = "broadcast" end,
      all_gather_object = function(v) return {v, v} end,
      all_reduce = function(t, op, o)
        events[#events + 1] = string.format("all_reduce %d %s", t:numel(), op)
        return {wait = function() events[#events + 1] = "wait" end}
      end,
    }
    local saved_dist, saved_ddp = package.loaded["crun.dist"], package.loaded["crun.ddp"]
    package.loaded["crun.dist"], package.loaded["crun.ddp"] = fake, nil
    local ok, err = pcall(function()
      local ddp, nn = require "crun.ddp", require "crun.nn"
      local T = util.T()
      local l1, l2 = nn.Linear(3, 4), nn.Linear(4, 2)
      local net = nn.Sequential(l1, nn.Tanh(), l2)
      -- mark the start of each Linear's backward in the event list
      for name, l in pairs{L1 = l1, L2 = l2} do
        local bw = l.backward
        l.backward = function(self, x, gy)
          events[#events + 1] = "backward " .. name
          return bw(self, x, gy)
        end
      end
      -- one bucket per layer: l2's weight+bias (10 floats) first, then l1's (16)
      local m = ddp.DDP(net, {first_bucket_mb = 40 / 2 ^ 20, bucket_cap_mb = 64 / 2 ^ 20})
      assert.are.equal(2, #m.buckets)
      assert.are.same({10, 16}, {m.buckets[1].numel, m.buckets[2].numel})
      local x = T.randn({5, 3}, {seed = 1})
      -- wrapping broadcast rank 0's parameters; the stand-in has no C group,
      -- so a synchronised backward fails clearly instead of communicating
      assert.are.same({"broadcast", "broadcast"}, events)
      events = {}
      m:forward(x)
      local okb, errb = pcall(m.backward, m, x, T.ones({5, 2}))
      assert.is_false(okb)
      assert.is_truthy(tostring(errb):match("^ESTATE: reducer mark_ready: this reducer has no process group"), errb)
      -- no_sync: no communication at all
      local seq = ddp.DDP(net, {first_bucket_mb = 40 / 2 ^ 20, bucket_cap_mb = 64 / 2 ^ 20, overlap = false})
      m:close()
      events = {}
      seq:no_sync(function() seq:forward(x); seq:backward(x, T.ones({5, 2})) end)
      assert.are.same({"backward L2", "backward L1"}, events)
      assert.has_error(function() ddp.DDP(net, {bucket_cap_mb = 0}) end,
        "EINVAL: DDP: bucket_cap_mb must be a positive number, got 0")
      assert.has_error(function() ddp.DDP(net, {first_bucket_mb = 0 / 0}) end,
        "EINVAL: DDP: first_bucket_mb must be a positive number, got " .. tostring(0 / 0))
      assert.has_error(function() ddp.DDP(net, {bucket_cap_mb = math.huge}) end,
        "EINVAL: DDP: bucket_cap_mb must be a positive number, got inf")
      local core = require "crun.core"
      local okr, errr = pcall(core.reducer_new, nil, {}, {bucket_cap_bytes = 0 / 0})
      assert.is_false(okr)
      assert.matches("^EINVAL: reducer: bucket_cap_bytes must be a number of bytes >= 0, got %-?nan", errr)
      assert.has_error(function() ddp.DDP({}) end, "EINVAL: DDP: a crun.nn module is expected, got table")
      -- a flag that is not a boolean is refused, not read as its default
      assert.has_error(function() ddp.DDP(net, {gradient_as_bucket_view = "true"}) end,
        "EINVAL: DDP: gradient_as_bucket_view must be true or false, got true")
      assert.has_error(function() ddp.DDP(net, {broadcast_buffers = 0}) end,
        "EINVAL: DDP: broadcast_buffers must be true or false, got 0")
      assert.has_error(function() ddp.DDP(net, {overlap = "false"}) end,
        "EINVAL: DDP: overlap must be true or false, got false")
      assert.has_error(function() ddp.DDP(net, {bucket_cap_mb = "25"}) end,
        "EINVAL: DDP: bucket_cap_mb must be a positive number, got string 25")
      -- torch's `with ddp.no_sync():` is a function argument here
      assert.has_error(function() seq:no_sync() end, "EINVAL: DDP:no_sync: a function is expected (crun's form of "
        .. "torch's `with ddp.no_sync():` is ddp:no_sync(function() ... end)), got nil")
      assert.has_error(function() ddp.DDP(net, {first_bucket_mb = -1}) end,
        "EINVAL: DDP: first_bucket_mb must be a positive number, got -1")
      assert.has_error(function() ddp.join({m}, print, {throw = true}) end,
        "EINVAL: join: unknown option 'throw' (accepted: throw_on_early_termination)")
      assert.has_error(function() ddp.join({net}, print) end,
        "EINVAL: join: entry 1 of the list is a table, a DDP model is expected")
      -- a keyed state dict names the wrapped module's entries "module.<name>", as torch's DDP
      local sd = seq:state_dict{keyed = true}
      local keys = {}
      for k in pairs(sd) do keys[#keys + 1] = k end
      table.sort(keys)
      assert.are.equal("module.0.bias module.0.weight module.2.bias module.2.weight", table.concat(keys, " "))
      local l2w = l2.weight:clone()
      sd["module.2.weight"] = sd["module.2.weight"] + 1
      seq:load_state_dict(sd)
      assert.are.equal(0, (l2.weight - (l2w + 1)):abs():max())
      assert.has_error(function() seq:load_state_dict({["0.weight"] = l1.weight}) end,
        'EINVAL: load_state_dict for Sequential: missing key(s) in state_dict: "module.0.weight", "module.0.bias", '
        .. '"module.2.weight", "module.2.bias"; unexpected key(s) in state_dict: "0.weight" (strict = false loads '
        .. 'the keys that match)')
      assert.are.equal(4, #seq:state_dict())
      local names = {}
      for name, p in seq:named_parameters() do names[#names + 1] = name .. ":" .. p:numel() end
      assert.are.equal("module.0.weight:12 module.0.bias:4 module.2.weight:8 module.2.bias:2", table.concat(names, " "))
      -- a closed DDP raises
      local okc, errc = pcall(m.forward, m, x)
      assert.is_false(okc)
      assert.is_truthy(tostring(errc):match("ECLOSED: DDP:forward on rank 0"))
    end)
    package.loaded["crun.dist"], package.loaded["crun.ddp"] = saved_dist, saved_ddp
    assert(ok, err)
  end)

  for _, world in ipairs{1, 2, 4} do
    it(string.format("gives the 1-process parameters on %d rank%s (plain, bucket views, no_sync, join, join throw)",
      world, world > 1 and "s" or ""), function()
      if not have then pending("crun-lua / crun.dist not built") return end
      check_world(world)
    end)
  end

  -- An option wrong on one rank alone (a typo'd key) fails every rank's DDP
  -- within seconds, naming that rank and its fault: the peers' parameter
  -- check is refused for them, never left to wait out the group's timeout.
  -- The same fault on every rank stops nothing.
  it("fails every rank promptly when rank 1 alone passes a bad option (2 ranks)", function()
    if not have then pending("crun-lua / crun.dist not built") return end
    require("helpers.ctor_refuse").one("ddp", "DDP: unknown option 'bucket_cap_mbb'", "all_gather")
  end)
  it("fails every rank of its group promptly when rank 1 alone misspells process_group (2 ranks)", function()
    if not have then pending("crun-lua / crun.dist not built") return end
    require("helpers.ctor_refuse").one("ddpgroup", "DDP: unknown option 'proces_group'", "all_gather")
  end)
  -- A group option that is no group at all (process_group = 5) names the
  -- constructor, the rank and the key; it said "get_rank: group must be a
  -- crun.ProcessGroup ...", the internal call that first used it. It is
  -- refused on the default group, where the peers that passed none wait.
  for _, c in ipairs{{"ddpnotgroup", "DDP"}, {"fsdpnotgroup", "FSDP"}, {"zeronotgroup", "ZeroRedundancyOptimizer"}} do
    it("names the constructor and key when rank 1 alone passes a process_group that is no group: " .. c[2], function()
      if not have then pending("crun-lua / crun.dist not built") return end
      require("helpers.ctor_refuse").one(c[1], "EINVAL: " .. c[2] .. " on rank 1: process_group must be a "
        .. "crun.ProcessGroup (from new_group), got number", "all_gather")
    end)
  end
  it("names the key on every rank when every rank passes a process_group that is no group (2 ranks)", function()
    if not have then pending("crun-lua / crun.dist not built") return end
    require("helpers.ctor_refuse").all("ddpnotgroup", "EINVAL: DDP on rank %d: process_group must be a "
      .. "crun.ProcessGroup (from new_group), got number", "all_gather")
  end)
  it("goes on when every rank passes the same bad option (2 ranks)", function()
    if not have then pending("crun-lua / crun.dist not built") return end
    require("helpers.ctor_refuse").all("ddp", "DDP: unknown option 'bucket_cap_mbb'", "all_gather")
  end)
end)

describe("examples/uneven_inputs.lua", function()
  it("finishes on 3 ranks with identical parameters everywhere", function()
    if not util.have_launcher() then pending("crun-lua / crun.dist not built") return end
    local ok, out = util.crun(3, "examples/uneven_inputs.lua")
    assert(ok, out)
    assert.is_truthy(out:match("rank 2 batch 7/7"), out)
    assert.is_truthy(out:match("parameters identical on all 3 ranks: true"), out)
  end)
end)

describe("DDP buffers (broadcast_buffers)", function()
  local rec
  local function load(r)
    if not rec then
      rec = {dir = util.tmpdir()}
      local ok, out = util.crun(3, "spec/helpers/ddp_buffers_job.lua", rec.dir)
      assert(ok, "crun-lua -n 3 failed:\n" .. out)
    end
    return serialize.load(string.format("%s/buffers.r%d.crun", rec.dir, r))
  end

  it("broadcasts them from the group's rank 0 when the group leaves out global rank 0", function()
    if not util.have_launcher() then pending("crun-lua not built") return end
    for r = 1, 2 do
      local got = load(r)
      assert.are.equal("ok", got.sub, "rank " .. r)
      assert.are.equal(1 * 10 - 3.5, got.sub_mean, "rank " .. r)
    end
  end)

  it("keeps crun.join with uneven inputs in step and gives the 1-process parameters", function()
    if not util.have_launcher() then pending("crun-lua not built") return end
    for r = 0, 2 do
      local got = load(r)
      assert.are.equal("ok", got.join, "rank " .. r)
      for i = 1, #got.ref do
        local e = util.max_rel_err(got.params[i], got.ref[i])
        assert.is_true(e < 1e-10, string.format("rank %d, parameter %d: relative error %g", r, i, e))
      end
    end
  end)

  it("broadcasts them from the group's rank 0 when wrapping (as torch)", function()
    if not util.have_launcher() then pending("crun-lua not built") return end
    for r = 1, 2 do assert.are.equal(1 * 2 + 0.25, load(r).wrap_var, "rank " .. r) end
  end)

  it("keeps crun.join in step with evaluation forwards, and with training in evaluation mode", function()
    if not util.have_launcher() then pending("crun-lua not built") return end
    for r = 0, 2 do
      local got = load(r)
      for _, mode in ipairs{"eval_after", "eval_train"} do
        assert.are.equal("ok", got[mode], "rank " .. r .. ", " .. mode)
        assert.is_true(got[mode .. "_err"] < 1e-10, string.format("rank %d, %s: relative error %g", r, mode,
          got[mode .. "_err"]))
      end
    end
  end)

  it("keeps crun.join in step with two models trained in turn", function()
    if not util.have_launcher() then pending("crun-lua not built") return end
    for r = 0, 2 do assert.are.equal("ok", load(r).join_two, "rank " .. r) end
  end)

  it("ends crun.join with the buffers of the rank that trained longest on every rank (as torch)", function()
    if not util.have_launcher() then pending("crun-lua not built") return end
    local last = load(2)
    for r = 0, 1 do
      local got = load(r)
      assert.are.equal(#last.buffers, #got.buffers)
      for i = 1, #got.buffers do
        assert.are.same(util.list(last.buffers[i]), util.list(got.buffers[i]), "rank " .. r .. ", buffer " .. i)
      end
    end
  end)

  it("reads no_sync at forward, as torch: a forward inside it is not synchronised, one outside it is", function()
    if not util.have_launcher() then pending("crun-lua not built") return end
    for r = 0, 2 do
      local ns = load(r).no_sync
      assert.is_true(ns.forward_inside.own < 1e-12, "rank " .. r .. ": forward inside no_sync was synchronised")
      assert.is_true(ns.backward_inside.avg < 1e-12, "rank " .. r .. ": forward outside no_sync was not synchronised")
      assert.is_true(ns.forward_inside.avg > 1e-3 and ns.backward_inside.own > 1e-3, "rank " .. r)
    end
    os.execute("rm -rf " .. rec.dir)
  end)
end)
