--- crun.comm_hooks: DDP communication hooks and model averaging (torch's
-- torch.distributed.algorithms.ddp_comm_hooks and model_averaging).
--
--   local hooks = crun.comm_hooks
--   ddp:register_comm_hook(nil, hooks.fp16_compress_hook)       -- state: a group or nil
--   local st = hooks.PowerSGDState(nil, {matrix_approximation_rank = 2, start_powerSGD_iter = 10})
--   ddp:register_comm_hook(st, hooks.powerSGD_hook)
--
-- A hook is hook(state, bucket) -> future. `bucket` is a GradBucket: buffer()
-- (the flat gradient tensor of the bucket, this rank's values), index()
-- (0-based, launch order), is_last(), gradients() and parameters() (the
-- bucket's entries, gradients() being views of buffer()). The future (a
-- crun.Future, a crun.Work, or anything with wait()) must yield a tensor of
-- the buffer's numel: the bucket's reduced gradient. The hooks of an
-- iteration are called in bucket order, the same on every rank, during
-- backward as buckets fill; DDP waits for their futures in that order before
-- backward returns. A hook that communicates must leave the average (not the
-- sum) in the result, as the built-ins do.
local M = {}

local function dist() return require "crun.dist" end
local function T() return require "crun.tensor" end
local function fail(...) require("crun.opts").fail(...) end

local function group_opts(g) return g and {group = g} or nil end
local function world_of(g) return dist().get_world_size(g) end

-- ---------------------------------------------------------------- GradBucket

local GradBucket = {}
GradBucket.__index = GradBucket
GradBucket.__name = "crun.GradBucket"

--- Internal: the GradBucket of DDP bucket k (1-based) of `ddp`.
function M._bucket(ddp, k)
  local b = ddp.buckets[k]
  return setmetatable({ddp = ddp, k = k, buf = b.buffer, entries = b.entries}, GradBucket)
end

function GradBucket:buffer() return self.buf end
function GradBucket:index() return self.k - 1 end
function GradBucket:is_last() return self.k == #self.ddp.buckets end
--- set_buffer(t): replaces the bucket's values with t's (same numel).
function GradBucket:set_buffer(t) self.buf:copy(t:view(self.buf:numel())) end
function GradBucket:gradients()
  local out = {}
  for j, e in ipairs(self.entries) do out[j] = self.ddp.reducer:bucket_view(e.param) end
  return out
end
function GradBucket:parameters()
  local out = {}
  for j, e in ipairs(self.entries) do out[j] = self.ddp.params[e.param] end
  return out
end
GradBucket.__tostring = function(b)
  return string.format("crun.GradBucket(%d: %d elements, %d gradients)", b.k - 1, b.buf:numel(), #b.entries)
end

-- A future already holding `v`.
local function done_future(v)
  return require("crun.future").completed(v)
end

-- ---------------------------------------------------------------- default hooks

--- allreduce_hook(group, bucket): the bucket divided by the world size and
-- summed over the group (what DDP does without a hook), asynchronously.
function M.allreduce_hook(group, bucket)
  local buf = bucket:buffer()
  buf:div_(world_of(group))
  local o = group_opts(group) or {}
  o.async_op = true
  return dist().all_reduce(buf, "sum", o):get_future():then_(function() return buf end)
end

-- Compressing all_reduce: the bucket divided (in its own dtype: crun has no
-- half-precision arithmetic, and dividing before rounding loses less),
-- converted to `dtype`, summed, then written back into the bucket.
local function compress_hook(dtype, group, bucket)
  local buf = bucket:buffer()
  local c = buf:div_(world_of(group)):to(dtype)
  local o = group_opts(group) or {}
  o.async_op = true
  return dist().all_reduce(c, "sum", o):get_future():then_(function() return buf:copy(c) end)
end

--- fp16_compress_hook(group, bucket): all_reduce in float16 (half the
-- bytes), the result converted back to the bucket's dtype.
function M.fp16_compress_hook(group, bucket) return compress_hook("float16", group, bucket) end

--- bf16_compress_hook(group, bucket): as fp16_compress_hook in bfloat16.
function M.bf16_compress_hook(group, bucket) return compress_hook("bfloat16", group, bucket) end

-- ---------------------------------------------------------------- PowerSGD

local POWERSGD_OPTS = require("crun.opts").spec{"matrix_approximation_rank", "start_powerSGD_iter",
  "min_compression_rate", "use_error_feedback", "warm_start", "orthogonalization_epsilon", "random_seed",
  inert = {batch_tensors_with_same_shape = "crun compresses each matrix on its own",
    compression_stats_logging_frequency = "crun logs no compression statistics"}}

--- PowerSGDState(group, {matrix_approximation_rank=1, start_powerSGD_iter=1000,
-- min_compression_rate=2, use_error_feedback=true, warm_start=true,
-- orthogonalization_epsilon=0, random_seed=0}): torch's PowerSGD state.
-- Before iteration start_powerSGD_iter the hook is the plain allreduce_hook
-- (torch counts iterations the same way: once per backward).
function M.PowerSGDState(group, opts)
  opts = require("crun.opts").check(POWERSGD_OPTS, "PowerSGDState", opts)
  local r = opts.matrix_approximation_rank or 1
  if math.type(r) ~= "integer" or r < 1 then
    fail("EINVAL: PowerSGDState: matrix_approximation_rank must be an integer >= 1, got %s", tostring(r))
  end
  local O, fn = require "crun.opts", "PowerSGDState"
  return {process_group = group, rank = r, start_iter = O.int(fn, "start_powerSGD_iter", opts.start_powerSGD_iter, 0, 1000),
    min_rate = O.num(fn, "min_compression_rate", opts.min_compression_rate, 0, 2),
    error_feedback = O.bool(fn, "use_error_feedback", opts.use_error_feedback, true),
    warm_start = O.bool(fn, "warm_start", opts.warm_start, true),
    eps = O.num(fn, "orthogonalization_epsilon", opts.orthogonalization_epsilon, 0, 0),
    seed = O.int(fn, "random_seed", opts.random_seed, nil, 0), iter = 0, errors = {}, ps = {}, qs = {}, draws = 0}
end

-- torch's rule: compress an n x m matrix only when (n + m) * r * rate < n * m.
local function worth_compressing(n, m, r, rate) return (n + m) * r * rate < n * m end

-- Gram-Schmidt on the columns of p (n x r), in place.
local function orthogonalize(p, eps)
  local r = p:size()[2]
  for i = 1, r do
    local col = p:narrow(2, i, 1)
    local norm = math.sqrt((col * col):sum())
    col:div_(eps > 0 and norm + eps or norm)
    for j = i + 1, r do
      local other = p:narrow(2, j, 1)
      other:sub_(col * (col * other):sum())
    end
  end
end

-- Splits the bucket's gradients into matrices to compress and the rest.
local function split(state, bucket)
  local mats, rest, rest_n = {}, {}, 0
  for _, g in ipairs(bucket:gradients()) do
    local s = g:size()
    local n = s[1]
    local m = #s >= 2 and g:numel() // n or 1
    if #s >= 2 and worth_compressing(n, m, math.min(n, m, state.rank), state.min_rate) then
      mats[#mats + 1] = {t = g:view(n, m), n = n, m = m, r = math.min(n, m, state.rank)}
    else
      rest[#rest + 1] = g
      rest_n = rest_n + g:numel()
    end
  end
  return mats, rest, rest_n
end

-- The P and Q matrices of bucket k (kept across iterations with warm_start).
local function factors(state, k, mats, dtype)
  local ps, qs = state.ps[k], state.qs[k]
  if ps and #ps == #mats and state.warm_start then return ps, qs end
  ps, qs = {}, {}
  for j, mt in ipairs(mats) do
    ps[j] = T().zeros({mt.n, mt.r}, dtype)
    state.draws = state.draws + 1
    -- the same seed on every rank: the ranks start from the same Q
    qs[j] = T().randn({mt.m, mt.r}, {seed = state.seed * 1000003 + state.draws, dtype = dtype})
  end
  state.ps[k], state.qs[k] = ps, qs
  return ps, qs
end

-- One flat tensor holding the list's values (or its views' storage order).
local function pack(list, n, dtype)
  local flat, off = T().zeros({math.max(n, 1)}, dtype), 0
  for _, t in ipairs(list) do
    flat:narrow(1, off + 1, t:numel()):copy(t:contiguous():view(t:numel()))
    off = off + t:numel()
  end
  return flat
end

local function unpack_into(flat, list)
  local off = 0
  for _, t in ipairs(list) do
    t:copy(flat:narrow(1, off + 1, t:numel()):view(table.unpack(t:size())))
    off = off + t:numel()
  end
end

-- Packs P or Q factors into one flat tensor for a single all_reduce.
local function pack_factors(fs, dtype)
  local n = 0
  for _, f in ipairs(fs) do n = n + f:numel() end
  return pack(fs, n, dtype), n
end

--- powerSGD_hook(state, bucket): torch's PowerSGD (Vogels et al. 2019).
-- Each gradient matrix M (n x m, worth compressing) is approximated as P Q^T
-- of rank r: P = M Q summed over the group and orthogonalised, Q = M^T P
-- averaged, M <- P Q^T; vectors and small matrices are averaged as they
-- are. With error feedback the part of each rank's gradient the
-- approximation lost is added to its next gradient; with warm start Q is
-- reused from the previous iteration. Communicates 3 all_reduces per bucket.
function M.powerSGD_hook(state, bucket)
  if state.iter < state.start_iter then
    if bucket:is_last() then state.iter = state.iter + 1 end
    return M.allreduce_hook(state.process_group, bucket)
  end
  local g, world = state.process_group, world_of(state.process_group)
  local o = group_opts(g) or {}
  o.async_op = true
  local buf, k = bucket:buffer(), bucket:index()
  local dtype = buf:dtype()
  if state.error_feedback then
    if state.errors[k] and state.errors[k]:numel() == buf:numel() then buf:add_(state.errors[k])
    else state.errors[k] = T().zeros({buf:numel()}, dtype) end
  end
  local before = state.error_feedback and buf:clone() or nil
  local mats, rest, rest_n = split(state, bucket)
  local flat_rest = pack(rest, rest_n, dtype):div_(world)
  local w_rest = dist().all_reduce(flat_rest, "sum", o)
  local ps, qs = factors(state, k, mats, dtype)
  for j, mt in ipairs(mats) do ps[j]:copy(T().matmul(mt.t, qs[j])) end
  local flat_p = pack_factors(ps, dtype)
  local w_p = dist().all_reduce(flat_p, "sum", o)
  local fut = require("crun.future").new(w_p)
  return fut:then_(function()
    w_rest:wait()
    unpack_into(flat_rest, rest)
    unpack_into(flat_p, ps)
    for _, p in ipairs(ps) do orthogonalize(p, state.eps) end
    for j, mt in ipairs(mats) do qs[j]:copy(T().matmul(mt.t:t(), ps[j])) end
    local flat_q = pack_factors(qs, dtype)
    if #mats > 0 then dist().all_reduce(flat_q, "sum", group_opts(g)) end
    flat_q:div_(world)
    unpack_into(flat_q, qs)
    for j, mt in ipairs(mats) do mt.t:copy(T().matmul(ps[j], qs[j]:t())) end
    if before then state.errors[k]:copy(before:sub_(buf)) end
    if not state.warm_start then state.ps[k], state.qs[k] = nil, nil end
    if bucket:is_last() then state.iter = state.iter + 1 end
    return buf
  end)
end

-- ---------------------------------------------------------------- local SGD

local POSTLOCAL_OPTS = require("crun.opts").spec{"post_local_gradient_allreduce"}

--- PostLocalSGDState(group, subgroup, start_localSGD_iter, {post_local_gradient_allreduce=true}):
-- before start_localSGD_iter the hook averages over `group` (nil: the
-- world); after it only over `subgroup` (or not at all). subgroup nil:
-- crun.dist.new_subgroups() is called here (a collective: every rank of the
-- world must construct the state).
function M.PostLocalSGDState(group, subgroup, start_iter, opts)
  if math.type(start_iter) ~= "integer" or start_iter < 0 then
    fail("EINVAL: PostLocalSGDState: start_localSGD_iter must be an integer >= 0, got %s", tostring(start_iter))
  end
  opts = require("crun.opts").check(POSTLOCAL_OPTS, "PostLocalSGDState", opts)
  local post = require("crun.opts").bool("PostLocalSGDState", "post_local_gradient_allreduce",
    opts.post_local_gradient_allreduce, true)
  if subgroup == nil then subgroup = dist().new_subgroups() end
  return {process_group = group, subgroup = subgroup, start_iter = start_iter, iter = 0, post_allreduce = post}
end

--- post_localSGD_hook(state, bucket): global all_reduce until
-- start_localSGD_iter, then the subgroup's (or none). Pair it with a
-- PeriodicModelAverager after each optimizer step.
function M.post_localSGD_hook(state, bucket)
  local global = state.iter < state.start_iter
  if bucket:is_last() then state.iter = state.iter + 1 end
  if global then return M.allreduce_hook(state.process_group, bucket) end
  if state.post_allreduce then return M.allreduce_hook(state.subgroup, bucket) end
  return done_future(bucket:buffer())
end

-- ---------------------------------------------------------------- model averaging

local Averager = {}
Averager.__index = Averager
Averager.__name = "crun.PeriodicModelAverager"

local AVG_OPTS = require("crun.opts").spec{"period", "warmup_steps", "process_group", aliases = {group = "process_group"}}

--- PeriodicModelAverager({period=, warmup_steps=0, process_group=nil}):
-- average_parameters(params) averages the parameters over the group every
-- `period` calls once warmup_steps calls have passed (torch's rule: at
-- steps s >= warmup with (s - warmup) % period == 0), one coalesced
-- all_reduce per dtype. Blocks while it averages.
function M.PeriodicModelAverager(opts)
  opts = require("crun.opts").check(AVG_OPTS, "PeriodicModelAverager", opts)
  local period, warm = opts.period, opts.warmup_steps or 0
  if math.type(period) ~= "integer" or period < 1 then
    fail("EINVAL: PeriodicModelAverager: period must be an integer >= 1, got %s", tostring(period))
  end
  if math.type(warm) ~= "integer" or warm < 0 then
    fail("EINVAL: PeriodicModelAverager: warmup_steps must be an integer >= 0, got %s", tostring(warm))
  end
  return setmetatable({period = period, warmup_steps = warm, group = opts.process_group, step = 0}, Averager)
end

--- average_parameters(params): see PeriodicModelAverager; params is a list of tensors.
function Averager:average_parameters(params)
  if self.step >= self.warmup_steps and (self.step - self.warmup_steps) % self.period == 0 then
    M.average_parameters(params, self.group)
  end
  self.step = self.step + 1
end

--- average_parameters(params, group): every tensor of the list replaced by
-- its average over the group (one all_reduce per dtype). Blocks.
function M.average_parameters(params, group)
  local by_dtype, order = {}, {}
  for _, p in ipairs(params) do
    local d = p:dtype()
    if not by_dtype[d] then by_dtype[d] = {n = 0}; order[#order + 1] = d end
    local l = by_dtype[d]
    l[#l + 1] = p
    l.n = l.n + p:numel()
  end
  local world = world_of(group)
  for _, d in ipairs(order) do
    local l = by_dtype[d]
    local flat = pack(l, l.n, d):div_(world)
    dist().all_reduce(flat, "sum", group_opts(group))
    unpack_into(flat, l)
  end
end

return M
