-- DistributedSampler: torch's formulas for num_samples, padding, striding and
-- drop_last; shuffled epochs are permutations identical on every rank.
local data = require "crun.data"

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

  it("agrees with torch itself when torch is installed", function()
    local py = io.popen([[/usr/bin/python3 -c '
import sys
try:
    from torch.utils.data.distributed import DistributedSampler
except Exception:
    print("SKIP"); sys.exit(0)
for n in (1, 5, 10, 17):
  for W in (1, 2, 3, 4, 8):
    for dl in (False, True):
      for r in range(W):
        s = DistributedSampler(list(range(n)), num_replicas=W, rank=r, shuffle=False, drop_last=dl)
        print(n, W, r, int(dl), *list(iter(s)))
' 2>/dev/null]])
    local out = py and py:read("a") or "SKIP"
    if py then py:close() end
    if out:match("^SKIP") or out == "" then return end
    local lines = 0
    for line in out:gmatch("[^\n]+") do
      local f = {}
      for w in line:gmatch("%S+") do f[#f + 1] = tonumber(w) end
      local n, W, r, dl = f[1], f[2], f[3], f[4] == 1
      local want = {table.unpack(f, 5)}
      local s = data.DistributedSampler{size = n, num_replicas = W, rank = r, shuffle = false, drop_last = dl}
      assert.are.same(want, minus1(s:indices()))
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

describe("DistributedSampler bad input", function()
  it("rejects a rank out of range, a bad size and a non-table", function()
    assert.has_error(function() data.DistributedSampler{size = 10, num_replicas = 2, rank = 2} end,
      "bad argument 'rank' to DistributedSampler (rank 2 out of range [0, 2))")
    assert.has_error(function() data.DistributedSampler{size = -1, num_replicas = 2, rank = 0} end)
    assert.has_error(function() data.DistributedSampler{size = 1.5, num_replicas = 2, rank = 0} end)
    assert.has_error(function() data.DistributedSampler(10) end)
    local s = data.DistributedSampler{size = 10, num_replicas = 2, rank = 0}
    assert.has_error(function() s:set_epoch(-1) end)
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
end)
