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
local O = require "crun.opts"

-- ceil(a / b) for a >= 0, b >= 1, without the a + b - 1 that wraps past maxinteger.
local function ceil_div(a, b) return a // b + (a % b > 0 and 1 or 0) end

-- splitmix64: returns a generator of 64-bit integers for `seed`.
local function splitmix64(seed)
  local state = math.tointeger(seed) or O.fail("EINVAL: splitmix64: seed must be an integer, got %s", tostring(seed))
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
  O.int("permutation", "n", n, 0)
  O.int("permutation", "seed", seed)
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

local SAMPLER = O.spec{"size", "dataset", "num_replicas", "rank", "shuffle", "seed", "drop_last", "drop_padding"}
local LOCAL = O.spec{"size", "dataset", "shuffle", "seed", "drop_last"}
local LOADER = O.spec{"dataset", "batch_size", "sampler", "shuffle", "seed", "drop_last",
  inert = {num_workers = "crun loads batches in the training process",
           pin_memory = "crun tensors live in host memory",
           prefetch_factor = "crun loads batches in the training process",
           persistent_workers = "crun loads batches in the training process",
           timeout = "crun loads batches in the training process",
           worker_init_fn = "crun loads batches in the training process",
           multiprocessing_context = "crun loads batches in the training process",
           pin_memory_device = "crun tensors live in host memory"}}

-- The length of a data set the way torch's len(dataset) sees it: the __len
-- metamethod (crun tensors: the size of dimension 1), a :len() or :size()
-- method (a size() returning a shape gives its first entry), else the
-- border of a plain Lua list (#t). Raises EINVAL naming fname otherwise.
function data.len_of(ds, fname)
  fname = fname or "len_of"
  local t, mt = type(ds), getmetatable(ds)
  local n
  if type(mt) == "table" and mt.__len ~= nil then
    n = #ds
  elseif (t == "table" or t == "userdata") and type(ds.len) == "function" then
    n = ds:len()
  elseif (t == "table" or t == "userdata") and type(ds.size) == "function" then
    n = ds:size()
    if type(n) == "table" then n = n[1] end
  elseif t == "table" then
    n = #ds
  else
    O.fail("EINVAL: %s: the data set must have a length (a list, __len, :len() or :size()), got a %s", fname, t)
  end
  if math.type(n) ~= "integer" or n < 0 then
    O.fail("EINVAL: %s: the data set's length must be an integer >= 0, got %s", fname, tostring(n))
  end
  return n
end

-- True when t is an options table rather than a data set: a plain table
-- (no metatable) whose keys are all strings and whose len/size fields are
-- not methods. A Lua list, a tensor or an object with a length is a data set.
local function is_options(t)
  if type(t) ~= "table" or getmetatable(t) ~= nil or next(t) == nil then return false end
  if type(t.len) == "function" or type(t.size) == "function" then return false end
  for k in pairs(t) do
    if type(k) ~= "string" then return false end
  end
  return true
end

-- Returns (dataset or nil, options) for the call forms f(opts) and f(dataset[, opts]).
local function split_args(fname, a, b)
  if b == nil and is_options(a) then return nil, a end
  if a == nil then O.fail("EINVAL: %s: a data set (anything with a length) or an options table is expected", fname) end
  if b ~= nil and type(b) ~= "table" then O.fail("EINVAL: %s: options must be a table, got %s", fname, type(b)) end
  if b ~= nil and b.dataset ~= nil and b.dataset ~= a then
    O.fail("EINVAL: %s: a data set is given both as argument #1 and as dataset=", fname)
  end
  return a, b or {}
end

-- The data set's size from opts.size and/or the data set, which must agree.
local function sampler_size(fname, ds, opts)
  if ds == nil and opts.size == nil then
    O.fail("EINVAL: %s: needs a data set (argument #1 or dataset=) or size=", fname)
  end
  local n = ds ~= nil and data.len_of(ds, fname) or nil
  if opts.size ~= nil then
    local size = O.int(fname, "size", opts.size, 0)
    if n and n ~= size then O.fail("EINVAL: %s: size=%d but the data set has %d samples", fname, size, n) end
    n = size
  end
  return n
end

local Sampler = {}
Sampler.__index = Sampler
Sampler.__name = "crun.DistributedSampler"

--- DistributedSampler(dataset[, opts]) or DistributedSampler{size= | dataset=, ...}
-- with torch's keywords: num_replicas (default: the process group's size,
-- else WORLD_SIZE), rank (the group's rank, else RANK), shuffle=true,
-- seed=0, drop_last=false; plus drop_padding=false. The data set is anything
-- with a length (data.len_of): a Lua list, a tensor (its first dimension),
-- an object with __len or a :len()/:size() method, a TensorDataset; its
-- length is read once, here, as torch does. With drop_padding=true the rank's
-- list omits the wrap-around duplicates torch pads with, so every sample is
-- seen exactly once over all ranks (ranks' lengths then differ by at most
-- one): use it for evaluation. Unknown options raise EINVAL.
function data.DistributedSampler(a, b)
  local F = "DistributedSampler"
  local ds, raw = split_args(F, a, b)
  local opts = O.check(SAMPLER, F, raw)
  ds = ds or opts.dataset
  local W, R = default_world()
  local s = setmetatable({dataset = ds}, Sampler)
  s.size = sampler_size(F, ds, opts)
  s.num_replicas = O.int(F, "num_replicas", opts.num_replicas, 1, W)
  s.rank = O.int(F, "rank", opts.rank, 0, R)
  if s.rank >= s.num_replicas then
    O.fail("EINVAL: %s: rank %d out of range [0, %d)", F, s.rank, s.num_replicas)
  end
  s.shuffle = O.bool(F, "shuffle", opts.shuffle, true)
  s.seed = O.int(F, "seed", opts.seed, nil, 0)
  s.drop_last = O.bool(F, "drop_last", opts.drop_last, false)
  s.drop_padding = O.bool(F, "drop_padding", opts.drop_padding, false)
  s.epoch = 0
  s.start = 0          -- global positions of this epoch consumed before a resume
  s.resume_epoch = nil -- the epoch load_state_dict resumes
  s:_shape()
  return s
end

function Sampler:_shape()
  self.len, self.num_samples, self.total_size = require("crun.core").sampler_len(self.size, self.num_replicas,
    self.rank, self.drop_last, self.drop_padding, self.start)
end

--- Sets the epoch: the next shuffled order comes from seed + epoch. The
-- epoch a load_state_dict resumes keeps its consumed part; any other starts
-- at its beginning.
function Sampler:set_epoch(epoch)
  self.epoch = O.int("DistributedSampler:set_epoch", "epoch", epoch, 0)
  local start = (self.epoch == self.resume_epoch) and self.resume_start or 0
  if start ~= self.start then
    self.start = start
    self:_shape()
  end
end

--- The sampler's state part-way through an epoch, for a checkpoint that a
-- job of another world size resumes: {epoch=, seed=, size=, shuffle=,
-- drop_last=, consumed=}, consumed being the global positions of the epoch's
-- order already taken. `taken` is how many indices each rank has consumed
-- this epoch (ranks advance in step under DDP; default 0); the positions
-- taken are the first taken * num_replicas after where this epoch started
-- (rank r holds positions r, r + num_replicas, ...), capped at the data set.
function Sampler:state_dict(taken)
  taken = O.int("DistributedSampler:state_dict", "taken", taken, 0, 0)
  if taken > self.num_samples then
    O.fail("EINVAL: DistributedSampler:state_dict: taken %d exceeds the %d samples of a rank this epoch", taken,
           self.num_samples)
  end
  local consumed = math.min(self.start + taken * self.num_replicas, self.size)
  return {epoch = self.epoch, seed = self.seed, size = self.size, shuffle = self.shuffle,
          drop_last = self.drop_last, consumed = consumed}
end

--- Resumes from state_dict's table, at this sampler's num_replicas and
-- rank: the epoch's order is the same (seed + epoch), and its positions
-- from `consumed` on are handed out across the ranks as a whole epoch would
-- be (padding and drop_last over what is left), so no sample of the epoch is
-- repeated or skipped. A state of another data set size, seed or shuffle
-- raises EINVAL naming the field.
function Sampler:load_state_dict(sd)
  local F = "DistributedSampler:load_state_dict"
  if type(sd) ~= "table" then O.fail("EINVAL: %s: expected a table, got %s", F, type(sd)) end
  for _, k in ipairs({"size", "seed"}) do
    if sd[k] ~= self[k] then O.fail("EINVAL: %s: %s is %s in the state, %s here", F, k, tostring(sd[k]), tostring(self[k])) end
  end
  if sd.shuffle ~= self.shuffle then
    O.fail("EINVAL: %s: shuffle is %s in the state, %s here", F, tostring(sd.shuffle), tostring(self.shuffle))
  end
  local epoch = O.int(F, "epoch", sd.epoch, 0)
  local consumed = O.int(F, "consumed", sd.consumed, 0)
  if consumed > self.size then O.fail("EINVAL: %s: consumed %d exceeds the data set's %d samples", F, consumed, self.size) end
  self.resume_epoch, self.resume_start = epoch, consumed
  self.epoch = nil
  self:set_epoch(epoch)
end

--- Returns this rank's list of 1-based dataset indices for the current epoch
-- (global positions rank, rank + num_replicas, ... of the padded or
-- truncated order). Length num_samples, or fewer with drop_padding.
function Sampler:indices()
  return (require("crun.core").sampler_indices(self.size, self.num_replicas, self.rank, self.shuffle,
    self.seed, self.drop_last, self.drop_padding, self.epoch, self.start))
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

--- LocalSampler(dataset[, opts]) or LocalSampler{size= | dataset=, shuffle=false,
-- seed=0, drop_last=false}: indices 1..size for one process (shuffled per
-- epoch when shuffle=true), the same interface as DistributedSampler.
function data.LocalSampler(a, b)
  local ds, raw = split_args("LocalSampler", a, b)
  local o = {}
  for k, v in pairs(O.check(LOCAL, "LocalSampler", raw)) do o[k] = v end
  o.num_replicas, o.rank, o.dataset = 1, 0, ds or o.dataset
  if o.shuffle == nil then o.shuffle = false end
  return data.DistributedSampler(o)
end

-- ---------------------------------------------------------------- TensorDataset

local TensorDataset = {}
TensorDataset.__index = TensorDataset
TensorDataset.__name = "crun.TensorDataset"

--- TensorDataset(X, Y, ...): samples are the rows (dimension 1) of tensors
-- that all have the same number of rows, as torch.utils.data.TensorDataset.
-- #ds is that number; ds[i] returns row i of every tensor (1-based).
function data.TensorDataset(...)
  local ts = table.pack(...)
  if ts.n == 0 then O.fail("EINVAL: TensorDataset: at least one tensor is expected") end
  local n
  for i = 1, ts.n do
    local t = ts[i]
    if not require("crun.serialize").is_tensor(t) then
      O.fail("EINVAL: TensorDataset: argument #%d is a %s, a tensor is expected", i, type(t))
    end
    if t:dim() == 0 then O.fail("EINVAL: TensorDataset: tensor %d has no dimension", i) end
    n = n or t:size(1)
    if t:size(1) ~= n then
      O.fail("EINVAL: TensorDataset: tensor %d has %d rows, tensor 1 has %d", i, t:size(1), n)
    end
  end
  return setmetatable({tensors = {table.unpack(ts, 1, ts.n)}, n = n}, TensorDataset)
end

function TensorDataset:__len() return self.n end

--- ds:get(i) -> row i of every tensor (1-based; EINVAL out of range).
function TensorDataset:get(i)
  if math.type(i) ~= "integer" or i < 1 or i > self.n then
    O.fail("EINVAL: TensorDataset: index %s is out of range 1..%d", tostring(i), self.n)
  end
  local out = {}
  for k, t in ipairs(self.tensors) do out[k] = t[i] end
  return table.unpack(out)
end

TensorDataset.__tostring = function(ds)
  return string.format("crun.TensorDataset(%d tensors, %d samples)", #ds.tensors, ds.n)
end

-- ---------------------------------------------------------------- DataLoader

local Loader = {}
Loader.__index = Loader
Loader.__name = "crun.DataLoader"
-- torch's `for x, y in loader` lands here (Lua calls the loader as the
-- iterator): EINVAL naming crun's form instead of "attempt to call a table value".
Loader.__call = function()
  O.fail("EINVAL: DataLoader: iterate with `for i, x, y in loader:iter() do` (i: the batch number, from 1), " ..
    "not `for x, y in loader do` (torch's form)")
end

-- The list of tensors behind a loader's data set: a TensorDataset's, or a
-- list {X, Y, ...} of tensors with the same number of rows.
local function loader_tensors(ds)
  if getmetatable(ds) == TensorDataset then return ds.tensors, ds.n end
  if type(ds) ~= "table" or #ds == 0 then
    O.fail("EINVAL: DataLoader: dataset must be a TensorDataset or a list of tensors {X, Y, ...}, got %s",
      type(ds) == "table" and "an empty table" or type(ds))
  end
  return data.TensorDataset(table.unpack(ds)).tensors, ds[1]:size(1)
end

--- DataLoader(dataset[, opts]) or DataLoader{dataset=, ...}: dataset is a
-- TensorDataset or a list {X, Y, ...} of tensors whose first dimension is the
-- sample dimension. opts: batch_size=1, sampler= (a DistributedSampler or
-- LocalSampler; default 1..N in order), shuffle=false (a LocalSampler shuffled
-- per epoch with seed=, default 0; exclusive with sampler=, as in torch), drop_last=false.
-- torch's worker options (num_workers, pin_memory, ...) have no effect in
-- crun and are reported once; any other key raises EINVAL.
function data.DataLoader(a, b)
  local F = "DataLoader"
  local ds, raw
  if b == nil and is_options(a) and a[1] == nil then ds, raw = nil, a else ds, raw = a, b or {} end
  if type(raw) ~= "table" then O.fail("EINVAL: %s: options must be a table, got %s", F, type(raw)) end
  local opts = O.check(LOADER, F, raw)
  ds = ds or opts.dataset
  local tensors, n = loader_tensors(ds)
  local bs = O.int(F, "batch_size", opts.batch_size, 1, 1)
  local shuffle = O.bool(F, "shuffle", opts.shuffle, false)
  local sampler = opts.sampler
  if sampler ~= nil and shuffle then
    O.fail("EINVAL: %s: sampler and shuffle=true are mutually exclusive (shuffle in the sampler)", F)
  end
  if sampler ~= nil and (type(sampler) ~= "table" or type(sampler.indices) ~= "function") then
    O.fail("EINVAL: %s: sampler must have an :indices() method (DistributedSampler, LocalSampler), got %s",
      F, type(sampler))
  end
  if sampler ~= nil and math.type(sampler.size) == "integer" and sampler.size ~= n then
    O.fail("EINVAL: %s: the sampler covers %d samples, the data set has %d", F, sampler.size, n)
  end
  if shuffle then sampler = data.LocalSampler{size = n, shuffle = true, seed = O.int(F, "seed", opts.seed, nil, 0)} end
  return setmetatable({dataset = ds, tensors = tensors, batch_size = bs, n = n, own_shuffle = shuffle, passes = 0,
    sampler = sampler, drop_last = O.bool(F, "drop_last", opts.drop_last, false)}, Loader)
end

--- Sets the epoch of the loader's sampler (the next shuffled order). With
-- shuffle=true the loader's own sampler also moves to the next epoch at
-- every iter(), so each pass has a new order, as torch's RandomSampler.
function Loader:set_epoch(epoch)
  if self.sampler and self.sampler.set_epoch then self.sampler:set_epoch(epoch) end
  if self.own_shuffle then self.passes = epoch end
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
  if self.own_shuffle then
    self.sampler:set_epoch(self.passes)
    self.passes = self.passes + 1
  end
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
    for i, t in ipairs(self.tensors) do out[i + 1] = data.gather_rows(t, sel) end
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
  local F = "data.all_reduce_metrics"
  if type(metrics) ~= "table" then O.fail("EINVAL: %s: a table of numbers is expected, got %s", F, type(metrics)) end
  local keys = {}
  for k, v in pairs(metrics) do
    if type(v) ~= "number" then O.fail("EINVAL: %s: metric '%s' is a %s, a number is expected", F, tostring(k), type(v)) end
    keys[#keys + 1] = k
  end
  table.sort(keys, function(a, b) -- the same order on every rank, whatever the key types
    if type(a) ~= type(b) then return type(a) < type(b) end
    if type(a) == "boolean" then return b and not a end
    return a < b
  end)
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

--- Exactly-once distributed evaluation. opts: size (data set size) or
-- dataset (anything with a length, as DistributedSampler takes),
-- batch_size (default 256), fn(indices) -> table of additive metrics for that batch of
-- 1-based indices (e.g. {correct=, loss_sum=, count=}), and optionally
-- num_replicas / rank. Each sample is evaluated by exactly one rank (no
-- padding duplicates); the metric sums over every rank are returned
-- (identical on every rank), with `count` the number of samples seen.
-- opts.metrics lists the keys fn returns (every rank must reduce the same
-- keys, even a rank with no samples).
local EVALUATE = O.spec{"size", "dataset", "batch_size", "fn", "metrics", "num_replicas", "rank"}

function data.evaluate(opts)
  if type(opts) ~= "table" then O.fail("EINVAL: data.evaluate: an options table is expected, got %s", type(opts)) end
  opts = O.check(EVALUATE, "data.evaluate", opts)
  if type(opts.fn) ~= "function" then O.fail("EINVAL: data.evaluate: fn must be a function, got %s", type(opts.fn)) end
  local s = data.DistributedSampler{size = opts.size, dataset = opts.dataset, num_replicas = opts.num_replicas,
    rank = opts.rank, shuffle = false, drop_padding = true}
  local idx, bs = s:indices(), O.int("data.evaluate", "batch_size", opts.batch_size, 1, 256)
  local acc = {count = 0}
  if opts.metrics ~= nil and type(opts.metrics) ~= "table" then
    O.fail("EINVAL: data.evaluate: metrics must be a list of names, got %s", type(opts.metrics))
  end
  for _, k in ipairs(opts.metrics or {}) do acc[k] = 0 end
  for first = 1, #idx, bs do
    local sel = {}
    for k = first, math.min(first + bs - 1, #idx) do sel[#sel + 1] = idx[k] end
    local m = opts.fn(sel)
    if m ~= nil and type(m) ~= "table" then
      O.fail("EINVAL: data.evaluate: fn must return a table of metrics, returned a %s", type(m))
    end
    for k, v in pairs(m or {}) do
      if acc[k] == nil or k == "count" then
        O.fail("EINVAL: data.evaluate: fn returned metric '%s' not listed in opts.metrics", tostring(k))
      end
      if type(v) ~= "number" then
        O.fail("EINVAL: data.evaluate: fn returned metric '%s' as a %s, a number is expected", tostring(k), type(v))
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
-- numbers on every machine (splitmix64 + Box-Muller). opts: n=10000,
-- classes=4, dims=16, turns=1, noise=0.05, seed=1234.
local SPIRALS = O.spec{"n", "classes", "dims", "turns", "noise", "seed"}

function data.make_spirals(opts)
  local F = "make_spirals"
  opts = O.check(SPIRALS, F, opts)
  local function int(k, min, def) return O.int(F, k, math.tointeger(opts[k]) or opts[k], min, def) end -- 4.0 is 4
  local n, K, D = int("n", 0, 10000), int("classes", 1, 4), int("dims", 1, 16)
  local turns, noise = O.num(F, "turns", opts.turns, nil, 1.0), O.num(F, "noise", opts.noise, 0, 0.05)
  local rnd = splitmix64(int("seed", nil, 1234))
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

-- ---------------------------------------------------------------- UCI digits

--- Where the digits file is looked for: $CRUN_DIGITS, else
-- ${XDG_CACHE_HOME:-$HOME/.cache}/crun/digits.csv.gz (scripts/fetch_digits.sh puts it there).
function data.digits_path()
  local p = os.getenv("CRUN_DIGITS")
  if p and p ~= "" then return p end
  local cache = os.getenv("XDG_CACHE_HOME")
  if not cache or cache == "" then cache = (os.getenv("HOME") or "/tmp") .. "/.cache" end
  return cache .. "/crun/digits.csv.gz"
end

--- load_digits{path=, dtype="float32", image=false} -> X, Y, info: the UCI
-- handwritten digits (1,797 8x8 images, pixel values 0..16) from the CSV that
-- Debian's python3-sklearn ships (sklearn/datasets/data/digits.csv.gz: 64
-- pixel columns then the digit, one image a line), gunzipped through zlib.
-- X is [N, 64] (or [N, 1, 8, 8] with image=true) scaled to 0..1; Y holds
-- 1-based class labels (digit d is class d + 1, int64). info = {n=, path=}.
-- A missing file raises ENOTFOUND naming the path and the fetch script; a
-- malformed line raises EINVAL naming file and line.
function data.load_digits(opts)
  opts = opts or {}
  local path = opts.path or data.digits_path()
  if type(path) ~= "string" or path:find("\0", 1, true) then -- (io.open and zlib would cut it at the NUL)
    O.fail("EINVAL: load_digits: path must be a string without a NUL byte, got %q", tostring(path))
  end
  local f = io.open(path, "rb")
  if not f then
    O.fail("ENOTFOUND: load_digits: %s does not exist (run scripts/fetch_digits.sh, or set CRUN_DIGITS)", path)
  end
  f:close()
  local text = require("crun.core").gunzip_file(path, 64 << 20)
  local rows, labels, ln = {}, {}, 0
  for line in text:gmatch("[^\n]+") do
    ln = ln + 1
    local row = {}
    for v in line:gmatch("[^,]+") do
      local x = math.tointeger(tonumber(v))
      if not x then O.fail("EINVAL: load_digits: %s line %d: '%s' is not an integer", path, ln, v) end
      row[#row + 1] = x
    end
    if #row ~= 65 then O.fail("EINVAL: load_digits: %s line %d has %d fields, 65 expected (64 pixels, digit)", path, ln, #row) end
    local d = table.remove(row)
    if d < 0 or d > 9 then O.fail("EINVAL: load_digits: %s line %d: digit %d is not in 0..9", path, ln, d) end
    for k, x in ipairs(row) do
      if x < 0 or x > 16 then O.fail("EINVAL: load_digits: %s line %d: pixel %d is %d, not in 0..16", path, ln, k, x) end
      row[k] = x / 16
    end
    rows[ln], labels[ln] = row, d + 1
  end
  if ln == 0 then O.fail("EINVAL: load_digits: %s holds no images", path) end
  local T = require "crun.tensor"
  local X = T.new(rows, opts.dtype or "float32")
  if opts.image then X = X:view(ln, 1, 8, 8) end
  return X, T.new(labels, "int64"), {n = ln, path = path}
end

--- train_test_split(n, test_fraction, seed) -> train, test: two sorted
-- lists of 1-based indices, the first round(n * test_fraction) positions of
-- the seeded permutation being the test set (identical on every rank).
function data.train_test_split(n, frac, seed)
  O.int("train_test_split", "n", n, 1)
  if type(frac) ~= "number" or not (frac > 0 and frac < 1) then
    O.fail("EINVAL: train_test_split: test_fraction must be in (0, 1), got %s", tostring(frac))
  end
  local perm = data.permutation(n, O.int("train_test_split", "seed", seed))
  local ntest = math.floor(n * frac + 0.5)
  local train, test = {}, {}
  for k, i in ipairs(perm) do
    if k <= ntest then test[#test + 1] = i + 1 else train[#train + 1] = i + 1 end
  end
  table.sort(train)
  table.sort(test)
  return train, test
end

return data
