-- Exactly-once distributed evaluation: for data set sizes not divisible by
-- the world size, the global count equals the data set size and every sample
-- is evaluated by exactly one rank (torch's sampler would count the padding).
local data = require "crun.data"
local util = require "helpers.train_util"
local serialize = require "crun.serialize"

local SIZES = {0, 1, 5, 7, 10, 101, 1003}

describe("exactly-once evaluation", function()
  it("covers each index once over explicit ranks (no process group)", function()
    for _, n in ipairs(SIZES) do
      for W = 1, 5 do
        local seen, count = {}, 0
        for r = 0, W - 1 do
          local m = data.evaluate{size = n, num_replicas = W, rank = r, batch_size = 3, metrics = {"k"},
            fn = function(idx)
              for _, i in ipairs(idx) do
                assert.is_nil(seen[i], "index " .. i .. " twice"); seen[i] = true
              end
              return {k = #idx}
            end}
          assert.are.equal(m.count, m.k)
          count = count + m.count
        end
        assert.are.equal(n, count)
        -- torch's padded sampler would have counted ceil(n / W) * W samples
        local padded = 0
        for r = 0, W - 1 do padded = padded + #data.DistributedSampler{size = n, num_replicas = W, rank = r, shuffle = false} end
        assert.are.equal(math.ceil(n / W) * W, padded)
      end
    end
  end)

  it("rejects metrics that were not declared (every rank must reduce the same keys)", function()
    assert.has_error(function()
      data.evaluate{size = 4, num_replicas = 1, rank = 0, fn = function() return {oops = 1} end}
    end)
  end)

  -- these raised bare Lua errors ("attempt to add a 'number' with a 'string'",
  -- "attempt to compare string with number", "bad argument #1 to 'for iterator'")
  it("names a metric that is no number, a fn result that is no table and mixed key types", function()
    local function err_of(f)
      local ok, err = pcall(f)
      assert.is_false(ok)
      return err
    end
    local function ev(fn, metrics)
      return function() data.evaluate{size = 4, num_replicas = 1, rank = 0, metrics = metrics or {"c"}, fn = fn} end
    end
    assert.matches("^EINVAL: data.evaluate: fn returned metric 'c' as a string, a number is expected",
      err_of(ev(function() return {c = "1"} end)))
    assert.matches("^EINVAL: data.evaluate: fn must return a table of metrics, returned a number",
      err_of(ev(function() return 5 end)))
    assert.matches("^EINVAL: data.evaluate: metrics must be a list of names, got string",
      err_of(ev(function() return {c = 1} end, "c")))
    assert.matches("^EINVAL: data.all_reduce_metrics: a table of numbers is expected, got number",
      err_of(function() data.all_reduce_metrics(5) end))
    assert.matches("^EINVAL: data.all_reduce_metrics: metric 'a' is a string",
      err_of(function() data.all_reduce_metrics({a = "x"}) end))
    assert.are.same({a = 1, [1] = 2, [true] = 3}, data.all_reduce_metrics({a = 1, [1] = 2, [true] = 3}))
  end)

  for _, world in ipairs{2, 3, 4} do
    it(string.format("counts each sample once over %d ranks with all_reduce", world), function()
      if not util.have_launcher() then pending("crun-lua / crun.dist not built") return end
      local dir = util.tmpdir()
      local ok, out = util.crun(world, "spec/helpers/train_eval_job.lua", dir)
      assert(ok, out)
      local per = {}
      for r = 0, world - 1 do per[r] = serialize.load(string.format("%s/eval.r%d.crun", dir, r)) end
      for _, n in ipairs(SIZES) do
        local seen = {}
        for r = 0, world - 1 do
          local res = per[r][n]
          assert.are.equal(n, res.count)                  -- the global count, on every rank
          assert.are.equal(n * (n + 1) // 2, res.idxsum)
          for _, i in ipairs(res.seen) do
            assert.is_nil(seen[i], string.format("index %d evaluated twice (n=%d)", i, n)); seen[i] = true
          end
        end
        for i = 1, n do assert.is_true(seen[i], "index " .. i .. " never evaluated") end
      end
      os.execute("rm -rf " .. dir)
    end)
  end
end)

describe("jobs/train.lua and jobs/evaluate.lua", function()
  -- --no-ckpt made the default checkpoint directory all the same, and left it
  -- empty in /tmp (specs that train with --no-ckpt left /tmp/crun-train-<user>)
  it("make no checkpoint directory with --no-ckpt", function()
    if not util.have_launcher() then pending("crun-lua / crun.dist not built") return end
    local user = "crun-eval-spec-" .. math.random(1, 1e9)
    local default = "/tmp/crun-train-" .. user -- tmp-ok: where train.lua would make it
    local p = io.popen(string.format("USER=%s timeout 120 %s -n 1 --master-port 0 jobs/train.lua --epochs 1 "
      .. "--samples 200 --no-ckpt --quiet 2>&1; echo rc=$?", user, os.getenv("CRUN_LUA") or "build/crun-lua"))
    local out = p:read("a")
    p:close()
    local made = os.execute("test -e " .. default)
    os.execute("rmdir " .. default .. " 2>/dev/null")
    assert.matches("rc=0%s*$", out)
    assert.is_falsy(made, default .. " was made")
  end)

  it("train an MLP past 95% on 3 ranks and evaluate its checkpoint on 2 ranks with the same accuracy", function()
    if not util.have_launcher() then pending("crun-lua / crun.dist not built") return end
    local dir = util.tmpdir()
    local ok, out = util.crun(3, "jobs/train.lua", "--epochs 5 --quiet --no-resume --ckpt-dir " .. dir)
    assert(ok, out)
    local acc = tonumber(out:match("final test accuracy ([%d.]+)%%"))
    assert.is_truthy(acc, out)
    assert.is_true(acc > 95, out)
    assert.is_truthy(out:match("each evaluated once over 3 ranks"), out)
    local ok2, out2 = util.crun(2, "jobs/evaluate.lua", "--ckpt " .. dir .. "/train.crun")
    assert(ok2, out2)
    assert.are.equal(acc, tonumber(out2:match("accuracy ([%d.]+)%%")))
    assert.is_truthy(out2:match("2000 test samples evaluated once over 2 ranks"), out2)
    os.execute("rm -rf " .. dir)
  end)
end)
