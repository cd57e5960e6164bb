--- crun.ddp: DistributedDataParallel and Join for crun.nn modules.
--
--   local model = crun.DDP(net, {bucket_cap_mb=25, first_bucket_mb=1})
--   local out = model:forward(x)
--   model:backward(x, crit:backward(out, y))   -- all-reduces (averages) grads
--   opt:step()
--
-- At wrap time every parameter (and with broadcast_buffers every buffer) is
-- broadcast from rank 0. Parameters are
-- grouped into buckets in REVERSE registration order (the order backward
-- produces their gradients): the first bucket holds at most first_bucket_mb,
-- the others bucket_cap_mb, and a bucket never mixes dtypes. During backward,
-- each leaf module reports when its gradients are final (nn add_grad_hook;
-- a leaf used k times, as with tied weights, after its k-th backward call);
-- when every gradient of a bucket is ready and every earlier bucket has been
-- launched, the bucket's async all_reduce (op avg) starts, so communication
-- overlaps the rest of backward. Buckets launch in the same order on every
-- rank. The bucketing, readiness and all_reduces are libcrunrt's reducer
-- (crun_reducer_*, runtime/train/reducer.c, a crun.Reducer here); this
-- module drives it from the grad hooks. backward() returns once every bucket is reduced and copied back into
-- the gradients (gradient_as_bucket_view=true makes the gradients views of
-- the buckets instead: no copies). ddp:no_sync(fn) runs fn with gradient
-- synchronisation off (gradients accumulate locally; the next synced
-- backward all-reduces the accumulated sum; as torch, what counts is where
-- the forward ran).
--
-- Join (uneven inputs): crun.join({ddp}, fn) runs fn (the rank's own loop).
-- While some rank still trains, each forward (training or evaluation)
-- all-reduces a small "still active" tensor that also says whether a
-- synchronised backward follows (a backward after an evaluation-mode forward
-- announces itself the same way first); ranks that finished shadow that all-reduce, the
-- forwards' buffer broadcasts (broadcast_buffers: from the highest rank still
-- training once some rank finished, torch's authoritative rank) and the
-- gradient all-reduces with zeros, so nobody hangs. Gradients are still
-- divided by the full world size (torch's divide_by_initial_world_size).
-- At the end, the parameters (and with broadcast_buffers the buffers) of the
-- rank that trained the most iterations (the highest such rank on ties) are
-- broadcast to every rank.
local ddp = {}

-- crun.tensor (falls back to the raw bindings while tensor.lua is absent).
local function T()
  local ok, t = pcall(require, "crun.tensor")
  return ok and t or require("crun.core").tensor
end
local function dist() return require "crun.dist" end

local ELSIZE = {float32 = 4, float64 = 8, float16 = 2, bfloat16 = 2}

local DDP = {}
DDP.__index = DDP
DDP.__call = function(self, x) return self:forward(x) end -- torch's ddp_model(x)
DDP.__name = "crun.DDP"

-- Checks that every parameter has a dtype DDP can average.
local function check_dtypes(params, level)
  for i, p in ipairs(params) do
    if not ELSIZE[p:dtype()] then
      require("crun.opts").fail("ENOTSUP: DDP: parameter %d has dtype %s (DDP averages float32, float64, float16 "
        .. "and bfloat16)", i, p:dtype())
    end
  end
end

-- A crun.Reducer over `grads` on group `pg` (nil: layout only).
local function new_reducer(pg, grads, first_cap, cap, o)
  return require("crun.core").reducer_new(pg, grads, {first_bucket_bytes = first_cap, bucket_cap_bytes = cap,
    gradient_as_bucket_view = o and o.as_view, overlap = not o or o.overlap, external = o and o.external})
end

-- The bucket layout over params (reverse registration order, caps, dtypes),
-- as the reducer builds it: {dtype=, numel=, entries={{param=, offset=, numel=}}}.
local function make_buckets(params, first_cap, cap)
  check_dtypes(params, 2)
  local r = new_reducer(nil, params, first_cap, cap)
  local b = r:buckets()
  r:close()
  for _, bk in ipairs(b) do bk.buffer = nil end
  return b
end

--- DDP(module, {bucket_cap_mb=25, first_bucket_mb=1, broadcast_buffers=true,
-- gradient_as_bucket_view=false, group=nil, overlap=true}). torch's
-- process_group is accepted for group; find_unused_parameters, static_graph,
-- device_ids, output_device, dim, check_reduction and mixed_precision are
-- accepted and reported once on rank 0 as having no effect; any other key is
-- EINVAL. Blocks until
-- rank 0's parameters have been broadcast to every rank of the group. A
-- fault of the arguments on one rank alone fails every rank's DDP naming it
-- (crun.dist._setup); the same fault on every rank leaves the group usable.
-- overlap=false launches every all_reduce only after backward (for
-- measuring how much overlap hides).
local DDP_OPTS = require("crun.opts").spec{"bucket_cap_mb", "first_bucket_mb", "broadcast_buffers",
  "gradient_as_bucket_view", "group", "overlap",
  aliases = {process_group = "group"},
  inert = {
    find_unused_parameters = "every parameter's gradient is reduced every step; an unused one contributes zeros",
    static_graph = "the reducer needs no graph hint",
    device_ids = "crun's DDP runs where the module's tensors are",
    output_device = "crun's DDP runs where the module's tensors are",
    dim = "crun's DDP does not scatter inputs",
    check_reduction = "deprecated in torch as well",
    mixed_precision = "not supported yet",
  }}

-- EINVAL for an FSDP model (it reduces its own gradients) and for the
-- module one wraps (its parameters are empty while sharded: DDP over them
-- would train nothing).
local function check_not_fsdp(module)
  local O = require "crun.opts"
  if getmetatable(module) == require("crun.fsdp").FSDPClass then
    O.fail("EINVAL: DDP: an FSDP model is already data parallel (it averages its gradients itself)")
  end
  if rawget(module, "_sharded_by") then
    O.fail("EINVAL: DDP: the module's parameters are sharded by %s: train the FSDP model it returned, not the module "
      .. "it wraps", module._sharded_by)
  end
end

-- DDP's checks of its arguments and its local setup, before any collective:
-- the new model, its parameters indexed.
local function prepare(module, opts)
  if dist()._group_arg then dist()._group_arg("DDP", opts) end
  opts = require("crun.opts").check(DDP_OPTS, "DDP", opts)
  if type(module) ~= "table" or type(module.parameters) ~= "function" then
    require("crun.opts").fail("EINVAL: DDP: a crun.nn module is expected, got %s", type(module))
  end
  check_not_fsdp(module)
  local d = dist()
  if not d.is_initialized() then
    require("crun.opts").fail("ESTATE: DDP needs a process group: call crun.dist.init_process_group() first")
  end
  for _, k in ipairs{"bucket_cap_mb", "first_bucket_mb"} do
    if opts[k] ~= nil and (type(opts[k]) ~= "number" or not (opts[k] > 0 and opts[k] < math.huge)) then
      require("crun.opts").fail("EINVAL: DDP: %s must be a positive number, got %s%s", k,
        type(opts[k]) == "number" and "" or type(opts[k]) .. " ", tostring(opts[k]))
    end
  end
  for _, k in ipairs{"broadcast_buffers", "gradient_as_bucket_view", "overlap"} do
    if opts[k] ~= nil then require("crun.opts").bool("DDP", k, opts[k]) end
  end
  if opts.group ~= nil and d.get_rank(opts.group) < 0 then
    require("crun.opts").fail("EINVAL: DDP: this rank is not a member of the group")
  end
  local self = setmetatable({module = module, group = opts.group, require_sync = true,
    overlap = opts.overlap ~= false, broadcast_buffers = opts.broadcast_buffers ~= false,
    as_view = opts.gradient_as_bucket_view == true,
    stats = {steps = 0, comm_wait_s = 0, backward_s = 0}}, DDP)
  self.copts = self.group and {group = self.group} or nil
  self.opts_first_cap = (opts.first_bucket_mb or 1) * 1024 * 1024
  self.opts_cap = (opts.bucket_cap_mb or 25) * 1024 * 1024
  self.world = d.get_world_size(self.group)
  self.rank = d.get_rank(self.group)
  self.params, self.grads = module:parameters()
  check_dtypes(self.params, 2)
  self:_index_params()
  return self, opts
end

function ddp.DDP(module, opts)
  local d = dist()
  local setup = d._setup or function(_, _, f, ...) return f(...) end -- (a stand-in crun.dist has none)
  local self
  self, opts = setup("all_gather", opts, prepare, module, opts) -- before _verify_params's all_gather
  self:_verify_params()
  self:_sync_params(0)
  if self.broadcast_buffers then self:_sync_buffers(0) end
  local mb = 1024 * 1024
  -- the group's handle (absent when crun.dist is a stand-in: layout only)
  local pg = self.group or (d.group and d.group()) or nil
  self.pg = pg
  self.reducer = new_reducer(pg, self.grads, (opts.first_bucket_mb or 1) * mb, (opts.bucket_cap_mb or 25) * mb, self)
  self.buckets = self.reducer:buckets()
  if self.as_view then self:_make_grad_views() end
  self:_install_hooks()
  return self
end

-- Maps each leaf module to its parameter indices and each parameter to its
-- leaf.
function DDP:_index_params()
  self.leaf_params, self.owner = {}, {}
  local k = 0
  for _, leaf in ipairs(self.module:leaves()) do
    local lp = leaf:parameters()
    local list = {}
    for j = 1, #lp do
      k = k + 1
      list[j] = k
      self.owner[k] = {leaf = leaf, index = j}
    end
    self.leaf_params[leaf] = list
  end
  if k ~= #self.params then
    require("crun.opts").fail("EINVAL: DDP: the module's leaves hold %d parameters but parameters() lists %d",
      k, #self.params)
  end
end

-- Checks that every rank wraps parameters of the same dtypes and shapes
-- (as torch's DDP does), naming the first difference on every rank.
function DDP:_verify_params()
  local sig = {}
  for i, p in ipairs(self.params) do sig[i] = p:dtype() .. "[" .. table.concat(p:size(), "x") .. "]" end
  local d, all = dist(), nil
  if self.copts then all = d.all_gather_object(sig, self.copts) else all = d.all_gather_object(sig) end
  for r = 2, #all do
    local other = all[r]
    for i = 1, math.max(#sig, #other) do
      if all[1][i] ~= other[i] then
        error(string.format("EMISMATCH: DDP on rank %d: parameter %d is %s on rank %d but %s on rank 0 "
          .. "(every rank must wrap the same model)", self.rank, i, tostring(other[i] or "missing"), r - 1,
          tostring(all[1][i] or "missing")), 0)
      end
    end
  end
end

-- Broadcasts every parameter from `src`, one coalesced broadcast per bucket
-- of the parameters' own layout (a scratch buffer per bucket: the reducer's
-- buckets may be the gradients).
function DDP:_sync_params(src)
  local d = dist()
  if self.group then src = d.get_global_rank(self.group, src) end -- broadcast takes a global rank
  self.param_buckets = self.param_buckets or make_buckets(self.params, self.opts_first_cap, self.opts_cap)
  for _, b in ipairs(self.param_buckets) do
    local buf = T().zeros({b.numel}, b.dtype, {device = self.params[b.entries[1].param]:device()})
    for _, e in ipairs(b.entries) do
      buf:narrow(1, e.offset + 1, e.numel):copy(self.params[e.param]:contiguous():view(e.numel))
    end
    d.broadcast(buf, src, self.copts)
    for _, e in ipairs(b.entries) do
      self.params[e.param]:view(e.numel):copy(buf:narrow(1, e.offset + 1, e.numel))
    end
  end
end

-- Broadcasts the module's buffers (BatchNorm's running statistics) from
-- group rank `src` (broadcast takes a global rank).
function DDP:_sync_buffers(src)
  local bufs = self.module.buffers and self.module:buffers() or {}
  if #bufs == 0 then return end
  local d = dist()
  if self.group then src = d.get_global_rank(self.group, src) end
  for _, buf in ipairs(bufs) do d.broadcast(buf, src, self.copts) end
end

-- gradient_as_bucket_view: the module's gradients become the views of the
-- buckets the reducer made (holding their values).
function DDP:_make_grad_views()
  for i = 1, #self.params do
    local v = self.reducer:bucket_view(i)
    local o = self.owner[i]
    o.leaf:_set_grad(o.index, v)
    self.grads[i] = v
  end
end

-- A leaf used twice (weight tying, Sequential(l, act, l)), or called k times
-- by a container of the user's (an unrolled cell), runs its backward as many
-- times per backward pass and accumulates: its gradients are final only after
-- the last. DDP:forward counts each leaf's calls of the pass (fwd_calls); a
-- backward without a DDP forward uses how often the leaf appears in the
-- module tree (Module:leaves counts the uses).
function DDP:_install_hooks()
  self.hooks, self.leaf_seen, self.param_leaves = {}, {}, {}
  local uses = {}
  self.module:leaves(nil, uses)
  for leaf, list in pairs(self.leaf_params) do
    if #list > 0 then
      local need = uses[leaf] or 1
      self.param_leaves[#self.param_leaves + 1] = leaf
      self.hooks[#self.hooks + 1] = leaf:add_grad_hook(function() self:_leaf_ready(leaf, list, need) end)
    end
  end
end

-- Runs the wrapped module's forward with each leaf that has parameters
-- counting its calls (a forward of its own, on the instance, for the call
-- only); returns the output and the counts.
function DDP:_counted_forward(x)
  local calls, saved = {}, {}
  for i, leaf in ipairs(self.param_leaves) do
    local own = rawget(leaf, "forward")
    local f = own or leaf.forward
    saved[i] = own or false
    rawset(leaf, "forward", function(m, ...)
      calls[m] = (calls[m] or 0) + 1
      return f(m, ...)
    end)
  end
  local ok, out = pcall(self.module.forward, self.module, x)
  for i, leaf in ipairs(self.param_leaves) do rawset(leaf, "forward", saved[i] or nil) end
  if not ok then error(out, 0) end
  return out, calls
end

-- Hook: `leaf` finished one of its backward calls of this pass (as many as
-- its forward calls, else `need`); after the last, every gradient of `list`
-- is final. (One the pass never reaches as often is marked ready by the
-- reducer's finalize, with unused ones.)
function DDP:_leaf_ready(leaf, list, need)
  if not self.in_sync or not self.in_backward or (self.world == 1 and not self.comm_hook) then return end
  need = self.fwd_calls and self.fwd_calls[leaf] or need
  if need > 1 then
    local n = (self.leaf_seen[leaf] or 0) + 1
    self.leaf_seen[leaf] = n
    if n < need then return end
  end
  for _, i in ipairs(list) do self.reducer:mark_ready(i) end
  if self.comm_hook then self:_run_hooks() end
end

--- register_comm_hook(state, hook): from the next backward on, every bucket
-- is reduced by hook(state, bucket) instead of the built-in average (see
-- crun.comm_hooks for the contract and torch's built-in hooks). Once per
-- DDP, before the first backward (as torch). Hooks run even on one rank.
function DDP:register_comm_hook(state, hook)
  self:_check_open("register_comm_hook")
  if type(hook) ~= "function" then
    require("crun.opts").fail("EINVAL: DDP:register_comm_hook: a function hook(state, bucket) is expected, got %s",
      type(hook))
  end
  if self.comm_hook then
    require("crun.opts").fail("ESTATE: DDP:register_comm_hook on rank %d: a hook is already registered (once per DDP)",
      self.rank)
  end
  if self.stats.steps > 0 then
    require("crun.opts").fail("ESTATE: DDP:register_comm_hook on rank %d: call it before the first backward",
      self.rank)
  end
  self.reducer:close()
  self.reducer = new_reducer(self.pg, self.grads, self.opts_first_cap, self.opts_cap,
    {as_view = self.as_view, overlap = true, external = true})
  self.buckets = self.reducer:buckets()
  if self.as_view then self:_make_grad_views() end
  local hooks = require "crun.comm_hooks"
  self.grad_buckets = {}
  for k = 1, #self.buckets do self.grad_buckets[k] = hooks._bucket(self, k) end
  self.comm_hook, self.hook_state, self.hook_futures = hook, state, {}
end

-- Calls the hook on every bucket the reducer hands out (in bucket order).
function DDP:_run_hooks()
  while true do
    local k = self.reducer:next_ready()
    if not k then return end
    local fut = self.comm_hook(self.hook_state, self.grad_buckets[k])
    if type(fut) ~= "table" and type(fut) ~= "userdata" or not fut.wait then
      require("crun.opts").fail("EINVAL: DDP comm hook on rank %d: bucket %d: the hook returned %s, a future is "
        .. "expected", self.rank, k - 1, type(fut))
    end
    self.hook_futures[k] = fut
  end
end

-- Waits for bucket k's future and leaves its tensor in the bucket.
function DDP:_hook_result(k)
  local fut = self.hook_futures[k]
  self.hook_futures[k] = nil
  local v = fut:wait()
  if type(v) == "table" and getmetatable(v) == nil then v = v[1] end
  local buf = self.grad_buckets[k]:buffer()
  if rawequal(v, buf) then return end
  if not T().is_tensor(v) or v:numel() ~= buf:numel() then
    require("crun.opts").fail("EINVAL: DDP comm hook on rank %d: bucket %d's future gave %s; a tensor of %d "
      .. "elements is expected", self.rank, k - 1, T().is_tensor(v) and (v:numel() .. " elements") or type(v),
      buf:numel())
  end
  buf:copy(v:contiguous():view(buf:numel()))
end

-- With a hook: marks the rest, runs the hooks left, waits in bucket order,
-- then the reducer copies the buckets back into the gradients.
function DDP:_finalize_hooked()
  local ok, err = pcall(function()
    self.reducer:mark_rest()
    self:_run_hooks()
    for k = 1, #self.buckets do self:_hook_result(k) end
    self.reducer:finish()
  end)
  if not ok then
    self.hook_futures = {}
    self.reducer:reset()
    error(err, 0)
  end
end

-- Marks unused parameters ready, launches what is left, waits for every
-- bucket and copies the averaged gradients back (the reducer does it all).
function DDP:_finalize()
  local core = require "crun.core"
  self.stats.launched_in_backward = self.reducer:launched()
  local t0 = core.clock()
  if self.comm_hook then self:_finalize_hooked() else self.reducer:finalize() end
  self.stats.comm_wait_s = self.stats.comm_wait_s + (core.clock() - t0)
end

--- Forward of the wrapped module. Under crun.join it first tells ranks that
-- already finished that this rank still runs (in training or evaluation: the
-- buffers' broadcast is replayed either way), and whether a synchronised
-- backward follows (in training, outside no_sync).
function DDP:forward(x)
  self:_check_open("forward")
  self.pass_sync = self.require_sync -- torch reads no_sync at forward
  if self.join_enabled and self.join_lead then self:_notify_join(self.pass_sync and self.module.training) end
  if self.broadcast_buffers then self:_sync_buffers(self.join_enabled and self.join_ctx.src or 0) end
  self.output, self.fwd_calls = self:_counted_forward(x)
  return self.output
end

--- Backward of the wrapped module; with synchronisation on, returns after
-- every gradient is averaged over the group (blocking).
function DDP:backward(x, gy)
  self:_check_open("backward")
  local core = require "crun.core"
  local t0 = core.clock()
  -- synchronised when the forward ran outside no_sync (as torch); a
  -- backward without a DDP forward reads the flag now
  local sync = self.pass_sync
  if sync == nil then sync = self.require_sync end
  -- a synchronised backward that joined ranks were not told of at forward
  -- (after a forward in evaluation mode): they are told now, before its all_reduces
  if sync and self.join_enabled and not self.join_ctx.told_sync then self:_notify_join(true, self.join_index) end
  self.in_backward, self.in_sync, self.leaf_seen = true, sync, {}
  local ok, err = pcall(self.module.backward, self.module, x, gy)
  self.in_backward = false
  if not ok then
    if sync and (self.world > 1 or self.comm_hook) then
      self.reducer:reset()
      self.hook_futures = {}
    end
    error(err, 0)
  end
  if sync then
    if self.join_enabled then self.join_iters = self.join_iters + 1 end
    -- one rank: the average is the gradient itself, nothing to communicate
    -- (a hook still runs: it may compress)
    if self.world > 1 or self.comm_hook then self:_finalize() end
    self.stats.steps = self.stats.steps + 1
  end
  self.stats.backward_s = self.stats.backward_s + (core.clock() - t0)
  self.gradInput = self.module.gradInput
  return self.gradInput
end

--- Runs fn() with gradient synchronisation off (gradient accumulation);
-- returns fn's results. As torch's no_sync context manager, the flag is read
-- at forward: the backward of a forward run inside fn does not synchronise,
-- even when called after fn returned, and that of a forward run outside fn
-- does, even when called inside it.
function DDP:no_sync(fn)
  if type(fn) ~= "function" then
    require("crun.opts").fail("EINVAL: DDP:no_sync: a function is expected (crun's form of torch's `with "
      .. "ddp.no_sync():` is ddp:no_sync(function() ... end)), got %s", type(fn))
  end
  local prev = self.require_sync
  self.require_sync = false
  local res = table.pack(pcall(fn))
  self.require_sync = prev
  if not res[1] then error(res[2], 0) end
  return table.unpack(res, 2, res.n)
end

function DDP:parameters() return self.module:parameters() end
--- named_parameters / named_buffers: the module's, under "module." as torch's DDP names them.
function DDP:named_parameters(prefix) return self.module:named_parameters((prefix or "") .. "module.") end
function DDP:named_buffers(prefix) return self.module:named_buffers((prefix or "") .. "module.") end
function DDP:zero_grad(set_to_none)
  require("crun.opts").zero_grad_arg("DDP:zero_grad", set_to_none)
  return self.module:zero_grad()
end
function DDP:train(mode) self.module:train(mode); return self end
function DDP:evaluate() self.module:evaluate(); return self end
DDP.eval = DDP.evaluate
-- A keyed state dict of a DDP model names its entries "module.<name>", as
-- torch's DDP does (the wrapped module's are under self.module).
local function under_module(opts)
  if type(opts) ~= "table" then return opts end
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  if opts.prefix == nil or type(opts.prefix) == "string" then o.prefix = "module." .. (opts.prefix or "") end
  return o
end

--- state_dict([opts]) / load_state_dict(sd[, opts]): the module's (Module:state_dict);
-- keyed by names, each name starts with "module.", as torch's DDP state dicts.
function DDP:state_dict(opts)
  return self.module:state_dict(type(opts) == "table" and opts.keyed and under_module(opts) or opts)
end
function DDP:load_state_dict(sd, opts)
  local keyed = require("crun.nn").state_dict_key(sd) ~= nil
  return self.module:load_state_dict(sd, keyed and under_module(opts or {}) or opts)
end

--- Removes the hooks; the module keeps working on its own, the DDP object
-- raises ECLOSED if used again.
function DDP:close()
  for _, h in ipairs(self.hooks or {}) do h.remove() end
  self.hooks, self.closed = {}, true
  if self.reducer then self.reducer:close() end
end

function DDP:_check_open(what)
  if self.closed then error(string.format("ECLOSED: DDP:%s on rank %d: this DDP was closed", what, self.rank), 0) end
end

function DDP:__tostring()
  return string.format("crun.DDP(%d params in %d buckets, world %d)", #self.params, #self.buckets, self.world)
end

-- ---------------------------------------------------------------- Join

-- Active rank, each forward of the first model: [1, sync, 0, 0] summed over
-- the group (sync: a synchronised backward follows); the third entry counts
-- joined ranks asking everyone to stop. backward_of = k: instead, model k's
-- synchronised backward follows a forward that said it would not ([1, 1, 0, k]).
function DDP:_notify_join(sync, backward_of)
  local t = T().zeros({4}, "float64")
  t[1], t[2], t[4] = 1, sync and 1 or 0, backward_of or 0
  dist().all_reduce(t, "sum", self.copts)
  if t[3] > 0 then
    error(string.format("EINTR: join on rank %d: %d rank(s) ran out of inputs (throw_on_early_termination)",
      self.rank, math.tointeger(t[3])), 0)
  end
  if backward_of then return end
  self.join_ctx.told_sync = sync
  self.join_ctx.src = self:_buffer_source(t[1], self.rank)
end

-- Under join, the group rank whose buffers this iteration's forwards
-- broadcast: 0 while every rank trains, else the highest rank still
-- training (torch's authoritative rank; one all_reduce max, in which a
-- joined rank offers -1). `active`: the number of ranks still training.
function DDP:_buffer_source(active, offer)
  if active >= self.world or not self.join_ctx.buffers then return 0 end
  local t = T().zeros({1}, "float64")
  t[1] = offer
  dist().all_reduce(t, "max", self.copts)
  return math.tointeger(t[1])
end

-- Joined rank: mirrors one iteration of the ranks still training.
-- (the reducer all-reduces zeros in every bucket, in bucket order)
function DDP:_shadow(sync)
  if sync == 0 then return end
  if not self.comm_hook then return self.reducer:shadow() end
  -- with a hook, the hook runs on zeroed buckets (as torch's join does)
  for k = 1, #self.buckets do
    self.grad_buckets[k]:buffer():zero()
    self.comm_hook(self.hook_state, self.grad_buckets[k]):wait()
  end
end

-- Shadow loop of a rank whose fn returned; then the final parameter sync.
local function join_finish(joinables, throw)
  local lead = joinables[1]
  local d = dist()
  while true do
    local t = T().zeros({4}, "float64")
    t[3] = throw and 1 or 0
    d.all_reduce(t, "sum", lead.copts)
    if t[1] == 0 then break end
    if throw then
      error(string.format("EINTR: join on rank %d: this rank ran out of inputs while %d still train "
        .. "(throw_on_early_termination)", lead.rank, math.tointeger(t[1])), 0)
    end
    if t[4] > 0 then
      -- model k's backward after a forward in evaluation mode: its all_reduces only
      local k = math.tointeger(t[4] // t[1])
      if not joinables[k] or t[4] % t[1] ~= 0 then
        error(string.format("EMISMATCH: join on rank %d: the ranks still training announced the backward of "
          .. "different models (sum of their indices %d over %d ranks)", lead.rank, math.tointeger(t[4]),
          math.tointeger(t[1])), 0)
      end
      joinables[k]:_shadow(1)
    else
      -- each model in list order: its forward's buffer broadcast, then its
      -- backward's all_reduces (torch's join hooks, in the joinables' order)
      local src = lead:_buffer_source(t[1], -1)
      for _, j in ipairs(joinables) do
        if j.broadcast_buffers then j:_sync_buffers(src) end
        j:_shadow(t[2])
      end
    end
  end
  local key = T().zeros({1}, "float64")
  key[1] = lead.join_iters * lead.world + lead.rank
  d.all_reduce(key, "max", lead.copts)
  local src = math.tointeger(key[1] % lead.world)
  for _, j in ipairs(joinables) do
    j:_sync_params(src)
    if j.broadcast_buffers then j:_sync_buffers(src) end
  end
end

--- join(joinables, fn, {throw_on_early_termination=false}): runs fn() on
-- this rank, then shadows the collectives of ranks that still train until
-- every rank is done; finally broadcasts the parameters of the rank with the
-- most iterations (and, with broadcast_buffers, its buffers). Returns fn's
-- results. With several models, each iteration must run each model's forward
-- and backward in list order (as torch's Join). With
-- throw_on_early_termination, every rank instead raises EINTR as soon as one
-- rank runs out of inputs.
local JOIN_OPTS = require("crun.opts").spec{"throw_on_early_termination"}

function ddp.join(joinables, fn, opts)
  if type(joinables) ~= "table" or type(fn) ~= "function" then
    require("crun.opts").fail("EINVAL: join: a list of DDP models and a function are expected, got %s and %s",
      type(joinables), type(fn))
  end
  opts = require("crun.opts").check(JOIN_OPTS, "join", opts)
  -- shared by the joinables: where this iteration's buffers come from, and
  -- whether the first model's last forward told joined ranks a synchronised backward follows
  local ctx = {src = 0, buffers = false, told_sync = false}
  for k, j in ipairs(joinables) do
    if getmetatable(j) ~= DDP then
      require("crun.opts").fail("EINVAL: join: entry %d of the list is a %s, a DDP model is expected", k, type(j))
    end
    -- only the first model announces "still training", once per iteration
    j.join_enabled, j.join_iters, j.join_lead, j.join_ctx, j.join_index = true, 0, k == 1, ctx, k
    ctx.buffers = ctx.buffers or (j.broadcast_buffers and #(j.module.buffers and j.module:buffers() or {}) > 0)
  end
  local res = table.pack(pcall(fn))
  local ok, err = res[1], res[2]
  if ok and joinables[1] then
    ok, err = pcall(join_finish, joinables, opts.throw_on_early_termination)
  end
  for _, j in ipairs(joinables) do j.join_enabled = false end
  if not ok then error(err, 0) end
  return table.unpack(res, 2, res.n)
end

ddp.DDPClass = DDP
-- with the timeline on, DDP's forward/backward are spans around the module's
require("crun.trace")._wrap(DDP, "forward", "DDP", "forward")
require("crun.trace")._wrap(DDP, "backward", "DDP", "backward")
ddp._make_buckets = make_buckets -- for specs
return ddp
