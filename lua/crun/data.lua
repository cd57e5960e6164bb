--- crun.data: DistributedSampler, DataLoader and exactly-once distributed evaluation.
--
-- Index convention: every index list this module returns holds 1-BASED
-- dataset indices (Lua lists and crun tensors are 1-based). Index i here is
-- torch's index i-1: the sampler applies torch's formulas to 0-based
-- positions and adds 1 when it hands an index out.
--
-- Shuffle: torch draws torch.randperm from a generator seeded with
-- seed + epoch; we cannot reproduce torch's RNG bit for bit, so a shuffled
-- epoch is a Fisher-Yates permutation driven by splitmix64 seeded with
-- seed + epoch (j = (x >> 11) % (i + 1), from the last position down).
-- It is deterministic and identical on every rank. Padding, striding,
-- num_samples, total_size and drop_last follow torch exactly.
-- The index math itself lives in libcrunrt (crun_sampler_*, runtime/train/
-- sampler.c) so C programs share it; this module validates arguments and
-- converts to 1-based lists.
local data = {}

local function ceil_div(a, b) return (a + b - 1) // b end

-- splitmix64: returns a generator of 64-bit integers for `seed`.
local function splitmix64(seed)
  local state = math.tointeger(seed) or error("seed must be an integer", 3)
  return function()
    state = state + 0x9E3779B97F4A7C15
    local z = state
    z = (z ~ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ~ (z >> 27)) * 0x94D049BB133111EB
    return z ~ (z >> 31)
  end
end
data.splitmix64 = splitmix64

--- Returns a permutation of 0..n-1 (a Lua list) determined by `seed` alone
-- (the sampler's shuffle: splitmix64 Fisher-Yates, computed in C).
function data.permutation(n, seed)
  if math.type(n) ~= "integer" or n < 0 then error("bad argument #1 to 'permutation' (integer >= 0 expected)", 2) end
  if math.type(seed) ~= "integer" then error("bad argument #2 to 'permutation' (integer seed expected)", 2) end
  return require("crun.core").permutation(n, seed)
end

-- The process group's size and rank when one exists, else RANK/WORLD_SIZE, else 1/0.
local function default_world()
  local ok, dist = pcall(require, "crun.dist")
  if ok and type(dist) == "table" and dist.is_initialized and dist.is_initialized() then
    return dist.get_world_size(), dist.get_rank()
  end
  return tonumber(os.getenv("WORLD_SIZE") or "1"), tonumber(os.getenv("RANK") or "0")
end
data.default_world = default_world

local function check_int(v, name, min)
  if math.type(v) ~= "integer" or v < min then
    error(string.format("bad argument '%s' to DistributedSampler (integer >= %d expected, got %s)",
      name, min, tostring(v)), 4)
  end
  return v
end

local Sampler = {}
Sampler.__index = Sampler
Sampler.__name = "crun.DistributedSampler"

--- DistributedSampler{size=, num_replicas=, rank=, shuffle=true, seed=0,
-- drop_last=false, drop_padding=false}. With drop_padding=true the rank's list
-- omits the wrap-around duplicates torch pads with, so every sample is seen
-- exactly once over all ranks (ranks' lengths then differ by at most one):
-- use it for evaluation.
function data.DistributedSampler(opts)
  if type(opts) ~= "table" then error("bad argument #1 to 'DistributedSampler' (table expected)", 2) end
  local W, R = default_world()
  local s = setmetatable({}, Sampler)
  s.size = check_int(opts.size, "size", 0)
  s.num_replicas = check_int(opts.num_replicas or W, "num_replicas", 1)
  s.rank = check_int(opts.rank or R, "rank", 0)
  if s.rank >= s.num_replicas then
    error(string.format("bad argument 'rank' to DistributedSampler (rank %d out of range [0, %d))",
      s.rank, s.num_replicas), 2)
  end
  s.shuffle = opts.shuffle ~= false
  s.seed = check_int(opts.seed or 0, "seed", math.mininteger)
  s.drop_last = opts.drop_last == true
  s.drop_padding = opts.drop_padding == true
  s.epoch = 0
  s.len, s.num_samples, s.total_size = require("crun.core").sampler_len(s.size, s.num_replicas, s.rank,
    s.drop_last, s.drop_padding)
  return s
end

--- Sets the epoch: the next shuffled order comes from seed + epoch.
function Sampler:set_epoch(epoch)
  self.epoch = check_int(epoch, "epoch", 0)
end

--- Returns this rank's list of 1-based dataset indices for the current epoch
-- (global positions rank, rank + num_replicas, ... of the padded or
-- truncated order). Length num_samples, or fewer with drop_padding.
function Sampler:indices()
  return (require("crun.core").sampler_indices(self.size, self.num_replicas, self.rank, self.shuffle,
    self.seed, self.drop_last, self.drop_padding, self.epoch))
end

--- Number of indices this rank yields per epoch.
function Sampler:__len() return self.len end

--- Iterator over (position, 1-based index).
function Sampler:iter()
  return ipairs(self:indices())
end

Sampler.__tostring = function(s)
  return string.format("crun.DistributedSampler(size=%d, rank=%d/%d, num_samples=%d, shuffle=%s, drop_last=%s, epoch=%d)",
    s.size, s.rank, s.num_replicas, s.num_samples, tostring(s.shuffle), tostring(s.drop_last), s.epoch)
end

--- SequentialSampler-like helper for one process: indices 1..size (shuffled
-- per epoch when shuffle=true), same interface as DistributedSampler.
function data.LocalSampler(opts)
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.num_replicas, o.rank = 1, 0
  if o.shuffle == nil then o.shuffle = false end
  return data.DistributedSampler(o)
end

local Loader = {}
Loader.__index = Loader
Loader.__name = "crun.DataLoader"

--- DataLoader{dataset={X, Y, ...}, batch_size=, sampler=, drop_last=false}:
-- batches tensors whose first dimension is the sample dimension, in the
-- sampler's order (a DistributedSampler, or 1..N in order when absent).
function data.DataLoader(opts)
  if type(opts) ~= "table" or type(opts.dataset) ~= "table" or #opts.dataset == 0 then
    error("bad argument #1 to 'DataLoader' (table with dataset={tensors...} expected)", 2)
  end
  local n = opts.dataset[1]:size(1)
  for i, t in ipairs(opts.dataset) do
    if t:size(1) ~= n then
      error(string.format("DataLoader: dataset[%d] has %d samples, dataset[1] has %d", i, t:size(1), n), 2)
    end
  end
  local bs = opts.batch_size or 1
  if math.type(bs) ~= "integer" or bs < 1 then error("bad argument 'batch_size' to DataLoader (integer >= 1 expected)", 2) end
  local l = setmetatable({dataset = opts.dataset, batch_size = bs, n = n,
    sampler = opts.sampler, drop_last = opts.drop_last == true}, Loader)
  return l
end

function Loader:_indices()
  if self.sampler then return self.sampler:indices() end
  local idx = {}
  for i = 1, self.n do idx[i] = i end
  return idx
end

--- Number of batches per epoch.
function Loader:__len()
  local m = self.sampler and #self.sampler or self.n
  if self.drop_last then return m // self.batch_size end
  return ceil_div(m, self.batch_size)
end

--- Iterates batches: for i, X, Y, ... in loader:iter() (each a new tensor
-- gathered with index_select along dimension 1).
function Loader:iter()
  local idx, bs, nb = self:_indices(), self.batch_size, #self
  local b = 0
  return function()
    b = b + 1
    if b > nb then return nil end
    local first = (b - 1) * bs + 1
    local last = math.min(first + bs - 1, #idx)
    local sel = {}
    for k = first, last do sel[#sel + 1] = idx[k] end
    local out = {b}
    for i, t in ipairs(self.dataset) do out[i + 1] = data.gather_rows(t, sel) end
    return table.unpack(out)
  end
end

--- Returns a new tensor holding rows idx[1], idx[2], ... (1-based) of t
-- (index_select along dimension 1).
function data.gather_rows(t, idx)
  local okt, T = pcall(require, "crun.tensor")
  if not okt then T = require("crun.core").tensor end
  if t.index_select then return t:index_select(1, T.new(idx, "int64")) end
  local shape = t:size()
  shape[1] = #idx
  local out = T.zeros(shape, t:dtype())
  if t:dim() == 1 then
    for k, i in ipairs(idx) do out[k] = t[i] end
  else
    for k, i in ipairs(idx) do out:select(1, k):copy(t:select(1, i)) end
  end
  return out
end

--- Sums a table of numbers over every rank of the process group (float64
-- all_reduce); returns a new table. With no process group, returns a copy.
function data.all_reduce_metrics(metrics)
  local keys = {}
  for k in pairs(metrics) do keys[#keys + 1] = k end
  table.sort(keys)
  local out = {}
  local ok, dist = pcall(require, "crun.dist")
  if not (ok and dist.is_initialized and dist.is_initialized()) or #keys == 0 then
    for _, k in ipairs(keys) do out[k] = metrics[k] end
    return out
  end
  local okt, T = pcall(require, "crun.tensor")
  if not okt then T = require("crun.core").tensor end
  local t = T.zeros({#keys}, "float64")
  for i, k in ipairs(keys) do t[i] = metrics[k] end
  dist.all_reduce(t, "sum")
  for i, k in ipairs(keys) do out[k] = t[i] end
  return out
end

--- Exactly-once distributed evaluation. opts: size (data set size),
-- batch_size, fn(indices) -> table of additive metrics for that batch of
-- 1-based indices (e.g. {correct=, loss_sum=, count=}), and optionally
-- num_replicas / rank. Each sample is evaluated by exactly one rank (no
-- padding duplicates); the metric sums over every rank are returned
-- (identical on every rank), with `count` the number of samples seen.
-- opts.metrics lists the keys fn returns (every rank must reduce the same
-- keys, even a rank with no samples).
function data.evaluate(opts)
  local s = data.DistributedSampler{size = opts.size, num_replicas = opts.num_replicas,
    rank = opts.rank, shuffle = false, drop_padding = true}
  local idx, bs = s:indices(), opts.batch_size or 256
  local acc = {count = 0}
  for _, k in ipairs(opts.metrics or {}) do acc[k] = 0 end
  for first = 1, #idx, bs do
    local sel = {}
    for k = first, math.min(first + bs - 1, #idx) do sel[#sel + 1] = idx[k] end
    local m = opts.fn(sel)
    for k, v in pairs(m or {}) do
      if acc[k] == nil or k == "count" then
        error(string.format("data.evaluate: fn returned metric '%s' not listed in opts.metrics", k), 2)
      end
      acc[k] = acc[k] + v
    end
    acc.count = acc.count + #sel
  end
  return data.all_reduce_metrics(acc)
end

--- A deterministic synthetic classification set: `classes` interleaved spiral
-- arms in the plane (angle = arm offset + turns * 2*pi * radius, plus noise),
-- mapped into `dims` dimensions by a fixed random linear map, plus Gaussian
-- noise in every dimension. No hyperplane separates the arms, so an MLP beats
-- a linear model by a wide margin. Returns X (list of `n` rows of `dims`
-- numbers) and Y (list of 1-based class labels). The same opts give the same
-- numbers on every machine (splitmix64 + Box-Muller).
function data.make_spirals(opts)
  opts = opts or {}
  local n, K, D = opts.n or 10000, opts.classes or 4, opts.dims or 16
  local turns, noise = opts.turns or 1.0, opts.noise or 0.05
  local rnd = splitmix64(opts.seed or 1234)
  local function uniform() return ((rnd() >> 11) + 0.5) / (1 << 53) end
  local function normal()
    return math.sqrt(-2 * math.log(uniform())) * math.cos(2 * math.pi * uniform())
  end
  local A = {}
  for d = 1, D do A[d] = {normal(), normal()} end
  local X, Y = {}, {}
  for i = 1, n do
    local c = (i - 1) % K
    local r = uniform()
    local a = 2 * math.pi * (c / K + turns * r) + 0.15 * normal()
    local px, py = r * math.cos(a), r * math.sin(a)
    local row = {}
    for d = 1, D do row[d] = A[d][1] * px + A[d][2] * py + noise * normal() end
    X[i], Y[i] = row, c + 1
  end
  return X, Y
end

return data
