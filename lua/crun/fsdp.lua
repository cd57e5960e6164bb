--- crun.fsdp: FullyShardedDataParallel for crun.nn modules (torch's FSDP).
--
--   local model = crun.FSDP(net, {sharding_strategy = "FULL_SHARD", auto_wrap = {min_params = 1e5}})
--   local opt = crun.optim.Adam(model, {lr = 1e-3})   -- steps this rank's shards
--   local out = model:forward(x); model:backward(x, crit:backward(out, y)); opt:step()
--
-- The module's parameters are split into units (auto_wrap: every leaf with at
-- least min_params parameters is a unit of its own, the other leaves form
-- the root unit; without it the whole module is one unit). A unit's
-- parameters live as one flat buffer, padded to a multiple of the group
-- size, of which each rank keeps its 1/N shard (the tensor the optimizer
-- steps). Before a unit's first forward its parameters are gathered
-- (all_gather_into_tensor) and the leaves' parameters become views of the
-- full buffer; FULL_SHARD frees the full buffer after the unit's forward and
-- gathers it again for its backward, SHARD_GRAD_OP keeps it until the
-- unit's backward ends, NO_SHARD keeps everything (DDP's memory, one
-- all_reduce per unit). When a unit's backward ends its gradients (written
-- straight into a flat buffer) are averaged and scattered into the shard
-- (reduce_scatter_tensor, async: the next unit's reduction or the end of
-- backward waits for it). The next unit's gather is launched before the
-- current unit computes (forward and backward prefetch), as async work.
-- The full buffers come from a pool that backward empties when it ends, so
-- between steps a rank holds its shards only. Every rank must call forward
-- and backward in the same order (they are collectives).
--
-- The arithmetic and the bookkeeping are C's (runtime/train/fsdp.c, through
-- core.fsdp_*): the layout, the shard ranges, the views and copies, and the
-- schedule (crun.FSDPSched) the hooks below follow; this file launches the
-- collectives it asks for and keeps the buffer pool.
-- @module crun.fsdp
local M = {}

local function T() return require "crun.tensor" end
local function core() return require "crun.core" end
local function dist() return require "crun.dist" end
local O = require "crun.opts"

local FSDP_OPTS = O.spec{"sharding_strategy", "auto_wrap", "mixed_precision", "group", "forward_prefetch",
  "backward_prefetch",
  aliases = {process_group = "group", auto_wrap_policy = "auto_wrap"},
  inert = {device_id = "crun's FSDP runs where the module's tensors are",
    cpu_offload = "the parameters already live in host memory",
    sync_module_states = "every rank's shard comes from rank 0's parameters at wrap time",
    use_orig_params = "the optimizer steps the flat shards",
    limit_all_gathers = "at most one gather is prefetched"}}

local STRATEGIES = {FULL_SHARD = true, SHARD_GRAD_OP = true, NO_SHARD = true}

local FSDP = {}
FSDP.__index = FSDP
FSDP.__name = "crun.FSDP"
FSDP.__call = function(self, x) return self:forward(x) end -- torch's model(x)

-- ---------------------------------------------------------------- units

-- Splits the module's leaves into units: {{leaves = {...}}, ...} in forward
-- order of their first leaf; the root unit (leaves below min_params) first.
local function plan_units(module, min_params)
  local leaves = module:leaves()
  if not min_params then return {{leaves = leaves}} end
  local root, units = {leaves = {}}, {}
  for _, l in ipairs(leaves) do
    local n = 0
    for _, p in ipairs((l:parameters())) do n = n + p:numel() end
    if n >= min_params then units[#units + 1] = {leaves = {l}} else root.leaves[#root.leaves + 1] = l end
  end
  if #root.leaves > 0 then table.insert(units, 1, root) end
  return units
end

-- Fills a unit's layout (the arithmetic is crun_fsdp_layout's and
-- crun_fsdp_shard_range's): entries {leaf, index, shape, numel, offset},
-- offsets (0-based, one per entry), total numel, padded size, shard size and
-- shard_start (this rank's shard's offset in the padded buffer).
local function layout(u, world, rank, no_shard)
  u.entries = {}
  local numels = {}
  for _, leaf in ipairs(u.leaves) do
    local ps = leaf:parameters()
    for i, p in ipairs(ps) do
      u.entries[#u.entries + 1] = {leaf = leaf, index = i, shape = p:size(), numel = p:numel()}
      numels[#u.entries] = p:numel()
    end
    u.dtype = u.dtype or (ps[1] and ps[1]:dtype())
    for _, p in ipairs(ps) do
      if p:dtype() ~= u.dtype then
        O.fail("ENOTSUP: FSDP: a unit mixes dtypes %s and %s (wrap them in separate units)", u.dtype, p:dtype())
      end
    end
  end
  u.dtype = u.dtype or "float32"
  u.offsets, u.numel, u.padded, u.shard_numel = core().fsdp_layout(numels, world, no_shard)
  for k, e in ipairs(u.entries) do e.offset = u.offsets[k] end
  u.shard_start = no_shard and 0 or select(4, core().fsdp_shard_range(u.numel, world, rank))
end

--- shard_range(numel, world, rank) -> first (0-based) and count of the
-- elements of a flat buffer of `numel` that rank owns (the padding is the
-- tail of the last shards), and the shard size.
function M.shard_range(numel, world, rank)
  local first, count, per = core().fsdp_shard_range(numel, world, rank)
  return first, count, per
end

-- ---------------------------------------------------------------- construction

-- mixed_precision's param_dtype and buffer_dtype must name the dtype the
-- tensors already have: crun has no cast-for-compute step, and ignoring
-- them would train silently in another precision than the one asked for.
local function check_param_dtype(mp, u)
  if mp.param_dtype and mp.param_dtype ~= u.dtype then
    O.fail("ENOTSUP: FSDP: mixed_precision param_dtype = %s but unit %d's parameters are %s: crun computes in the "
      .. "parameters' dtype (convert the module instead)", mp.param_dtype, u.k, u.dtype)
  end
end

local function check_buffer_dtype(mp, module)
  if not mp.buffer_dtype then return end
  for _, leaf in ipairs(module:leaves()) do
    for _, b in ipairs(leaf:buffers()) do
      if b:dtype():match("^b?float") and b:dtype() ~= mp.buffer_dtype then -- (torch casts floating buffers only)
        O.fail("ENOTSUP: FSDP: mixed_precision buffer_dtype = %s but a buffer of %s is %s: crun keeps buffers in "
          .. "their own dtype (convert the module instead)", mp.buffer_dtype, leaf:describe(), b:dtype())
      end
    end
  end
end

-- Checks FSDP's options; returns the strategy, auto_wrap's min_params (nil:
-- no wrapping) and the mixed_precision table ({} when absent).
local function check_options(opts)
  local strategy = opts.sharding_strategy or "FULL_SHARD"
  if not STRATEGIES[strategy] then
    O.fail("EINVAL: FSDP: sharding_strategy must be FULL_SHARD, SHARD_GRAD_OP or NO_SHARD, got %s", tostring(strategy))
  end
  local aw = opts.auto_wrap
  local min_params = type(aw) == "table" and aw.min_params or nil
  if aw ~= nil and not (type(min_params) == "number" and min_params >= 1) then -- (NaN fails >= 1)
    O.fail("EINVAL: FSDP: auto_wrap must be {min_params = N} with N >= 1, got %s",
      type(aw) == "table" and "min_params = " .. tostring(min_params) or tostring(aw))
  end
  local mp = opts.mixed_precision or {}
  if type(mp) ~= "table" then
    O.fail("EINVAL: FSDP: mixed_precision must be a table {reduce_dtype=, param_dtype=, buffer_dtype=}, got %s",
      type(mp))
  end
  for k, v in pairs(mp) do
    if k ~= "param_dtype" and k ~= "reduce_dtype" and k ~= "buffer_dtype" then
      O.fail("EINVAL: FSDP: unknown mixed_precision key '%s'", tostring(k))
    end
    if v ~= "float32" and v ~= "float64" then
      O.fail("ENOTSUP: FSDP: mixed_precision %s = %s: crun computes in float32 and float64 only", k, tostring(v))
    end
  end
  return strategy, min_params, mp
end

-- FSDP's checks of its arguments and its local setup, before any
-- collective: the new model, its units laid out.
local function prepare(module, opts)
  if dist()._group_arg then dist()._group_arg("FSDP", opts) end
  opts = O.check(FSDP_OPTS, "FSDP", opts)
  if type(module) ~= "table" or type(module.leaves) ~= "function" then
    O.fail("EINVAL: FSDP: a crun.nn module is expected, got %s", type(module))
  end
  if rawget(module, "_sharded_by") then
    O.fail("EINVAL: FSDP: the module's parameters are sharded by %s: wrap a module once", module._sharded_by)
  end
  local d = dist()
  if not d.is_initialized() then O.fail("ESTATE: FSDP needs a process group: call crun.dist.init_process_group() first") end
  local strategy, min_params, mp = check_options(opts)
  check_buffer_dtype(mp, module)
  local self = setmetatable({module = module, group = opts.group, strategy = strategy,
    reduce_dtype = mp.reduce_dtype, prefetch_fwd = O.bool("FSDP", "forward_prefetch", opts.forward_prefetch, true),
    prefetch_bwd = O.bool("FSDP", "backward_prefetch", opts.backward_prefetch, true),
    stats = {gathers = 0, reduces = 0, peak_full_bytes = 0},
    pool = {}, held = 0}, FSDP)
  self.copts = self.group and {group = self.group} or nil
  self.world, self.rank = d.get_world_size(self.group), d.get_rank(self.group)
  if self.rank < 0 then O.fail("EINVAL: FSDP: this rank is not a member of the group") end
  self.units = {}
  for _, u in ipairs(plan_units(module, min_params)) do
    layout(u, self.world, self.rank, strategy == "NO_SHARD")
    if u.numel > 0 then -- leaves without parameters need no unit
      self.units[#self.units + 1] = u
      u.k = #self.units
      check_param_dtype(mp, u)
    end
  end
  return self
end

--- FSDP(module, {sharding_strategy="FULL_SHARD"|"SHARD_GRAD_OP"|"NO_SHARD",
-- auto_wrap={min_params=N}, group=, forward_prefetch=true, backward_prefetch=true,
-- mixed_precision={reduce_dtype=}}). Blocks: every rank must wrap the same
-- parameter shapes into the same units (checked; a difference raises
-- EMISMATCH on every rank), rank 0's parameters are broadcast, then each
-- rank keeps its shards. A fault of the arguments on one rank alone fails
-- every rank's FSDP naming it (crun.dist._setup); the same fault on every
-- rank leaves the group usable.
function M.FSDP(module, opts)
  local setup = dist()._setup or function(_, _, f, ...) return f(...) end -- (a stand-in crun.dist has none)
  local self = setup("all_gather", opts, prepare, module, opts) -- before _verify's all_gather
  self:_verify()
  for _, u in ipairs(self.units) do self:_shard(u) end
  local strategy = self.strategy
  self.sched = core().fsdp_sched_new(#self.units, strategy, self.prefetch_fwd, self.prefetch_bwd)
  for k, u in ipairs(self.units) do
    for _, leaf in ipairs(u.leaves) do self:_wrap_leaf(leaf, u) end
    u.first_leaf, u.last_leaf = u.leaves[1], u.leaves[#u.leaves]
    if strategy == "NO_SHARD" then
      self:_point(u, u.full, "_set_param")
      self:_point(u, u.grad, "_set_grad")
    end
    u.order = k
  end
  -- its own parameters are now empty tensors or transient views: an
  -- optimizer built from it would step nothing (crun.optim refuses it)
  module._sharded_by = "crun.FSDP"
  for _, leaf in ipairs(module:leaves()) do leaf._sharded_by = "crun.FSDP" end
  return self
end

-- "rank r" in messages; on a group whose rank r is global rank g ~= r,
-- "rank g (group rank r)", as the runtime's texts name a sub-group's rank.
function FSDP:_rk(r)
  local g = self.group and dist().get_global_rank(self.group, r) or r
  if g == r then return "rank " .. r end
  return string.format("rank %d (group rank %d)", g, r)
end

-- Every rank must wrap the same parameter shapes into the same units (else
-- rank 0's values would be poured into other shapes, or the collectives
-- would not pair up): one all_gather_object of the layout, the first
-- difference from rank 0 named on every rank as EMISMATCH.
function FSDP:_verify()
  if self.world == 1 then return end
  local sig = {}
  for k, u in ipairs(self.units) do
    for _, e in ipairs(u.entries) do
      sig[#sig + 1] = string.format("%s[%s] (unit %d)", u.dtype, table.concat(e.shape, "x"), k)
    end
  end
  local d, all = dist(), nil -- (a second argument that is not {group=} would pick torch's form)
  if self.copts then all = d.all_gather_object(sig, self.copts) else all = d.all_gather_object(sig) end
  for r = 2, #all do
    for i = 1, math.max(#all[1], #all[r]) do
      if all[1][i] ~= all[r][i] then
        O.fail("EMISMATCH: FSDP: parameter %d is %s on %s but %s on %s (every rank must wrap the same "
          .. "model, with the same auto_wrap)", i, all[r][i] or "missing", self:_rk(r - 1), all[1][i] or "missing",
          self:_rk(0))
      end
    end
  end
end

-- Builds unit u's shard (and gradient shard) from rank 0's parameters.
function FSDP:_shard(u)
  local flat, ps = T().zeros({math.max(u.padded, 1)}, u.dtype), {}
  for k, e in ipairs(u.entries) do ps[k] = e.leaf:parameters()[e.index] end
  core().fsdp_flatten(flat, ps, u.offsets)
  local src = self.group and dist().get_global_rank(self.group, 0) or 0
  dist().broadcast(flat, src, self.copts)
  if self.strategy == "NO_SHARD" then
    u.shard = flat
    u.full, u.grad = flat, T().zeros({math.max(u.padded, 1)}, u.dtype)
  else
    u.shard = flat:narrow(1, u.shard_start + 1, u.shard_numel):clone()
  end
  u.grad_shard = T().zeros({u.shard_numel}, u.dtype)
  u.views = {}
  -- the leaves' own tensors are dropped: they become views when gathered
  for _, e in ipairs(u.entries) do
    e.leaf:_set_param(e.index, T().zeros({0}, u.dtype))
    e.leaf:_set_grad(e.index, T().zeros({0}, u.dtype))
  end
end

-- ---------------------------------------------------------------- buffers

-- The full-size buffers (a unit's gathered parameters, its gradients) and
-- the shard-size reduce_scatter outputs come from a pool keyed by dtype and
-- size, so a step allocates a few buffers, not three per unit, and never
-- zero-fills what a collective overwrites. A record is {t = tensor, key =,
-- bytes =, blocks = the group-size block views of a full-size t (the
-- collectives' output and input lists, made once), work = the operation
-- pending on t}. A record goes back to the pool only once nothing is
-- pending on it; every backward ends by draining the pool (each tensor
-- closed: its storage goes back to the allocator then, not at some later
-- garbage collection), so between steps a rank holds its shards only.

local function elsize(dtype) return dtype == "float64" and 8 or 4 end

-- A record of n elements of dtype (contents unspecified), with its block
-- views when `blocks`. Counts it in self.held and the peak.
function FSDP:_take(n, dtype, blocks)
  local key = string.format("%s:%d:%s", dtype, n, blocks and "b" or "")
  local free = self.pool[key]
  if free and #free > 0 then return table.remove(free) end
  local rec = {t = T().empty({math.max(n, 1)}, dtype), key = key, bytes = n * elsize(dtype)}
  if blocks then
    rec.blocks = {}
    for r = 1, self.world do
      local _, _, per, start = core().fsdp_shard_range(n, self.world, r - 1)
      rec.blocks[r] = rec.t:narrow(1, start + 1, per)
    end
  end
  self.held = self.held + rec.bytes
  self.stats.peak_full_bytes = math.max(self.stats.peak_full_bytes, self.held)
  return rec
end

-- Puts rec back in the pool; an operation still pending on it is an ESTATE
-- error (its buffer would be reused while being written).
function FSDP:_give(rec)
  if rec.work then
    O.fail("ESTATE: FSDP: a buffer went back to the pool while an operation on it was pending")
  end
  local free = self.pool[rec.key] or {}
  self.pool[rec.key] = free
  free[#free + 1] = rec
end

-- Closes every pooled buffer (and its block views).
function FSDP:_drain()
  for _, free in pairs(self.pool) do
    for _, rec in ipairs(free) do
      for _, b in ipairs(rec.blocks or {}) do b:close() end
      rec.t:close()
      self.held = self.held - rec.bytes
    end
  end
  self.pool = {}
end

-- Points each leaf of u (through setter "_set_param" or "_set_grad") at a
-- view of `flat`; the views are kept in u.views when `owned` (closed on
-- release).
function FSDP:_point(u, flat, setter, owned)
  local view = core().fsdp_view
  for _, e in ipairs(u.entries) do
    local v = view(flat, e.offset, e.shape)
    e.leaf[setter](e.leaf, e.index, v)
    if owned then u.views[#u.views + 1] = v end
  end
end

-- Points the unit's leaves' parameters at views of rec's tensor.
function FSDP:_materialize(u, rec)
  u.full_rec, u.full = rec, rec.t
  self:_point(u, rec.t, "_set_param", true)
end

-- Gives the unit's leaves a zeroed gradient buffer (from the pool) unless
-- they have one.
function FSDP:_grad_buffer(u)
  if u.grad then return end
  u.grad_rec = self:_take(u.padded, u.dtype, true)
  u.grad = u.grad_rec.t
  u.grad:zero()
  self:_point(u, u.grad, "_set_grad", true)
end

-- Releases the unit's full buffers to the pool (the leaves hold empty
-- tensors again; the views they held are closed).
function FSDP:_release(u)
  if self.strategy == "NO_SHARD" or not u.full then return end
  for _, e in ipairs(u.entries) do
    e.leaf:_set_param(e.index, T().zeros({0}, u.dtype))
    e.leaf:_set_grad(e.index, T().zeros({0}, u.dtype))
  end
  for _, v in ipairs(u.views) do v:close() end
  u.views = {}
  self:_give(u.full_rec)
  if u.grad_rec then self:_give(u.grad_rec) end
  u.full, u.full_rec, u.grad, u.grad_rec = nil, nil, nil, nil
end

-- ---------------------------------------------------------------- gathering

-- Launches unit u's all_gather (async; the schedule said it is due). The
-- Work pins the block views (and the shard) until it completes.
function FSDP:_launch_gather(u)
  local rec = self:_take(u.padded, u.dtype, true)
  local o = {async_op = true}
  if self.group then o.group = self.group end
  rec.work = dist().all_gather(rec.blocks, u.shard, o)
  u.pending = rec
  self.stats.gathers = self.stats.gathers + 1
end

-- Waits for the gather pending on u and returns its record.
function FSDP:_finish_gather(u)
  local rec = u.pending
  if not rec then O.fail("ESTATE: FSDP: unit %d's gather is awaited but was never launched", u.k) end
  u.pending = nil
  rec.work:wait()
  rec.work = nil
  return rec
end

-- Does what the schedule's step says for unit u: launch its gather, wait
-- for it and point the leaves at it.
function FSDP:_bring(u, launch, wait)
  if launch then self:_launch_gather(u) end
  if wait then self:_materialize(u, self:_finish_gather(u)) end
end

-- ---------------------------------------------------------------- hooks

-- Wraps leaf's forward and backward with the unit's gather, release,
-- prefetch and gradient reduction, as the schedule (crun_fsdp_sched: the
-- units' states, the prefetch order, when each strategy frees a unit) says.
function FSDP:_wrap_leaf(leaf, u)
  local cls = getmetatable(leaf)
  local fwd, bwd = cls.forward, cls.backward
  local fsdp, sched = self, self.sched
  leaf.forward = function(l, x)
    local launch, wait, prefetch = sched:pre_forward(u.k, l == u.first_leaf)
    fsdp:_bring(u, launch, wait)
    if prefetch then fsdp:_launch_gather(fsdp.units[prefetch]) end
    local y = fwd(l, x)
    if l == u.last_leaf and sched:post_forward(u.k) then fsdp:_release(u) end
    return y
  end
  leaf.backward = function(l, x, gy)
    if l == u.last_leaf then
      local launch, wait, prefetch = sched:pre_backward(u.k)
      fsdp:_bring(u, launch, wait)
      fsdp:_grad_buffer(u)
      if prefetch then fsdp:_launch_gather(fsdp.units[prefetch]) end
    end
    local gx = bwd(l, x, gy)
    if l == u.first_leaf then fsdp:_reduce(u) end
    return gx
  end
end

-- Unit u's backward ended: its gradients, averaged over the group, go into
-- its gradient shard (accumulated, as torch accumulates .grad) and its full
-- buffers are released (when the schedule says so: all but NO_SHARD).
-- NO_SHARD blocks on an all_reduce; the others launch the reduce_scatter as
-- async work, which the next unit's reduction (or the end of backward)
-- finishes, so a rank goes on with the next unit's backward instead of
-- waiting for its peers.
function FSDP:_reduce(u)
  local rd = self.reduce_dtype and self.reduce_dtype ~= u.dtype and self.reduce_dtype or nil
  if self.strategy == "NO_SHARD" then
    local grad = rd and u.grad:to(rd) or u.grad
    dist().all_reduce(grad, "avg", self.copts)
    if rd then u.grad:copy(grad) end
    u.grad_shard:add_(u.grad)
    u.grad:zero()
    self.sched:post_backward(u.k)
  else
    self:_finish_reduce()
    local out, grad = self:_take(u.shard_numel, rd or u.dtype), u.grad_rec
    local o = {async_op = true, group = self.group}
    if rd then
      out.work = dist().reduce_scatter_tensor(out.t, u.grad:to(rd), "avg", o)
    else
      out.work = dist().reduce_scatter(out.t, grad.blocks, "avg", o)
    end
    grad.work = out.work -- the gradient buffer is read until it completes
    u.grad_rec = nil     -- so _release leaves it to _finish_reduce
    if self.sched:post_backward(u.k) then self:_release(u) end
    self.reducing = {u = u, out = out, grad = grad, rd = rd}
  end
  self.stats.reduces = self.stats.reduces + 1
end

-- Waits for the pending reduce_scatter (if any), adds its output into its
-- unit's gradient shard and gives its buffers back to the pool.
function FSDP:_finish_reduce()
  local p = self.reducing
  if not p then return end
  self.reducing = nil
  p.out.work:wait()
  p.out.work, p.grad.work = nil, nil
  p.u.grad_shard:add_(p.rd and p.out.t:to(p.u.dtype) or p.out.t)
  self:_give(p.out)
  self:_give(p.grad)
end

-- ---------------------------------------------------------------- module API

function FSDP:forward(x) return self.module:forward(x) end

--- backward(x, gy): the module's backward; returns once every unit's
-- gradients are in its shard (blocking) and every pooled buffer is closed.
function FSDP:backward(x, gy)
  local gx = self.module:backward(x, gy)
  self:_finish_reduce()
  for _, u in ipairs(self.units) do
    -- a prefetch nobody needed (e.g. the root unit's): finish it
    if u.pending then self:_give(self:_finish_gather(u)) end
  end
  self.sched:end_backward()
  self:_drain()
  self.gradInput = gx
  return gx
end

--- parameters() -> this rank's shards and their gradients (one flat tensor
-- per unit): what an optimizer steps.
function FSDP:parameters()
  local p, g = {}, {}
  for k, u in ipairs(self.units) do p[k], g[k] = u.shard, u.grad_shard end
  return p, g
end

function FSDP:zero_grad(set_to_none)
  O.zero_grad_arg("FSDP:zero_grad", set_to_none)
  for _, u in ipairs(self.units) do u.grad_shard:zero() end
end

--- clip_grad_norm_(max_norm[, norm_type=2][, {error_if_nonfinite=false}]) ->
-- the total norm of the whole model's gradients (a number, the same on every
-- rank): each rank's shards' part of it is summed (max for "inf") over the
-- group, then every shard is scaled as nn.utils.clip_grad_norm_ scales
-- (torch's FSDP.clip_grad_norm_). A collective: every rank calls it, after
-- backward. NO_SHARD ranks hold whole gradients: their norm is their own.
function FSDP:clip_grad_norm_(max_norm, norm_type, opts)
  local U = require "crun.nn_utils"
  local F = "FSDP:clip_grad_norm_"
  local p, nonfinite = U.clip_args(F, max_norm, norm_type, opts)
  local _, grads = self:parameters()
  local part = U.part(grads, p)
  if self.strategy ~= "NO_SHARD" and self.world > 1 then
    -- [part, NaN seen]: a max need not carry a NaN through
    local t = T().zeros({2}, "float64")
    t[1], t[2] = part == part and part or 0, part == part and 0 or 1
    dist().all_reduce(t, p == math.huge and "max" or "sum", self.copts)
    part = t[2] > 0 and 0 / 0 or t[1]
  end
  local total = U.total(part, p)
  U.scale(grads, total, max_norm, p, nonfinite, F)
  return total
end

function FSDP:train(mode) self.module:train(mode); return self end
function FSDP:evaluate() self.module:evaluate(); return self end
FSDP.eval = FSDP.evaluate

--- Bytes this rank holds now: {params=, grads=, pool=}: the shards plus
-- the full buffers of gathered units (and NO_SHARD's gradient buffer); pool
-- is the idle pooled buffers (none between steps: backward drains them).
function FSDP:memory()
  local m = {params = 0, grads = 0, pool = 0}
  for _, u in ipairs(self.units) do
    local es = elsize(u.dtype)
    m.params = m.params + u.shard:numel() * es + (u.full_rec and u.padded * es or 0)
    m.grads = m.grads + u.grad_shard:numel() * es + (u.grad and u.padded * es or 0)
  end
  for _, free in pairs(self.pool) do
    for _, rec in ipairs(free) do m.pool = m.pool + rec.bytes end
  end
  return m
end

-- ---------------------------------------------------------------- state

-- Unit u's whole flat parameter buffer on every rank (a collective).
function FSDP:_full_flat(u)
  if self.strategy == "NO_SHARD" then return u.shard:clone() end
  local full = T().zeros({u.padded}, u.dtype)
  dist().all_gather_into_tensor(full, u.shard, self.copts)
  return full
end

--- state_dict() -> the module's full state_dict (as Module:state_dict: the
-- parameter tensors in registration order, then the buffers, rank 0's) on
-- rank 0 of the group, nil elsewhere. A collective: every rank calls it.
function FSDP:state_dict(opts)
  if opts ~= nil then
    O.fail("EINVAL: FSDP:state_dict: options are not supported (a keyed state dict is Module:state_dict's, "
      .. "not yet FSDP's: FSDP gives the list form)")
  end
  local by_leaf = {}
  for _, u in ipairs(self.units) do
    local full, ts = self:_full_flat(u), {}
    for k, e in ipairs(u.entries) do ts[k] = T().empty(e.shape, u.dtype) end
    core().fsdp_unflatten(full, ts, u.offsets)
    full:close()
    for k, e in ipairs(u.entries) do
      by_leaf[e.leaf] = by_leaf[e.leaf] or {}
      by_leaf[e.leaf][e.index] = ts[k]
    end
  end
  if self.rank ~= 0 then return nil end
  local sd = {}
  for _, leaf in ipairs(self.module:leaves()) do
    for _, t in ipairs(by_leaf[leaf] or {}) do sd[#sd + 1] = t end
  end
  for _, b in ipairs(self.module:buffers()) do sd[#sd + 1] = b:clone() end -- (not sharded: rank 0's own)
  return sd
end

-- The (unit, entry) of every parameter, in state_dict()'s order.
function FSDP:_param_order()
  local by_leaf, order = {}, {}
  for _, u in ipairs(self.units) do
    for _, e in ipairs(u.entries) do
      by_leaf[e.leaf] = by_leaf[e.leaf] or {}
      by_leaf[e.leaf][e.index] = {u = u, e = e}
    end
  end
  for _, leaf in ipairs(self.module:leaves()) do
    for _, x in ipairs(by_leaf[leaf] or {}) do order[#order + 1] = x end
  end
  return order
end

-- EINVAL unless sd lists a tensor of the right shape for each of params
-- ({u, e} records) and bufs, or for params alone.
local function check_full_sd(sd, params, bufs)
  local F = "EINVAL: FSDP:load_state_dict: "
  local key = require("crun.nn").state_dict_key(sd)
  if key then
    O.fail(F .. "a state dict keyed by names (key \"%s\") is not supported yet: FSDP loads the list form "
      .. "(state_dict() without keyed)", key)
  end
  local n = type(sd) == "table" and #sd
  if n ~= #params + #bufs and n ~= #params then
    O.fail(F .. "expected %d tensors (%d parameters, %d buffers) or the %d parameters, got %s", #params + #bufs,
      #params, #bufs, #params, n and tostring(n) or type(sd))
  end
  local is_tensor = require("crun.serialize").is_tensor
  for i = 1, n do
    local want = params[i] and params[i].e.shape or bufs[i - #params]:size()
    if not is_tensor(sd[i]) then O.fail(F .. "entry %d is a %s, a tensor is expected", i, type(sd[i])) end
    if table.concat(sd[i]:size(), "x") ~= table.concat(want, "x") then
      O.fail(F .. "tensor %d has shape %s, the model's has %s", i, table.concat(sd[i]:size(), "x"),
        table.concat(want, "x"))
    end
  end
end

--- load_state_dict(sd): sd is a full state_dict (state_dict()'s list, or
-- the plain module's; the parameters alone leave the buffers as they are)
-- on every rank; each copies its slice of every unit into its shard, and
-- the buffers. Every entry is checked first (EINVAL, nothing loaded). Not
-- a collective; call it between steps.
function FSDP:load_state_dict(sd)
  local params, bufs = self:_param_order(), self.module:buffers()
  check_full_sd(sd, params, bufs)
  local per_unit = {}
  for i, x in ipairs(params) do
    local ts = per_unit[x.u] or {}
    per_unit[x.u] = ts
    for k, e in ipairs(x.u.entries) do
      if e == x.e then ts[k] = sd[i]:dtype() == x.u.dtype and sd[i] or sd[i]:to(x.u.dtype) end
    end
  end
  for u, ts in pairs(per_unit) do -- (each unit on its own: the order does not matter)
    local flat = T().zeros({math.max(u.padded, 1)}, u.dtype)
    core().fsdp_flatten(flat, ts, u.offsets)
    if self.strategy == "NO_SHARD" then u.shard:copy(flat)
    else u.shard:copy(flat:narrow(1, u.shard_start + 1, u.shard_numel)) end
    flat:close()
  end
  if #sd > #params then
    for j, b in ipairs(bufs) do b:copy(sd[#params + j]) end
  end
end

--- sharded_state_dict([optim]) -> this rank's part: {world=, rank=, optim_kind=,
-- optim_param_groups = {{lr=, ..., params = {1, ..., units}}} (the options,
-- as torch's optimizer state dict holds them), units = {{numel=, shard=,
-- optim={key=tensor|number}}}}; save one per rank.
function FSDP:sharded_state_dict(optim)
  local sd = {world = self.world, rank = self.rank, units = {}, optim_kind = optim and optim.kind,
    optim_param_groups = optim and {optim:_group_dict(#self.units)}}
  for k, u in ipairs(self.units) do
    local rec = {numel = u.numel, shard = u.shard:clone()}
    local st = optim and optim.state and optim.state[k]
    if st then
      rec.optim = {}
      for key, v in pairs(st) do rec.optim[key] = type(v) == "userdata" and v:clone() or v end
    end
    sd.units[k] = rec
  end
  return sd
end

-- The parts of one checkpoint in rank order (a new list; the caller's is
-- left as it was). EINVAL unless they are every old rank's part once: one
-- part missing would shift every later slice into the wrong place.
local function by_rank(parts)
  local F = "EINVAL: FSDP:load_sharded_state_dict: "
  if type(parts) ~= "table" or #parts == 0 then O.fail(F .. "a list of every rank's sharded_state_dict is expected") end
  local world, at = type(parts[1]) == "table" and parts[1].world, {}
  for i, p in ipairs(parts) do
    if type(p) ~= "table" or math.type(p.world) ~= "integer" or p.world ~= world or math.type(p.rank) ~= "integer"
        or p.rank < 0 or p.rank >= p.world or type(p.units) ~= "table" then
      O.fail(F .. "part %d (rank %s of %s) is not a sharded_state_dict of the same %s-rank checkpoint as part 1", i,
        tostring(type(p) == "table" and p.rank), tostring(type(p) == "table" and p.world), tostring(world))
    end
    if at[p.rank + 1] then O.fail(F .. "parts %d and %d are both rank %d's", at[p.rank + 1], i, p.rank) end
    at[p.rank + 1] = i
  end
  local sorted = {}
  for r = 1, world do
    if not at[r] then
      O.fail(F .. "rank %d's part is missing (the checkpoint was saved at %d ranks, %d part%s given: pass every "
        .. "rank's sharded_state_dict)", r - 1, world, #parts, #parts == 1 and "" or "s")
    end
    sorted[r] = parts[at[r]]
  end
  return sorted
end

-- Unit k's record in every part (EMISMATCH when a part's differs in size).
function FSDP:_unit_records(parts, k, u)
  local recs = {}
  for r, p in ipairs(parts) do
    recs[r] = p.units[k]
    if type(recs[r]) ~= "table" or recs[r].numel ~= u.numel then
      O.fail("EMISMATCH: FSDP:load_sharded_state_dict on rank %d: unit %d holds %s elements in the checkpoint of "
        .. "rank %d, %d here", self.rank, k, type(recs[r]) == "table" and tostring(recs[r].numel) or "no", r - 1,
        u.numel)
    end
  end
  return recs
end

-- This rank's slice of unit u (the k-th) from the old ranks' slices
-- get(rec), laid end to end (a new tensor). EMISMATCH when together they
-- hold fewer than the unit's elements (the rest would be zeros), naming
-- the first part shorter than its world's shard size; `what` names them.
function FSDP:_reshard(u, k, recs, get, what)
  local full = T().zeros({math.max(u.padded, u.numel, 1)}, u.dtype)
  local off, short = 0, nil
  local is_tensor = require("crun.serialize").is_tensor
  for r, rec in ipairs(recs) do
    local t = get(rec)
    if not is_tensor(t) then
      O.fail("EINVAL: FSDP:load_sharded_state_dict: rank %d's %s of unit %d is a %s, a tensor is expected", r - 1,
        what, k, type(t))
    end
    local n = math.min(t:numel(), u.numel - off)
    if n > 0 then full:narrow(1, off + 1, n):copy(t:narrow(1, 1, n)) end
    if not short and t:numel() < select(3, core().fsdp_shard_range(u.numel, #recs, r - 1)) then short = r end
    off = off + t:numel()
  end
  if off < u.numel then
    O.fail("EMISMATCH: FSDP:load_sharded_state_dict: the parts hold %d of unit %d's %d elements (rank %d's %s has %d)",
      off, k, u.numel, (short or 1) - 1, what, get(recs[short or 1]):numel())
  end
  if self.strategy == "NO_SHARD" then return full:narrow(1, 1, u.numel):clone() end
  return full:narrow(1, u.shard_start + 1, u.shard_numel):clone()
end

-- EINVAL unless optim steps this model's shards and the checkpoint's
-- optimizer state (if any) is of optim's kind.
function FSDP:_check_optim(parts, optim)
  local F = "EINVAL: FSDP:load_sharded_state_dict: "
  if type(optim) ~= "table" or type(optim.params) ~= "table" or #optim.params ~= #self.units then
    O.fail(F .. "the optimizer does not step this model's shards (build it from this FSDP model)")
  end
  for k, u in ipairs(self.units) do
    if not rawequal(optim.params[k], u.shard) then
      O.fail(F .. "the optimizer does not step this model's shards (build it from this FSDP model)")
    end
  end
  local kind = parts[1].optim_kind
  if kind ~= nil and kind ~= optim.kind then
    O.fail(F .. "the checkpoint holds %s state, the optimizer is %s", tostring(kind), tostring(optim.kind))
  end
end

-- Unit k's optimizer state for this rank from recs (nil when the checkpoint
-- has none); EINVAL when some parts have it and others not.
function FSDP:_unit_optim_state(u, k, recs)
  local F = "EINVAL: FSDP:load_sharded_state_dict: "
  for r = 2, #recs do
    if (recs[r].optim == nil) ~= (recs[1].optim == nil) then
      local has, lacks = recs[1].optim and 0 or r - 1, recs[1].optim and r - 1 or 0
      O.fail(F .. "rank %d's part has no optimizer state for unit %d, rank %d's has", lacks, k, has)
    end
  end
  if not recs[1].optim then return nil end
  local is_tensor, st = require("crun.serialize").is_tensor, {}
  for key, v in pairs(recs[1].optim) do
    if is_tensor(v) then
      for r = 2, #recs do
        if not is_tensor(recs[r].optim[key]) then
          O.fail(F .. "rank %d's part has no %s for unit %d, rank 0's has", r - 1, tostring(key), k)
        end
      end
      st[key] = self:_reshard(u, k, recs, function(rec) return rec.optim[key] end, tostring(key))
    else
      st[key] = v
    end
  end
  return st
end

--- load_sharded_state_dict(parts[, optim]): parts is the list of every old
-- rank's sharded_state_dict (any world size); each rank takes its own
-- slice of every unit's parameters (and of the optimizer state's tensors).
-- The optimizer also takes the checkpoint's options (lr, betas, ...), as
-- torch's load does. Everything is checked first (the parts, the optimizer:
-- it must step this model's shards and be of the checkpoint's kind); on an
-- error nothing is loaded.
function FSDP:load_sharded_state_dict(parts, optim)
  parts = by_rank(parts)
  for r, p in ipairs(parts) do -- (a unit more or less: a checkpoint of another model)
    if #p.units ~= #self.units then
      O.fail("EMISMATCH: FSDP:load_sharded_state_dict: the checkpoint holds %d units (rank %d's part), this model %d",
        #p.units, r - 1, #self.units)
    end
  end
  if optim ~= nil then self:_check_optim(parts, optim) end
  local shards, state, any = {}, {}, false
  for k, u in ipairs(self.units) do
    local recs = self:_unit_records(parts, k, u)
    shards[k] = self:_reshard(u, k, recs, function(rec) return rec.shard end, "shard")
    if optim ~= nil then
      state[k] = self:_unit_optim_state(u, k, recs)
      any = any or state[k] ~= nil
    end
  end
  -- the optimizer's own checks (required tensors, sizes, step, the group's
  -- options) before any copy; the options (lr, betas, ...) as torch restores
  -- them, so that a resumed run goes on at the saved rate
  local groups = optim ~= nil and parts[1].optim_param_groups
  if any or groups then optim:load_state_dict({kind = optim.kind, state = state, param_groups = groups or nil}) end
  for k, u in ipairs(self.units) do u.shard:copy(shards[k]) end
end

function FSDP:__tostring()
  local n = 0
  for _, u in ipairs(self.units) do n = n + u.numel end
  return string.format("crun.FSDP(%s, %d units, %d parameters, world %d)", self.strategy, #self.units, n, self.world)
end

M.FSDPClass = FSDP
M._plan_units = plan_units
return M
