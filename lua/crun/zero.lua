--- crun.optim.ZeroRedundancyOptimizer: torch's ZeRO stage 1. The optimizer
-- state is partitioned across the ranks of a group; each rank steps only the
-- parameters it owns, then every parameter is broadcast from its owner.
--
--   local model = crun.DDP(net)
--   local opt = crun.optim.ZeroRedundancyOptimizer(model, crun.optim.Adam, {lr = 1e-3})
--   opt:zero_grad(); model:backward(...); opt:step()     -- gradients already averaged
--   opt:consolidate_state_dict(0)                         -- every rank (collective)
--   if rank == 0 then crun.save("opt.crun", opt:state_dict()) end
--   opt:load_state_dict(crun.load("opt.crun"))            -- every rank, any world size
--
-- Assignment (torch's rule, in C: crun_zero_assign): parameters sorted by
-- size, largest first, each to the rank with the fewest elements so far,
-- the lowest rank on ties. Each rank's wrapped optimizer (optim_class built
-- on its own parameters only) holds state for about 1/N of the elements.
--
-- After the local step, parameters are broadcast from their owners rather
-- than all_gathered from one flat buffer: the greedy shards differ in size,
-- and all_gather needs equal blocks, so each rank would pad its shard to the
-- largest one (up to one whole parameter more per rank: a 10 M-element
-- embedding on 4 ranks would quadruple the traffic). With
-- parameters_as_bucket_view=true the parameters of each owner (one buffer
-- per dtype, layout from crun_zero_offsets) are copied into one transient
-- flat buffer and broadcast in one call per owner, as torch's bucket view
-- does; with false (torch's default) each parameter is broadcast on its own,
-- all launched asynchronously, then waited for. Parameters are not made
-- views of persistent buckets (crun's modules keep their own tensors), so
-- the option changes the number of broadcasts, not the memory held.
local O = require "crun.opts"

local zero = {}

local function T() return require "crun.tensor" end
local function dist() return require "crun.dist" end
local function core() return require "crun.core" end

local Z = {}
Z.__index = require("crun.optim").index_with_groups(Z) -- its methods, and torch's param_groups
Z.__name = "crun.ZeroRedundancyOptimizer"

local OWN_KEYS = {group = true, parameters_as_bucket_view = true}
local INERT = {overlap_with_ddp = "crun's DDP has no communication hook to run the step from; "
  .. "the step runs after backward"}
local DTYPE_KEY = {float32 = 0, float64 = 1, float16 = 2, bfloat16 = 3}
-- The same dtypes in key order: anything collective walks this list, never
-- pairs(DTYPE_KEY), whose order follows each process's string-hash seed.
local DTYPES = {"float32", "float64", "float16", "bfloat16"}
local ELSIZE = {float32 = 4, float64 = 8, float16 = 2, bfloat16 = 2}

-- The crun.opts spec for ZeRO wrapping optim_class: ZeRO's own keys plus
-- the wrapped optimizer's (when optim_class is one of crun.optim's).
local function spec_for(optim_class)
  local optim = require "crun.optim"
  local t = {"group", "parameters_as_bucket_view", aliases = {process_group = "group"}, inert = {}}
  for k, why in pairs(INERT) do t.inert[k] = why end
  local known = false
  for name, keys in pairs(optim.KEYS) do
    if optim[name] == optim_class then
      for _, k in ipairs(keys) do t[#t + 1] = k end
      for k, why in pairs(optim.IMPL_INERT) do t.inert[k] = why end
      known = true
    end
  end
  return O.spec(t), known
end

--- The partition of parameters of sizes `numels` over `world` ranks (torch's
-- rule): owners (0-based ranks), offsets in the owner's flat buffer of each
-- key, per-rank element totals, buffer lengths (rank r, key k at r*nkeys+k+1).
function zero.partition(numels, world, keys, nkeys)
  return core().zero_partition(numels, world, keys, nkeys)
end

-- A function returning the current (params, grads) lists of `a`: a module
-- or DDP model (its gradients may be swapped for bucket views), or {params, grads}.
local function source_of(a)
  if type(a) == "table" and getmetatable(a) == require("crun.fsdp").FSDPClass then
    -- its shards differ per rank: broadcasting an owner's over them is wrong
    O.fail("EINVAL: bad argument #1 to 'ZeroRedundancyOptimizer' (an FSDP model: its parameters are already this "
      .. "rank's shards, step them with a plain crun.optim optimizer)")
  end
  if type(a) == "table" and type(a.parameters) == "function" then
    require("crun.optim").check_not_sharded("ZeroRedundancyOptimizer", a)
    return function() return a:parameters() end
  end
  if type(a) == "table" and type(a[1]) == "table" and type(a[2]) == "table" and #a[1] == #a[2] then
    local p, g = a[1], a[2]
    return function() return p, g end
  end
  error("EINVAL: bad argument #1 to 'ZeroRedundancyOptimizer' (a module, a DDP model or {params, grads} "
    .. "of equal length expected)", 0)
end

-- EINVAL when a tensor is listed twice: a plain optimizer would step it
-- twice, ZeRO's two owners once each (the later broadcast winning).
local function check_distinct(params)
  local seen = {}
  for i, p in ipairs(params) do
    if seen[p] then
      error(string.format("EINVAL: bad argument #1 to 'ZeroRedundancyOptimizer' (parameter %d is the same tensor as "
        .. "parameter %d: list each tensor once)", i, seen[p]), 0)
    end
    seen[p] = i
  end
end

-- ZeRO's checks of its arguments and its local setup, before any
-- collective: the new optimizer, its parameters partitioned and its own
-- ones' optimizer built (which checks that optimizer's options).
local function prepare(a, optim_class, opts)
  local source = source_of(a)
  if type(optim_class) ~= "function" then
    error("EINVAL: bad argument #2 to 'ZeroRedundancyOptimizer' (an optimizer class such as crun.optim.Adam expected)", 0)
  end
  if dist()._group_arg then dist()._group_arg("ZeroRedundancyOptimizer", opts) end
  opts = O.check(spec_for(optim_class), "ZeroRedundancyOptimizer", opts)
  local as_view = O.bool("ZeroRedundancyOptimizer", "parameters_as_bucket_view", opts.parameters_as_bucket_view, false)
  check_distinct(source())
  local d = dist()
  if not d.is_initialized() then
    error("ESTATE: ZeroRedundancyOptimizer needs a process group: call crun.dist.init_process_group() first", 0)
  end
  local inner = {}
  for k, v in pairs(opts) do if not OWN_KEYS[k] then inner[k] = v end end
  local self = setmetatable({source = source, group = opts.group, as_view = as_view,
    world = d.get_world_size(opts.group), rank = d.get_rank(opts.group)}, Z)
  if self.rank < 0 then error("EINVAL: bad argument #3 to 'ZeroRedundancyOptimizer' (this rank is not a member of the group)", 0) end
  self.copts = self.group and {group = self.group} or nil
  self.params, self.grads = source()
  self:_partition()
  local own_p, own_g = self:_own_lists()
  self.optim = optim_class(own_p, own_g, inner)
  -- the wrapped optimizer's options, as a plain optimizer's: z.opts.lr = x
  -- between steps changes the learning rate (crun's idiom, jobs/train.lua)
  self.opts = self.optim.opts
  return self
end

--- ZeroRedundancyOptimizer(model | {params, grads}, optim_class, {group=,
-- parameters_as_bucket_view=false, overlap_with_ddp=false, <optim_class's options>}).
-- Collective: every rank of the group calls it with the same parameter
-- shapes (checked; a difference raises EMISMATCH on every rank). A fault of
-- the arguments (the wrapped optimizer's options included) on one rank
-- alone fails every rank's constructor naming it (crun.dist._setup); the
-- same fault on every rank leaves the group usable.
function zero.new(a, optim_class, opts)
  local setup = dist()._setup or function(_, _, f, ...) return f(...) end -- (a stand-in crun.dist has none)
  local self = setup("all_gather", opts, prepare, a, optim_class, opts) -- before _verify's all_gather
  self:_verify()
  return self
end

-- Assigns the parameters (C) and lists this rank's own, ascending.
function Z:_partition()
  local numels, keys = {}, {}
  for i, p in ipairs(self.params) do
    numels[i] = p:numel()
    keys[i] = DTYPE_KEY[p:dtype()]
    if not keys[i] then
      error(string.format("EINVAL: ZeroRedundancyOptimizer on %s: parameter %d has dtype %s "
        .. "(float32, float64, float16 or bfloat16 expected)", self:_rk(self.rank), i, p:dtype()), 0)
    end
  end
  self.owner, self.offset, self.rank_numel, self.bucket_numel = zero.partition(numels, self.world, keys, 4)
  self.own, self.local_of = {}, {}
  for i = 1, #self.params do
    if self.owner[i] == self.rank then
      self.own[#self.own + 1] = i
      self.local_of[i] = #self.own
    end
  end
end

-- Every rank must partition the same parameter shapes (else the broadcasts
-- would not pair up): one all_gather_object of the shapes, the first
-- difference named on every rank.
function Z:_verify()
  if self.world == 1 then return end
  local sig = {}
  for i, p in ipairs(self.params) do sig[i] = p:dtype() .. "[" .. table.concat(p:size(), "x") .. "]" end
  local d, all = dist(), nil
  if self.copts then all = d.all_gather_object(sig, self.copts) else all = d.all_gather_object(sig) end
  for r = 2, #all do
    for i = 1, math.max(#all[1], #all[r]) do
      if all[1][i] ~= all[r][i] then
        error(string.format("EMISMATCH: ZeroRedundancyOptimizer on %s: parameter %d is %s on %s "
          .. "but %s on %s (every rank must pass the same model)", self:_rk(self.rank), i,
          tostring(all[r][i] or "missing"), self:_rk(r - 1), tostring(all[1][i] or "missing"), self:_rk(0)), 0)
      end
    end
  end
end

-- This rank's parameters and their current gradients.
function Z:_own_lists()
  local p, g = {}, {}
  for k, i in ipairs(self.own) do p[k], g[k] = self.params[i], self.grads[i] end
  return p, g
end

-- Re-reads the parameter and gradient lists (DDP's gradient_as_bucket_view
-- swaps the gradient tensors) and hands this rank's to the local optimizer.
function Z:_refresh()
  local params, grads = self.source()
  if #params ~= #self.params then
    error(string.format("ESTATE: ZeroRedundancyOptimizer on %s: the model now has %d parameters, "
      .. "%d when it was wrapped", self:_rk(self.rank), #params, #self.params), 0)
  end
  self.params, self.grads = params, grads
  self.optim.params, self.optim.grads = self:_own_lists()
end

-- "rank r" in messages; on a group whose rank r is global rank g ~= r,
-- "rank g (group rank r)", as the runtime's texts name a sub-group's rank
-- (the global rank first: get_rank() and crun-lua's "[rank g]").
function Z:_rk(r)
  local g = self.group and self:_global(r) or r
  if g == r then return "rank " .. r end
  return string.format("rank %d (group rank %d)", g, r)
end

-- Global rank of group rank r (broadcast/send/recv take global ranks).
function Z:_global(r)
  if self.group then return dist().get_global_rank(self.group, r) end
  return r
end

--- Sets every gradient (not only this rank's) to zero (set_to_none as the
--- optimizers': false only).
function Z:zero_grad(set_to_none)
  O.zero_grad_arg("ZeroRedundancyOptimizer:zero_grad", set_to_none)
  self:_refresh()
  for _, g in ipairs(self.grads) do g:fill(0) end
end

--- Steps this rank's parameters with the wrapped optimizer, then brings
-- every parameter up to date from its owner (blocks until done). Drops a
-- consolidated state held here (it would be stale).
function Z:step()
  self:_refresh()
  self.optim.opts = self.opts -- (a table put in z.opts counts too)
  self.optim:step()
  self.consolidated = nil
  if self.world > 1 then self:_sync_params() end
end

-- Broadcasts every parameter from its owner (see the header).
function Z:_sync_params()
  if self.as_view then return self:_sync_buckets() end
  local d, works = dist(), {}
  local o = {async_op = true, group = self.group}
  for i, p in ipairs(self.params) do
    works[#works + 1] = d.broadcast(p, self:_global(self.owner[i]), o)
  end
  for _, w in ipairs(works) do w:wait() end
end

-- parameters_as_bucket_view: one flat buffer per (owner, dtype), one
-- broadcast each; the buffer lives only for its broadcast.
function Z:_sync_buckets()
  local d = dist()
  for r = 0, self.world - 1 do
    for key, dtype in ipairs(DTYPES) do
      local n = self.bucket_numel[r * 4 + key]
      if n > 0 then
        local buf = T().zeros({n}, dtype)
        local members = {}
        for i, p in ipairs(self.params) do
          if self.owner[i] == r and p:dtype() == dtype then members[#members + 1] = i end
        end
        if r == self.rank then
          for _, i in ipairs(members) do self:_slot(buf, i):copy(self.params[i]:view(self.params[i]:numel())) end
        end
        d.broadcast(buf, self:_global(r), self.copts)
        if r ~= self.rank then
          for _, i in ipairs(members) do self.params[i]:view(self.params[i]:numel()):copy(self:_slot(buf, i)) end
        end
      end
    end
  end
end

-- Parameter i's slice of its owner's flat buffer.
function Z:_slot(buf, i)
  return buf:narrow(1, self.offset[i] + 1, self.params[i]:numel())
end

--- Number of elements in this rank's optimizer state tensors.
function Z:state_numel()
  local n = 0
  for _, s in pairs(self.optim.state) do
    for _, v in pairs(s) do if type(v) == "userdata" then n = n + v:numel() end end
  end
  return n
end

--- Bytes of this rank's optimizer state tensors.
function Z:state_bytes()
  local n = 0
  for _, s in pairs(self.optim.state) do
    for _, v in pairs(s) do if type(v) == "userdata" then n = n + v:numel() * (ELSIZE[v:dtype()] or 8) end end
  end
  return n
end

-- This rank's state as a list of {index=, scalars=, tensors={{name, shape, dtype}}}.
function Z:_state_meta()
  local meta = {}
  for li, gi in ipairs(self.own) do
    local s = self.optim.state[li]
    if s then
      local m = {index = gi, scalars = {}, tensors = {}}
      for k, v in pairs(s) do
        if type(v) == "userdata" then m.tensors[#m.tensors + 1] = {k, v:size(), v:dtype()}
        else m.scalars[k] = v end
      end
      table.sort(m.tensors, function(x, y) return x[1] < y[1] end)
      meta[#meta + 1] = m
    end
  end
  return meta
end

--- consolidate_state_dict(to=0): collective over the group; group rank
-- `to` receives every rank's optimizer state (point to point, one tensor at
-- a time) and keeps it for state_dict(). Blocks until done.
function Z:consolidate_state_dict(to)
  to = to or 0
  if math.type(to) ~= "integer" or to < 0 or to >= self.world then
    error(string.format("EINVAL: bad argument #1 to 'consolidate_state_dict' (group rank in [0, %d) expected, got %s)",
      self.world, tostring(to)), 0)
  end
  local d = dist()
  local all = {{to = to, meta = self:_state_meta()}}
  if self.world > 1 and self.copts then all = d.all_gather_object(all[1], self.copts)
  elseif self.world > 1 then all = d.all_gather_object(all[1]) end
  self:_same_to(all)
  local state = {}
  for r = 0, self.world - 1 do
    for _, m in ipairs(all[r + 1].meta) do
      if self.rank == to then state[m.index] = self:_receive_entry(m, r, to)
      elseif self.rank == r then self:_send_entry(m, to) end
    end
  end
  self.consolidated = self.rank == to and {kind = self.optim.kind, state = state,
    param_groups = {self.optim:_group_dict(#self.params)},
    zero = {world_size = self.world, num_params = #self.params}} or nil
end

-- Every rank must name the same destination (else the sends and receives
-- would not pair up and wait out the timeout): EMISMATCH on every rank,
-- naming the first rank that differs from rank 0.
function Z:_same_to(all)
  for r = 2, #all do
    if all[r].to ~= all[1].to then
      error(string.format("EMISMATCH: ZeroRedundancyOptimizer:consolidate_state_dict on %s: %s names group "
        .. "rank %d as the destination, %s names %d (every rank must pass the same to)", self:_rk(self.rank),
        self:_rk(r - 1), all[r].to, self:_rk(0), all[1].to), 0)
    end
  end
end

-- On `to`: the state entry described by m, from rank r (a copy of its own when r == to).
function Z:_receive_entry(m, r, to)
  local e = {}
  for k, v in pairs(m.scalars) do e[k] = v end
  local mine = r == to and self.optim.state[self:_local_index(m.index)]
  for _, t in ipairs(m.tensors) do
    if mine then e[t[1]] = mine[t[1]]:clone()
    else
      e[t[1]] = T().zeros(t[2], t[3])
      dist().recv(e[t[1]], self:_global(r), self.copts)
    end
  end
  return e
end

-- On the owner: sends the tensors of entry m to `to`, in m's order.
function Z:_send_entry(m, to)
  local s = self.optim.state[self:_local_index(m.index)]
  for _, t in ipairs(m.tensors) do dist().send(s[t[1]]:contiguous(), self:_global(to), self.copts) end
end

-- Local optimizer index of global parameter index gi (nil: not ours).
function Z:_local_index(gi) return self.local_of[gi] end

--- The full optimizer state, {kind=, state={[param index]={...}}, zero=},
-- the same form as a plain optimizer's state_dict(); only on the rank the
-- last consolidate_state_dict(to) sent it to, and only until the next step.
function Z:state_dict()
  if not self.consolidated then
    error(string.format("ESTATE: ZeroRedundancyOptimizer:state_dict on %s: no consolidated state here; "
      .. "call consolidate_state_dict(to) on every rank (to = %d) after the last step", self:_rk(self.rank),
      self.rank), 0)
  end
  return self.consolidated
end

--- load_state_dict(sd): sd is a full state (from state_dict() or a plain
-- optimizer's), on every rank; each keeps the entries of the parameters it
-- owns under the current partition, so the world size may have changed.
-- Every rank checks every entry: a bad one is EINVAL on all ranks, nothing loaded.
function Z:load_state_dict(sd)
  if type(sd) ~= "table" or type(sd.state) ~= "table" or sd.kind ~= self.optim.kind then
    error(string.format("EINVAL: ZeroRedundancyOptimizer:load_state_dict on %s: expected a %s state, got %s",
      self:_rk(self.rank), tostring(self.optim.kind), type(sd) == "table" and tostring(sd.kind) or type(sd)), 0)
  end
  for gi, s in pairs(sd.state) do
    if math.type(gi) ~= "integer" or gi < 1 or gi > #self.params or type(s) ~= "table" then
      error(string.format("EINVAL: ZeroRedundancyOptimizer:load_state_dict on %s: state for parameter %s "
        .. "(a %s), the model has %d", self:_rk(self.rank), tostring(gi), type(s), #self.params), 0)
    end
    for k, v in pairs(s) do
      if type(v) == "userdata" and v:numel() ~= self.params[gi]:numel() then
        error(string.format("EINVAL: ZeroRedundancyOptimizer:load_state_dict on %s: %s of parameter %d "
          .. "has %d elements, the parameter %d", self:_rk(self.rank), k, gi, v:numel(), self.params[gi]:numel()), 0)
      end
    end
  end
  -- every rank checks every entry (not only its own), so a bad state is
  -- refused everywhere, by the model's parameter index, before anything loads
  self.optim:_check_state(sd, self.params, "ZeroRedundancyOptimizer:load_state_dict")
  local mine = {kind = sd.kind, state = {}}
  for li, gi in ipairs(self.own) do mine.state[li] = sd.state[gi] end
  if sd.param_groups ~= nil then -- the options, for this rank's parameters (checked there)
    local g = type(sd.param_groups) == "table" and sd.param_groups[1]
    if type(g) == "table" and type(g.params) == "table" and #g.params ~= #self.params then
      error(string.format("EINVAL: ZeroRedundancyOptimizer:load_state_dict on %s: the state's parameter group has "
        .. "%d parameters, the model %d", self:_rk(self.rank), #g.params, #self.params), 0)
    end
    mine.param_groups = sd.param_groups
    if type(g) == "table" and g.params ~= nil then
      local own = {}
      for k, v in pairs(g) do own[k] = v end
      own.params = {table.unpack(g.params, 1, #self.own)}
      mine.param_groups = {own}
    end
  end
  self.optim:load_state_dict(mine)
  self.opts = self.optim.opts -- (the loaded options: step() hands z.opts to the wrapped optimizer)
  self.consolidated = nil
end

function Z:__tostring()
  return string.format("crun.ZeroRedundancyOptimizer(%s, %d of %d params on rank %d of %d)",
    tostring(self.optim.kind), #self.own, #self.params, self.rank, self.world)
end

require("crun.trace")._wrap(Z, "step", "ZeroRedundancyOptimizer", "optim") -- a span with the timeline on

return zero
