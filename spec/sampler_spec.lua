-- DistributedSampler: torch's formulas for num_samples, padding, striding and
-- drop_last; shuffled epochs are permutations identical on every rank.
local data = require "crun.data"
local each_raises = require("helpers.common").each_raises
local torch_ref = require "helpers.torch_ref"

-- torch's DistributedSampler.__iter__ for shuffle=False, written the way torch
-- writes it (list concatenation), on 0-based indices.
local function torch_indices(n, W, r, drop_last)
  local num_samples
  if drop_last and n % W ~= 0 then
    num_samples = math.ceil((n - W) / W)
  else
    num_samples = math.ceil(n / W)
  end
  local total = num_samples * W
  local idx = {}
  for i = 0, n - 1 do idx[#idx + 1] = i end
  if not drop_last then
    local pad = total - #idx
    local base = {table.unpack(idx)}
    if pad <= #base then
      for k = 1, pad do idx[#idx + 1] = base[k] end
    else
      local rep = {}
      for _ = 1, math.ceil(pad / #base) do
        for _, v in ipairs(base) do rep[#rep + 1] = v end
      end
      for k = 1, pad do idx[#idx + 1] = rep[k] end
    end
  else
    while #idx > total do idx[#idx] = nil end
  end
  local out = {}
  for k = r + 1, total, W do out[#out + 1] = idx[k] end
  return out, num_samples, total
end

local function minus1(list)
  local o = {}
  for i, v in ipairs(list) do o[i] = v - 1 end
  return o
end

describe("DataLoader iterated as torch's `for x, y in loader`", function()
  -- was "attempt to call a table value (for iterator 'for iterator')"
  it("is EINVAL naming loader:iter()", function()
    local T = require "crun.tensor"
    local loader = require("crun.data").DataLoader({T.zeros({4, 2}), T.zeros({4})}, {batch_size = 2})
    local ok, err = pcall(function() for _ in loader do end end)
    assert.is_false(ok)
    assert.matches("^EINVAL: DataLoader: iterate with `for i, x, y in loader:iter%(%) do`", err)
  end)
end)

describe("DistributedSampler without shuffle", function()
  it("matches torch's formulas for many sizes, replicas and drop_last", function()
    local cases = 0
    for n = 1, 23 do
      for W = 1, 9 do
        for _, dl in ipairs{false, true} do
          for r = 0, W - 1 do
            local s = data.DistributedSampler{size = n, num_replicas = W, rank = r, shuffle = false, drop_last = dl}
            local want, ns, total = torch_indices(n, W, r, dl)
            assert.are.equal(ns, s.num_samples)
            assert.are.equal(total, s.total_size)
            assert.are.same(want, minus1(s:indices()))
            assert.are.equal(#want, #s)
            cases = cases + 1
          end
        end
      end
    end
    assert.is_true(cases > 1000)
  end)

  it("pads by wrap-around several times when the set is smaller than the world", function()
    local s = data.DistributedSampler{size = 2, num_replicas = 7, rank = 6, shuffle = false}
    assert.are.same({1}, s:indices())      -- global list 0 1 0 1 0 1 0 -> rank 6 gets 0 -> index 1
    local s4 = data.DistributedSampler{size = 2, num_replicas = 7, rank = 3, shuffle = false}
    assert.are.same({2}, s4:indices())
  end)

  it("agrees with torch itself (DistributedSampler over a list, shuffle=False)", function()
    local why = torch_ref.missing()
    if why then pending(why) return end
    local out = torch_ref.run([[
from torch.utils.data.distributed import DistributedSampler
for n in (1, 5, 10, 17):
  for W in (1, 2, 3, 4, 8):
    for dl in (False, True):
      for r in range(W):
        s = DistributedSampler(list(range(n)), num_replicas=W, rank=r, shuffle=False, drop_last=dl)
        assert len(s) == len(list(iter(s)))
        print(n, W, r, int(dl), len(s), *list(iter(s)))
]])
    local lines = 0
    for line in out:gmatch("[^\n]+") do
      local f = {}
      for w in line:gmatch("%S+") do f[#f + 1] = assert(math.tointeger(tonumber(w)), line) end
      local n, W, r, dl, len = f[1], f[2], f[3], f[4] == 1, f[5]
      local want = {table.unpack(f, 6)}
      local ds = {}
      for i = 1, n do ds[i] = -3 * i end
      local s = data.DistributedSampler(ds, {num_replicas = W, rank = r, shuffle = false, drop_last = dl})
      assert.are.same(want, minus1(s:indices()), line)
      assert.are.equal(len, #s, line)
      lines = lines + 1
    end
    assert.are.equal(4 * (1 + 2 + 3 + 4 + 8) * 2, lines)
  end)
end)

describe("DistributedSampler with shuffle", function()
  local function all_ranks(n, W, seed, epoch, dl)
    local lists = {}
    for r = 0, W - 1 do
      local s = data.DistributedSampler{size = n, num_replicas = W, rank = r, seed = seed, drop_last = dl}
      s:set_epoch(epoch)
      lists[r + 1] = s:indices()
    end
    return lists
  end

  it("covers every index (a permutation, plus torch's padding)", function()
    for _, n in ipairs{1, 7, 10, 101} do
      for _, W in ipairs{1, 2, 3, 4} do
        local lists = all_ranks(n, W, 0, 3, false)
        local seen, total = {}, 0
        for _, l in ipairs(lists) do
          for _, i in ipairs(l) do
            assert.is_true(i >= 1 and i <= n)
            seen[i] = (seen[i] or 0) + 1
            total = total + 1
          end
        end
        assert.are.equal(math.ceil(n / W) * W, total)
        for i = 1, n do assert.is_true((seen[i] or 0) >= 1, "index " .. i .. " missing") end
      end
    end
  end)

  it("interleaves one global permutation across ranks, the same on every rank", function()
    local n, W = 50, 4
    local perm = data.permutation(n, 5 + 2)
    local lists = all_ranks(n, W, 5, 2, false)
    for r = 0, W - 1 do
      for k, i in ipairs(lists[r + 1]) do
        local pos = r + (k - 1) * W
        assert.are.equal(perm[(pos % n) + 1] + 1, i)
      end
    end
    -- a fresh sampler object on the "same rank" gives the same list
    assert.are.same(lists, all_ranks(n, W, 5, 2, false))
  end)

  it("differs across epochs and seeds, and is deterministic", function()
    local a = all_ranks(100, 2, 0, 0, false)
    local b = all_ranks(100, 2, 0, 1, false)
    local c = all_ranks(100, 2, 1, 0, false)
    assert.are_not.same(a, b)
    assert.are_not.same(a, c)
    assert.are.same(b, c) -- seed + epoch is the generator seed, as in torch
    local p = data.permutation(1000, 42)
    local seen = {}
    for _, v in ipairs(p) do seen[v] = true end
    for v = 0, 999 do assert.is_true(seen[v]) end
    assert.are_not.same(data.permutation(1000, 42), data.permutation(1000, 43))
  end)

  it("drops the tail with drop_last", function()
    local lists = all_ranks(10, 4, 0, 0, true)
    local seen = {}
    for _, l in ipairs(lists) do
      assert.are.equal(2, #l)
      for _, i in ipairs(l) do
        assert.is_nil(seen[i]); seen[i] = true
      end
    end
  end)
end)

describe("DistributedSampler drop_padding (exactly once)", function()
  it("yields each index exactly once over all ranks", function()
    for n = 0, 30 do
      for W = 1, 6 do
        for _, sh in ipairs{false, true} do
          local seen, total = {}, 0
          for r = 0, W - 1 do
            local s = data.DistributedSampler{size = n, num_replicas = W, rank = r, shuffle = sh, drop_padding = true}
            local l = s:indices()
            assert.are.equal(#l, #s)
            for _, i in ipairs(l) do
              assert.is_nil(seen[i]); seen[i] = true; total = total + 1
            end
          end
          assert.are.equal(n, total)
        end
      end
    end
  end)
end)

describe("DistributedSampler from a data set", function()
  local T = require("crun.tensor")

  -- The lists of every rank for sampler options o over a data set ds and over size=.
  local function same_as_size(ds, n, o)
    for W = 1, 5 do
      for r = 0, W - 1 do
        local ko = {num_replicas = W, rank = r}
        for k, v in pairs(o) do ko[k] = v end
        local by_ds = data.DistributedSampler(ds, ko)
        ko.size = n
        local by_size = data.DistributedSampler(ko)
        ko.size, ko.dataset = nil, ds
        local by_key = data.DistributedSampler(ko)
        assert.are.equal(n, by_ds.size)
        by_ds:set_epoch(3); by_size:set_epoch(3); by_key:set_epoch(3)
        assert.are.same(by_size:indices(), by_ds:indices())
        assert.are.same(by_size:indices(), by_key:indices())
        assert.are.equal(ds, by_ds.dataset)
      end
    end
  end

  it("takes its length from a Lua list, a tensor, __len, :len(), :size() and a TensorDataset", function()
    local list = {}
    for i = 1, 13 do list[i] = {x = -i} end
    same_as_size(list, 13, {shuffle = false})
    same_as_size(list, 13, {shuffle = true, seed = -7, drop_last = true})
    local X = T.zeros({11, 3})
    same_as_size(X, 11, {seed = 5})
    same_as_size(setmetatable({}, {__len = function() return 9 end}), 9, {})
    same_as_size({len = function() return 7 end}, 7, {drop_last = true})
    same_as_size({size = function() return {6, 2} end}, 6, {})
    same_as_size({size = function() return 17 end, items = {}}, 17, {shuffle = false})
    same_as_size(data.TensorDataset(T.zeros({10, 2}), T.zeros({10})), 10, {seed = 2})
  end)

  it("accepts torch's keywords and an empty data set", function()
    local s = data.DistributedSampler({}, {num_replicas = 3, rank = 2, shuffle = false, seed = 1, drop_last = false})
    assert.are.equal(0, #s)
    assert.are.same({}, s:indices())
    local l = data.LocalSampler({"a", "b", "c"})
    assert.are.same({1, 2, 3}, l:indices())
  end)

  it("refuses a data set without a length, disagreeing sizes and two data sets", function()
    local cases = {
      {function() data.DistributedSampler(42) end, "^EINVAL: DistributedSampler: the data set must have a length"},
      {function() data.DistributedSampler({len = function() return -1 end}) end,
       "^EINVAL: DistributedSampler: the data set's length must be an integer >= 0, got %-1"},
      {function() data.DistributedSampler({1, 2, 3}, {size = 4}) end,
       "^EINVAL: DistributedSampler: size=4 but the data set has 3 samples"},
      {function() data.DistributedSampler({1, 2}, {dataset = {1}}) end,
       "^EINVAL: DistributedSampler: a data set is given both"},
      {function() data.DistributedSampler{shuffle = false} end,
       "^EINVAL: DistributedSampler: needs a data set"},
      {function() data.DistributedSampler({1}, 3) end, "^EINVAL: DistributedSampler: options must be a table"},
    }
    each_raises(cases)
  end)
end)

describe("DistributedSampler bad input", function()
  -- Calls f and returns its error text (the call must fail).
  local function err_of(f)
    local ok, err = pcall(f)
    assert.is_false(ok)
    return err
  end

  it("rejects a rank out of range, a bad size, a bad flag and a non-table with EINVAL", function()
    assert.are.equal("EINVAL: DistributedSampler: rank 2 out of range [0, 2)",
      err_of(function() data.DistributedSampler{size = 10, num_replicas = 2, rank = 2} end))
    assert.are.equal("EINVAL: DistributedSampler: size must be an integer >= 0, got -1",
      err_of(function() data.DistributedSampler{size = -1, num_replicas = 2, rank = 0} end))
    assert.matches("^EINVAL: DistributedSampler: size must be an integer",
      err_of(function() data.DistributedSampler{size = 1.5, num_replicas = 2, rank = 0} end))
    assert.matches("^EINVAL: DistributedSampler: num_replicas must be an integer >= 1, got 0",
      err_of(function() data.DistributedSampler{size = 3, num_replicas = 0, rank = 0} end))
    assert.matches("^EINVAL: DistributedSampler: shuffle must be true or false, got 1",
      err_of(function() data.DistributedSampler{size = 3, shuffle = 1} end))
    assert.matches("^EINVAL: DistributedSampler: seed must be an integer, got 0.5",
      err_of(function() data.DistributedSampler{size = 3, seed = 0.5} end))
    assert.matches("^EINVAL: DistributedSampler: the data set must have a length",
      err_of(function() data.DistributedSampler(10) end))
    -- size + num_replicas - 1 overflowed int64 (UBSan aborted; else a wrong length)
    assert.are.equal("EINVAL: sampler: size 9223372036854775807 is too large (at most 2^62)",
      err_of(function() data.DistributedSampler{size = math.maxinteger, num_replicas = 3, rank = 1} end))
    assert.are.equal(1537228672809129302, #data.DistributedSampler{size = 1 << 62, num_replicas = 3, rank = 1})
    local s = data.DistributedSampler{size = 10, num_replicas = 2, rank = 0}
    assert.matches("^EINVAL: DistributedSampler:set_epoch: epoch must be an integer >= 0, got %-1",
      err_of(function() s:set_epoch(-1) end))
  end)

  it("rejects an unknown option naming it and the accepted ones", function()
    assert.are.equal("EINVAL: DistributedSampler: unknown option 'replicas' (accepted: dataset, drop_last, "
      .. "drop_padding, num_replicas, rank, seed, shuffle, size)",
      err_of(function() data.DistributedSampler({1, 2}, {replicas = 2}) end))
    assert.matches("^EINVAL: LocalSampler: unknown option 'rank'",
      err_of(function() data.LocalSampler{size = 3, rank = 0} end))
  end)

  it("defaults num_replicas and rank from WORLD_SIZE / RANK", function()
    local s = data.DistributedSampler{size = 10}
    local W, R = data.default_world()
    assert.are.equal(W, s.num_replicas)
    assert.are.equal(R, s.rank)
  end)
end)

describe("DataLoader", function()
  it("batches a tensor data set in the sampler's order", function()
    local okt, T = pcall(require, "crun.tensor")
    if not okt then T = require("crun.core").tensor end
    local X = T.arange(20, "float64"):view(10, 2)   -- row i holds 2(i-1), 2(i-1)+1
    local Y = T.arange(10, "int64")
    local s = data.DistributedSampler{size = 10, num_replicas = 3, rank = 1, shuffle = true, seed = 3}
    s:set_epoch(2)
    local idx = s:indices()
    for _, dl in ipairs{false, true} do
      local loader = data.DataLoader{dataset = {X, Y}, batch_size = 3, sampler = s, drop_last = dl}
      assert.are.equal(dl and 1 or 2, #loader)
      local k, batches = 0, 0
      for b, xb, yb in loader:iter() do
        batches = batches + 1
        assert.are.equal(batches, b)
        for r = 1, xb:size(1) do
          k = k + 1
          assert.are.equal(idx[k] - 1, yb[r])
          assert.are.equal(2 * (idx[k] - 1) + 1, xb[r][2])
        end
      end
      assert.are.equal(#loader, batches)
      assert.are.equal(dl and 3 or 4, k)
    end
    assert.has_error(function() data.DataLoader{dataset = {X, T.zeros({9})}} end)
    assert.has_error(function() data.DataLoader{dataset = {X}, batch_size = 0} end)
  end)

  -- (n + batch_size - 1) // batch_size wrapped: #loader was -1 and it yielded nothing
  it("yields one batch of everything for a batch_size of maxinteger", function()
    local T = require("crun.tensor")
    local l = data.DataLoader({T.arange(10)}, {batch_size = math.maxinteger})
    assert.are.equal(1, #l)
    local n = 0
    for _, x in l:iter() do n = n + 1; assert.are.equal(10, x:numel()) end
    assert.are.equal(1, n)
  end)

  it("takes torch's positional form, a TensorDataset and shuffle=true", function()
    local T = require("crun.tensor")
    local X = T.arange(14, "int64"):view(7, 2)
    local ds = data.TensorDataset(X, T.arange(7, "int64"))
    assert.are.equal(7, #ds)
    local x, y = ds:get(3)
    assert.are.same({4, 5}, x:totable())
    assert.are.equal(2, y)
    local l = data.DataLoader(ds, {batch_size = 3})
    local got = {}
    for _, _, yb in l:iter() do
      for r = 1, yb:size(1) do got[#got + 1] = yb[r] end
    end
    assert.are.same({0, 1, 2, 3, 4, 5, 6}, got)
    local sh = data.DataLoader(ds, {batch_size = 2, shuffle = true, seed = 9, drop_last = true})
    assert.are.equal(3, #sh)
    local seen, k = {}, 0
    for _, xb, yb in sh:iter() do
      for r = 1, yb:size(1) do
        assert.is_nil(seen[yb[r]]); seen[yb[r]] = true; k = k + 1
        assert.are.equal(2 * yb[r] + 1, xb[r][2])
      end
    end
    assert.are.equal(6, k)
    -- each pass of a shuffling loader has a new order; set_epoch replays one
    local function order(loader)
      local o = {}
      for _, _, yb in loader:iter() do
        for r = 1, yb:size(1) do o[#o + 1] = yb[r] end
      end
      return o
    end
    local full = data.DataLoader(ds, {batch_size = 7, shuffle = true, seed = 9})
    local p1, p2 = order(full), order(full)
    assert.are_not.same(p1, p2)
    full:set_epoch(0)
    assert.are.same(p1, order(full))
    local sorted = {table.unpack(p2)}
    table.sort(sorted)
    assert.are.same({0, 1, 2, 3, 4, 5, 6}, sorted)
  end)

  it("rejects unknown options and sampler with shuffle, and reports torch's worker options as inert", function()
    local T = require("crun.tensor")
    local X = T.zeros({4, 2})
    local ok, err = pcall(data.DataLoader, {X}, {batchsize = 2})
    assert.is_false(ok)
    assert.matches("^EINVAL: DataLoader: unknown option 'batchsize' %(accepted: batch_size, dataset, drop_last, "
      .. "multiprocessing_context, num_workers, ", err)
    ok, err = pcall(data.DataLoader, {X}, {shuffle = true, sampler = data.LocalSampler{size = 4}})
    assert.is_false(ok)
    assert.matches("^EINVAL: DataLoader: sampler and shuffle=true are mutually exclusive", err)
    ok, err = pcall(data.DataLoader, {X}, {sampler = data.LocalSampler{size = 5}})
    assert.is_false(ok)
    assert.are.equal("EINVAL: DataLoader: the sampler covers 5 samples, the data set has 4", err)
    ok, err = pcall(data.DataLoader, {}, {})
    assert.is_false(ok)
    assert.matches("^EINVAL: DataLoader: dataset must be a TensorDataset or a list of tensors", err)
    ok, err = pcall(data.TensorDataset, X, T.zeros({3}))
    assert.is_false(ok)
    assert.are.equal("EINVAL: TensorDataset: tensor 2 has 3 rows, tensor 1 has 4", err)
    local l = data.DataLoader({X}, {num_workers = 4, pin_memory = true, batch_size = 4})
    assert.are.equal(1, #l)
  end)
end)

describe("DistributedSampler state_dict / load_state_dict (resuming at another world size)", function()
  local function S(n, W, r, extra)
    local o = {size = n, num_replicas = W, rank = r, shuffle = false, seed = 5}
    for k, v in pairs(extra or {}) do o[k] = v end
    return data.DistributedSampler(o)
  end

  it("hands the rest of an unshuffled epoch out over the new world, padding from what is left", function()
    -- 23 samples at world 3: each rank took 4, so global positions 0..11 (indices 1..12) are consumed
    local st = S(23, 3, 1):state_dict(4)
    assert.are.same({epoch = 0, seed = 5, size = 23, shuffle = false, drop_last = false, consumed = 12}, st)
    local r0, r1 = S(23, 2, 0), S(23, 2, 1)
    r0:load_state_dict(st)
    r1:load_state_dict(st)
    -- 11 left: 6 per rank, rank 1's last one wraps to the first sample left (13)
    assert.are.same({13, 15, 17, 19, 21, 23}, r0:indices())
    assert.are.same({14, 16, 18, 20, 22, 13}, r1:indices())
    assert.are.equal(6, #r1)
    local p1 = S(23, 2, 1, {drop_padding = true})
    p1:load_state_dict(st)
    assert.are.same({14, 16, 18, 20, 22}, p1:indices())
    -- resumed, then 2 more each at world 2: 12 + 4 consumed
    assert.are.equal(16, r1:state_dict(2).consumed)
    -- the next epoch starts from its beginning; going back to the resumed one keeps its start
    r0:set_epoch(1)
    assert.are.same({1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23}, r0:indices())
    r0:set_epoch(0)
    assert.are.same({13, 15, 17, 19, 21, 23}, r0:indices())
  end)

  it("sees every sample of a shuffled epoch exactly once across world 3 then world 2", function()
    local n, seed, epoch = 37, 11, 4
    local seen = {}
    local taken = 5
    local st
    for r = 0, 2 do
      local s = S(n, 3, r, {shuffle = true, seed = seed})
      s:set_epoch(epoch)
      local idx = s:indices()
      for k = 1, taken do seen[#seen + 1] = idx[k] end
      st = s:state_dict(taken)
    end
    assert.are.equal(15, st.consumed)
    assert.are.equal(epoch, st.epoch)
    for r = 0, 1 do
      local s = S(n, 2, r, {shuffle = true, seed = seed, drop_padding = true})
      s:load_state_dict(st)
      for _, i in ipairs(s:indices()) do seen[#seen + 1] = i end
    end
    assert.are.equal(n, #seen)
    local count = {}
    for _, i in ipairs(seen) do count[i] = (count[i] or 0) + 1 end
    for i = 1, n do assert.are.equal(1, count[i], "sample " .. i) end
    -- and the order is the epoch's one: the tail of the world-1 order
    local whole = S(n, 1, 0, {shuffle = true, seed = seed})
    whole:set_epoch(epoch)
    local w = whole:indices()
    local tail = S(n, 1, 0, {shuffle = true, seed = seed})
    tail:load_state_dict(st)
    assert.are.same({table.unpack(w, 16, n)}, tail:indices())
  end)

  it("rejects a state of another data set, seed or shuffle, and more taken than a rank has", function()
    local st = S(23, 3, 0):state_dict(2)
    local ok, err = pcall(S(24, 2, 0).load_state_dict, S(24, 2, 0), st)
    assert.is_false(ok)
    assert.are.equal("EINVAL: DistributedSampler:load_state_dict: size is 23 in the state, 24 here", err)
    local other = S(23, 2, 0, {seed = 6})
    ok, err = pcall(other.load_state_dict, other, st)
    assert.is_false(ok)
    assert.are.equal("EINVAL: DistributedSampler:load_state_dict: seed is 5 in the state, 6 here", err)
    local s = S(23, 3, 0)
    ok, err = pcall(s.state_dict, s, 9)
    assert.is_false(ok)
    assert.are.equal("EINVAL: DistributedSampler:state_dict: taken 9 exceeds the 8 samples of a rank this epoch", err)
  end)
end)

describe("make_spirals options", function()
  -- classes = 0 raised "attempt to perform 'n%%0'", noise = "x" an arithmetic
  -- error, and n = -1 or 2.5, dims = 0 or turns = NaN were taken
  it("refuses options out of range with EINVAL naming them, and takes integral floats", function()
    for _, c in ipairs{{{classes = 0}, "classes must be an integer >= 1, got 0"},
                       {{n = -1}, "n must be an integer >= 0, got %-1"},
                       {{n = 2.5}, "n must be an integer >= 0, got 2.5"},
                       {{n = 2, dims = 0}, "dims must be an integer >= 1, got 0"},
                       {{n = 2, noise = "x"}, "noise must be a number >= 0, got x"},
                       {{n = 2, turns = 0 / 0}, "turns must be a number, got"}} do
      local ok, err = pcall(data.make_spirals, c[1])
      assert.is_false(ok)
      assert.matches("^EINVAL: make_spirals: " .. c[2], err)
    end
    local X, Y = data.make_spirals{n = 4.0, classes = 2.0, dims = 3}
    assert.are.equal(4, #X)
    assert.are.equal(3, #X[1])
    assert.are.same({1, 2, 1, 2}, Y)
  end)
end)
