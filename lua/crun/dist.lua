--- crun.dist: torch.distributed in Lua.
--
--   local dist = require("crun").dist
--   dist.init_process_group{backend="auto", init_method="env://", timeout=300}
--   dist.all_reduce(t, "sum")                        -- in place
--   local w = dist.all_reduce(t, dist.ReduceOp.MAX, {async_op=true}); w:wait()
--   local g = dist.new_group{0, 2}                   -- every rank calls it
--   dist.broadcast(t, 2, {group=g})                  -- src is a global rank
--   dist.all_gather_into_tensor(out, t)              -- out: world_size * t:numel()
--   dist.reduce_scatter_tensor(out, input, "sum")    -- input: world_size * out:numel()
--
-- Ranks are 0-based. As in torch, src/dst arguments are global ranks even
-- with {group=g}; get_rank(g)/get_world_size(g) give the rank/size inside g.
-- A rank outside g that calls a collective on g does nothing (it gets the
-- non-member placeholder from new_group). Collectives block unless
-- opts.async_op, which returns a crun.Work (w:wait([timeout]), w:is_completed()).
-- Failures raise errors that start with the status name ("ETIMEDOUT: ...").
local core = require "crun.core"
local O = require "crun.opts"

local dist = {}

-- The options each call accepts (crun.opts: unknown keys are EINVAL).
local COLL = O.spec{"async_op", "group", "timeout"}
local P2P = O.spec{"async_op", "group", "timeout", "tag"}
local OBJ = O.spec{"group", "timeout"}
local OBJ_LIST = O.spec{"group", "timeout",
  inert = {device = "crun serializes objects on the host (a nccl group stages them through the current device)"}}
local INIT = O.spec{"backend", "init_method", "world_size", "rank", "store", "timeout", "group_name",
  inert = {pg_options = "crun's backends take no per-group options", device_id = "no device binding in crun's cpu backends"}}
local NEW_GROUP = O.spec{"timeout", "backend", "use_local_synchronization",
  inert = {pg_options = "crun's backends take no per-group options"}}
local MONITORED = O.spec{"group", "timeout", "wait_all_ranks"}
local BARRIER = O.spec{"async_op", "group", "timeout",
  inert = {device_ids = "a barrier moves no tensor; a nccl group's runs on the current device"}}

-- torch's backend names -> crun's
local BACKEND_ALIAS = {gloo = "cpu", ["cpu:gloo"] = "cpu", ["cpu:gloo,cuda:nccl"] = "auto"}
-- crun's backend names -> torch's, as get_backend returns them
local TORCH_BACKEND = {cpu = "gloo"}

dist.ReduceOp = {SUM = "sum", PRODUCT = "product", MIN = "min", MAX = "max", AVG = "avg",
  BAND = "band", BOR = "bor", BXOR = "bxor", PREMUL_SUM = "premul_sum"}

--- dist.make_premul_sum(factor) -> the op that multiplies every input by
-- factor, then sums (torch's; floating dtypes only). The inputs of reduce on
-- a non-root rank and of reduce_scatter are left as they were.
function dist.make_premul_sum(factor)
  if type(factor) ~= "number" or factor ~= factor then
    error("EINVAL: make_premul_sum: factor must be a number, got " .. tostring(factor), 2)
  end
  return string.format("premul_sum:%.17g", factor)
end

--- The placeholder new_group returns on ranks that are not in the group.
dist.GroupMember = {NON_GROUP_MEMBER = setmetatable({}, {__tostring = function()
  return "crun.dist.NON_GROUP_MEMBER" end})}
local NON_MEMBER = dist.GroupMember.NON_GROUP_MEMBER

local state = {pg = nil, store = nil, groups = {}, maps = setmetatable({}, {__mode = "k"}),
               ngroups = 0, gid = setmetatable({}, {__mode = "k"}), mb_seq = setmetatable({}, {__mode = "k"})}

-- Raises a status-prefixed error (no position: the text starts with the name).
local function fail(fmt, ...) error(string.format(fmt, ...), 0) end

-- Where each collective keeps its raw arguments that a refusal reads: the
-- parameter (or, for all_gather_object, local) positions of its tensor t,
-- of a and b, where an options table may stand in for another argument (an
-- op, a split list, an object), and of c, where torch's positional group
-- or an options table goes (0: none). arg_fail reads them from the
-- collective's frame (debug.getlocal), so a call that passes pays nothing.
local ARGS = {
  all_reduce = {1, 2, 0, 3}, broadcast = {1, 0, 0, 3}, reduce = {1, 3, 0, 4}, all_gather = {2, 0, 0, 3},
  all_gather_into_tensor = {1, 0, 0, 3}, reduce_scatter_tensor = {1, 3, 0, 4}, gather = {1, 0, 0, 4},
  scatter = {1, 0, 0, 4}, reduce_scatter = {1, 3, 0, 4}, all_to_all = {0, 0, 0, 3},
  all_to_all_single = {1, 3, 4, 5}, barrier = {0, 0, 0, 1}, broadcast_object = {0, 0, 0, 3},
  all_gather_object = {0, 2, 0, 3}, broadcast_object_list = {0, 0, 0, 3}, gather_object = {0, 0, 0, 4},
  scatter_object_list = {0, 0, 0, 4},
}
-- dist's own collective functions -> their names (filled at the end of this
-- file: a wrapper a user puts in dist's place is not one of them)
local COLLECTIVE_OF = {}
local fast_all_reduce  -- dist.all_reduce's C closure (set below; bindings/pg.c)

-- The raw arguments {t, a, b, c} of the running collective fname (its
-- nearest frame on this coroutine's stack), or nil when fname is not
-- running here (a check called from elsewhere).
local function call_args(fname)
  local pos = ARGS[fname]
  for level = 3, 40 do
    local info = pos and debug.getinfo(level, "f")
    if not info then return nil end
    if COLLECTIVE_OF[info.func] == fname then
      local v = {}
      for i = 1, 4 do
        if pos[i] > 0 then v[i] = select(2, debug.getlocal(level, pos[i])) end
      end
      return v
    end
  end
  return nil
end

-- The call the binding runs for collective fname, as its peers' refusal names it.
local RUNS_AS = {all_gather_into_tensor = "all_gather", reduce_scatter_tensor = "reduce_scatter",
  all_to_all_single = "all_to_all", broadcast_object = "broadcast",
  broadcast_object_list = "broadcast", scatter_object_list = "broadcast", all_gather_object = "all_gather",
  gather_object = "all_gather"}

local function is_pg(v)
  local mt = type(v) == "userdata" and getmetatable(v)
  return type(mt) == "table" and mt.__name == "crun.ProcessGroup"
end

-- The group that options table v, which has no `group`, holds under another
-- key (a misspelled group =, torch's process_group =): the call is that
-- group's, not the default group's; false when it holds none, nil when it
-- holds two.
local function group_under_other_key(v)
  local found = false
  for _, x in pairs(v) do
    if x == NON_MEMBER or is_pg(x) then
      if found and found ~= x then return nil end
      found = x
    end
  end
  return found
end

-- The group that raw argument v names: a process group or NON_MEMBER
-- itself, or an options table's `group` (or the one group it holds under
-- another key); false when it names none (nil, a table holding no group,
-- and where not `strict` any other value); nil when it names something that
-- is no group (group = 5; a number in the place of torch's positional group
-- when `strict`).
local function named_group(v, strict)
  if v == NON_MEMBER or is_pg(v) then return v end
  if type(v) == "table" and getmetatable(v) == nil then
    local g = v.group
    if g == nil then return group_under_other_key(v) end
    return (g == NON_MEMBER or is_pg(g)) and g or nil
  end
  if strict and v ~= nil then return nil end
  return false
end

-- The group a refused call of the current collective runs on: the first
-- that its raw arguments name, else the default group. nil where it cannot
-- be known (a bad group argument) or this rank is not in it (NON_MEMBER:
-- the peers do not wait for it).
local function refusal_group(cur)
  local g = named_group(cur[2])
  if g == false then g = named_group(cur[3]) end
  if g == false then g = named_group(cur[4], true) end
  if g == false then g = state.pg end
  return g ~= NON_MEMBER and g or nil
end

-- Raises text, a fault of the arguments of call fname found on this rank
-- alone. When fname is a collective running on this stack (call_args) and
-- its group is known, it is refused for that group first (pg:refuse): the
-- peers, whose arguments may have passed, fail this call naming this rank
-- rather than pair it with this rank's next call (a wrong result or an
-- EMISMATCH there), and the group stops. Other calls (send, recv, ...) and
-- an unknown group raise here alone, and so does a destroyed group (its
-- refuse() raises ECLOSED, which would hide the fault). The peers' text
-- names this rank in the refusal's own note ("rank 2 (group rank 1) refused
-- its part of ..."), so crun.opts's " (rank N)" suffix stays on this rank's.
-- Refuses collective `call` of group g with fault text (pg:refuse) and
-- raises what it says: the text, and whether the group goes on. A " (rank
-- N)" suffix (crun.opts's) stays on this rank's text alone. Returns when
-- the refusal raised something else (a destroyed group's ECLOSED).
local function refuse_raise(g, call, text, cuda)
  local suffix = text:match(" %(rank %d+%)$") or ""
  local said = text:sub(1, #text - #suffix)
  local _, err = pcall(g.refuse, g, call, said, -1, cuda)
  local at = type(err) == "string" and select(2, err:find((said:gsub("^%u+: ", "")), 1, true))
  if at then error(err:sub(1, at) .. suffix .. err:sub(at + 1), 0) end
end

local function arg_fail(fname, text)
  local cur = call_args(fname)
  local g = cur and refusal_group(cur)
  if g then
    local t = cur[1]
    local ok, cuda = pcall(function() return t:is_cuda() end)
    refuse_raise(g, RUNS_AS[fname] or fname, text, ok and cuda == true)
  end
  error(text, 0)
end

-- torch's positional parameters of each call, for too_many's text.
local POSITIONAL = {
  all_reduce = "tensor, op, group, async_op", broadcast = "tensor, src, group, async_op",
  reduce = "tensor, dst, op, group, async_op", all_gather = "tensor_list, tensor, group, async_op",
  all_gather_into_tensor = "output_tensor, input_tensor, group, async_op",
  reduce_scatter_tensor = "output, input, op, group, async_op", gather = "tensor, gather_list, dst, group, async_op",
  scatter = "tensor, scatter_list, src, group, async_op", reduce_scatter = "output, input_list, op, group, async_op",
  all_to_all = "output_tensor_list, input_tensor_list, group, async_op",
  all_to_all_single = "output, input, output_split_sizes, input_split_sizes, group, async_op",
  barrier = "group, async_op, device_ids", monitored_barrier = "group, timeout, wait_all_ranks",
  send = "tensor, dst, group, tag", recv = "tensor, src, group, tag", isend = "tensor, dst, group, tag",
  irecv = "tensor, src, group, tag", broadcast_object = "obj, src, group", all_gather_object = "object_list, obj, group",
  broadcast_object_list = "object_list, src, group, device", gather_object = "obj, object_gather_list, dst, group",
  scatter_object_list = "scatter_object_output_list, scatter_object_input_list, src, group",
  P2POp = "op, tensor, peer, group, tag", batch_isend_irecv = "p2p_op_list",
}

-- Raises EINVAL naming fname and the position of the first non-nil value
-- among `...`, the arguments after fname's positional ones (torch raises
-- TypeError there). Nils there pass: a nil is no argument in Lua, and
-- wrappers pass their trailing ones on. The tensor collectives and barrier
-- take two named extra parameters (a vararg function and select cost a
-- call that passes ~45 ns in Lua 5.4) and look at those two only; the
-- object collectives and the rest test select("#", ...) > 0 first.
local function too_many(fname, ...)
  local names = POSITIONAL[fname]
  local _, commas = names:gsub(",", "")
  for i = 1, select("#", ...) do
    local v = select(i, ...)
    if v ~= nil then
      arg_fail(fname, string.format("EINVAL: %s: argument #%d (%s) is one too many: %s takes %d positional "
               .. "arguments at most (%s), as in torch", fname, commas + 1 + i, type(v), fname, commas + 1, names))
    end
  end
end

-- crun's name for backend name b (torch's, any case, or crun's own).
local function crun_backend(b)
  if type(b) ~= "string" then return b end  -- the runtime names what it got
  local l = b:lower()
  return BACKEND_ALIAS[l] or l
end

--- dist.Backend: torch's names as fields (dist.Backend.GLOO == "gloo"), and
-- dist.Backend(name) -> the lowercase name, as torch's Backend("GLOO").
-- The names get_backend returns; init_process_group takes them and crun's.
dist.Backend = setmetatable({UNDEFINED = "undefined", GLOO = "gloo", NCCL = "nccl", UCC = "ucc", MPI = "mpi"}, {
  __call = function(B, name)
    local v = type(name) == "string" and rawget(B, name:upper())
    if not v or v == B.UNDEFINED then
      fail("EINVAL: Backend: unknown backend %s (gloo, nccl, mpi or ucc, in any case)", tostring(name))
    end
    return v
  end,
})

local function default_pg(fname)
  if not state.pg then
    error("ESTATE: " .. fname .. ": the default process group is not initialized; "
          .. "call crun.dist.init_process_group() first", 0)
  end
  return state.pg
end

--- Splits "scheme://rest" init methods into the store to use.
local function store_for(init_method, rank, world_size, timeout)
  local S = require "crun.store"
  if init_method == "env://" then
    return S.from_env{timeout = timeout}
  end
  local host, port = init_method:match("^tcp://%[?([^%]]+)%]?:(%d+)$")
  if host then
    return S.tcp{host = host, port = tonumber(port), is_master = rank == 0, timeout = timeout}
  end
  local path = init_method:match("^file://(.+)$")
  -- as torch's FileStore(path, world_size): the last rank to close it removes the file
  if path then return S.file(path, {world_size = world_size}), true end
  fail("EINVAL: init_process_group: unknown init_method '%s' (use env://, tcp://host:port or file:///path)",
       init_method)
end

local function env_int(name)
  local v = os.getenv(name)
  return v and math.tointeger(tonumber(v))
end

--- init_process_group{backend=, init_method=, world_size=, rank=, store=, timeout=}
--- Also torch's positional form: init_process_group("gloo"[, opts]).
function dist.init_process_group(backend, opts)
  if type(backend) == "table" and opts == nil then backend, opts = nil, backend end
  if backend ~= nil and type(backend) ~= "string" then
    fail("EINVAL: init_process_group: backend must be a string (gloo, cpu, mpi, nccl or auto), got %s", type(backend))
  end
  opts = O.check(INIT, "init_process_group", opts)
  if backend ~= nil then
    if opts.backend ~= nil and opts.backend ~= backend then
      fail("EINVAL: init_process_group: backend '%s' given twice with different values ('%s')", backend, opts.backend)
    end
    local o = {}
    for k, v in pairs(opts) do o[k] = v end
    o.backend, opts = backend, o
  end
  if state.pg then fail("ESTATE: init_process_group: already initialized (call destroy_process_group first)") end
  local rank = opts.rank or env_int("RANK")
  local world_size = opts.world_size or env_int("WORLD_SIZE")
  if rank == nil then fail("EINVAL: init_process_group: rank is unknown (pass rank= or set RANK; crun-lua sets it)") end
  if world_size == nil then
    fail("EINVAL: init_process_group: world_size is unknown (pass world_size= or set WORLD_SIZE; crun-lua sets it)")
  end
  if rank < 0 or rank >= world_size then
    fail("EINVAL: init_process_group: rank %d is out of range for world_size %d", rank, world_size)
  end
  local timeout = opts.timeout or 300
  local backend = opts.backend or os.getenv("CRUN_BACKEND") or "auto"
  backend = crun_backend(backend)
  if backend == "auto" and core.have_mpi and (os.getenv("OMPI_COMM_WORLD_SIZE") or os.getenv("PMI_SIZE"))
     and not os.getenv("CRUN_LAUNCHER") then
    backend = "mpi"  -- as runtime/backend/backend.c decides it
  end
  -- backend mpi meets through MPI itself: a private in-process store suffices
  local store, close_at_destroy = opts.store, false
  if not store and backend == "mpi" then store = require("crun.store").hash() end
  if not store then
    store, close_at_destroy = store_for(opts.init_method or "env://", rank, world_size, timeout)
  end
  state.pg = core.pg_new{store = store, rank = rank, world_size = world_size, timeout = timeout,
                         backend = backend, name = opts.group_name or "default"}
  state.store, state.close_store = store, close_at_destroy
  core.fast_all_reduce_group(fast_all_reduce, state.pg)
  if backend ~= "mpi" then
    -- monitored_barrier's keys are this incarnation's: a group made after
    -- destroy_process_group on the same store (the launcher's outlives it)
    -- must not find the released verdicts of the one before (as pg.c counts)
    local name = opts.group_name or "default"
    local n = store:add("crun/monitored_barrier/" .. name .. "/incarnation", 1)
    state.mb_prefix = string.format("crun/monitored_barrier/%s/%d/", name, (n - 1) // world_size)
  end
  core.set_log_rank(rank)
  core.flight_arm() -- SIGUSR1 dumps the flight recorder (crun/trace.h)
  if core.trace_enabled() and backend ~= "mpi" then -- the timeline's clocks, aligned to rank 0's
    state.aligned = (state.aligned or 0) + 1
    core.trace_align(store, string.format("%s/%s/%d", opts.group_name or "default", os.getenv("CRUN_RESTART_COUNT") or "0",
                     state.aligned), rank, world_size, timeout)
  end
  return state.pg
end

function dist.is_initialized() return state.pg ~= nil end

--- stats([group][, {reset=true}]) -> {all_reduce = {ops=, bytes=, time=, wait=}, ...}:
-- per op, since the group was made or last reset, on this rank: operations,
-- input bytes, seconds from start to end and seconds blocked on peers
-- (crun/trace.h says what that measures). reset=true zeroes them after reading.
-- Needs the flight recorder (on by default) or the timeline.
function dist.stats(group, opts)
  if type(group) == "table" and opts == nil and getmetatable(group) == nil then group, opts = nil, group end
  local g = group or default_pg("stats")
  return core.pg_stats(g, opts and opts.reset)
end

--- reset_stats([group]): zeroes the statistics of dist.stats.
function dist.reset_stats(group) core.pg_stats(group or default_pg("reset_stats"), true) end
function dist.is_available() return true end

--- torch's backend probes: gloo is crun's cpu backend (always there); mpi
-- and nccl as this build has them; ucc never.
function dist.is_gloo_available() return true end
function dist.is_mpi_available() return core.have_mpi == true end
function dist.is_nccl_available() return core.have_nccl == true end
function dist.is_ucc_available() return false end

--- is_torchelastic_launched() -> whether a torchrun-style launcher started
-- this process (crun-lua sets TORCHELASTIC_RUN_ID, as torchrun does, and
-- torch checks that variable).
function dist.is_torchelastic_launched() return os.getenv("TORCHELASTIC_RUN_ID") ~= nil end

-- A process group, or nil for the default one; anything else (a tensor, a
-- Work, a number passed as group=) raises EINVAL naming the call instead of
-- "attempt to index" from deep inside dist.
local function resolve(group, fname)
  if group == nil then return default_pg(fname) end
  if group == NON_MEMBER then  -- torch raises here too ("Invalid process group specified")
    fail("EINVAL: %s on rank %d: this rank is not in the group (new_group gave it GroupMember.NON_GROUP_MEMBER)",
         fname, state.pg and state.pg:rank() or -1)
  end
  local mt = type(group) == "userdata" and getmetatable(group)
  if type(mt) ~= "table" or mt.__name ~= "crun.ProcessGroup" then
    local got = type(mt) == "table" and type(mt.__name) == "string" and mt.__name or type(group)
    fail("EINVAL: %s: group must be a crun.ProcessGroup (from new_group), got %s", fname, got)
  end
  return group
end

--- Destroys the default group (and every sub-group), or just `group`.
function dist.destroy_process_group(group)
  if group and group ~= state.pg then
    if group ~= NON_MEMBER then resolve(group, "destroy_process_group"):destroy() end
    return
  end
  for _, g in ipairs(state.groups) do g:destroy() end
  core.fast_all_reduce_group(fast_all_reduce, nil)
  if state.pg then state.pg:destroy() end
  if state.close_store and state.store then state.store:close() end  -- file://: counts this rank out
  state.pg, state.store, state.groups, state.ngroups, state.close_store = nil, nil, {}, 0, false
end

function dist.get_rank(group)
  if group == NON_MEMBER then return -1 end
  return resolve(group, "get_rank"):rank()
end

function dist.get_world_size(group)
  if group == NON_MEMBER then return -1 end
  return resolve(group, "get_world_size"):size()
end

--- get_backend([group]) -> torch's name of the group's backend: "gloo" for
-- crun's cpu backend (so torch's `get_backend() == "gloo"` and
-- `== dist.Backend.GLOO` checks hold), "mpi" and "nccl" as they are. The
-- group's own g:backend() gives crun's name ("cpu").
function dist.get_backend(group)
  local b = resolve(group, "get_backend"):backend()
  return TORCH_BACKEND[b] or b
end

--- The default group's store (for users who need extra keys).
function dist.get_store() default_pg("get_store"); return state.store end

-- torch's positional arguments of new_group after ranks, in order.
local NEW_GROUP_POS = {"timeout", "backend", "pg_options", "use_local_synchronization"}

-- new_group's options from its arguments after ranks: one options table, or
-- torch's positional (timeout, backend, pg_options, use_local_synchronization);
-- anything else is EINVAL rather than silently dropped.
local function new_group_opts(...)
  local n, a = select("#", ...), ...
  if type(a) == "table" then
    if n > 1 then
      fail("EINVAL: new_group: %d argument%s after the options table (pass torch's positional timeout, "
           .. "backend, ... or one table {timeout=, backend=}, not both)", n - 1, n > 2 and "s" or "")
    end
    return a
  end
  if n > #NEW_GROUP_POS then
    fail("EINVAL: new_group: %d arguments (torch's positional ranks, timeout, backend, pg_options, "
         .. "use_local_synchronization at most)", n + 1)
  end
  if a ~= nil and type(a) ~= "number" then
    fail("EINVAL: new_group: argument #2 (timeout) must be a number of seconds or an options table, got %s", type(a))
  end
  local backend = select(2, ...)
  if backend ~= nil and type(backend) ~= "string" then
    fail("EINVAL: new_group: argument #3 (backend) must be a string, got %s", type(backend))
  end
  local o = {}
  for i, k in ipairs(NEW_GROUP_POS) do o[k] = select(i, ...) end
  if o.use_local_synchronization == false then o.use_local_synchronization = nil end  -- torch's default
  return o
end

--- new_group(ranks[, opts{timeout=, backend=}]): every rank of the default
-- group calls it with the same ranks (in any order: as in torch, group rank i
-- is the i-th lowest global rank). Ranks that disagree get EMISMATCH naming
-- the lists. torch's positional new_group(ranks, timeout, backend[,
-- pg_options[, use_local_synchronization]]) works too; more arguments, or
-- any after an options table, are EINVAL. use_local_synchronization = true
-- (torch's: the ranks outside the group may skip the call) is ENOTSUP: crun
-- synchronizes the whole default group, so every rank calls new_group.
function dist.new_group(ranks, ...)
  local pg = default_pg("new_group")
  local opts = O.check(NEW_GROUP, "new_group", new_group_opts(...))
  if O.bool("new_group", "use_local_synchronization", opts.use_local_synchronization, false) then
    fail("ENOTSUP: new_group: use_local_synchronization = true is not implemented: crun's new_group synchronizes the "
         .. "whole default group, so every rank of it must call new_group (members or not, with the same ranks); "
         .. "pass false or leave it out")
  end
  if opts.backend ~= nil then
    local want = crun_backend(opts.backend)
    if want ~= "auto" and want ~= pg:backend() then
      fail("ENOTSUP: new_group: backend '%s' differs from the default group's '%s' (crun builds sub-groups on the "
           .. "default group's backend)", opts.backend, pg:backend())
    end
  end
  if ranks == nil then
    ranks = {}
    for r = 0, pg:size() - 1 do ranks[#ranks + 1] = r end
  end
  if type(ranks) ~= "table" then fail("EINVAL: bad argument #1 to 'new_group' (list of ranks expected)") end
  local g = pg:new_group(ranks, opts.timeout)
  state.ngroups = state.ngroups + 1  -- counted on every rank, member or not
  if not g then return NON_MEMBER end
  state.groups[#state.groups + 1] = g
  state.gid[g] = state.ngroups
  return g
end

--- get_process_group_ranks(g) -> the global ranks of g, in group-rank order.
function dist.get_process_group_ranks(group)
  local g = resolve(group, "get_process_group_ranks")
  local out = {}
  for r = 0, g:size() - 1 do out[r + 1] = g:global_rank(r) end
  return out
end

--- new_subgroups_by_enumeration(list_of_rank_lists[, opts]) -> this rank's
-- subgroup (NON_GROUP_MEMBER when in none), and every subgroup (this rank's
-- entries hold its group, the others NON_GROUP_MEMBER), as torch returns them.
-- torch's positional (lists, timeout, backend, pg_options) works too: what
-- follows the lists is new_group's.
function dist.new_subgroups_by_enumeration(lists, ...)
  if type(lists) ~= "table" or #lists == 0 then
    fail("EINVAL: new_subgroups_by_enumeration: a non-empty list of rank lists is expected")
  end
  local seen, mine, all = {}, NON_MEMBER, {}
  for i, ranks in ipairs(lists) do
    if type(ranks) ~= "table" then fail("EINVAL: new_subgroups_by_enumeration: entry %d is not a list of ranks", i) end
    for _, r in ipairs(ranks) do
      if seen[r] then fail("EINVAL: new_subgroups_by_enumeration: rank %s is in subgroups %d and %d", tostring(r), seen[r], i) end
      seen[r] = i
    end
  end
  for i, ranks in ipairs(lists) do
    local g = dist.new_group(ranks, ...)
    all[i] = g
    if g ~= NON_MEMBER then mine = g end
  end
  return mine, all
end

--- new_subgroups([group_size][, opts]) -> this rank's subgroup and every
-- subgroup: consecutive blocks of group_size ranks (default: LOCAL_WORLD_SIZE,
-- one subgroup per node); the world size must be a multiple of it. torch's
-- positional (group_size, group, timeout, backend, pg_options) works too, its
-- unused group nil.
function dist.new_subgroups(group_size, opts, ...)
  if type(group_size) == "table" then
    if opts ~= nil or select("#", ...) > 0 then
      fail("EINVAL: new_subgroups: arguments after the options table (pass one table {timeout=, backend=} or "
           .. "torch's positional group_size, group, timeout, backend)")
    end
    group_size, opts = nil, group_size
  end
  local n = default_pg("new_subgroups"):size()
  group_size = group_size or env_int("LOCAL_WORLD_SIZE") or n
  if math.type(group_size) ~= "integer" or group_size < 1 or n % group_size ~= 0 then
    fail("EINVAL: new_subgroups: group_size %s must be a positive integer dividing the world size %d",
         tostring(group_size), n)
  end
  local lists = {}
  for b = 0, n // group_size - 1 do
    local l = {}
    for r = b * group_size, (b + 1) * group_size - 1 do l[#l + 1] = r end
    lists[#lists + 1] = l
  end
  if opts == nil then return dist.new_subgroups_by_enumeration(lists, ...) end  -- torch's group=None
  if type(opts) ~= "table" or select("#", ...) > 0 then
    fail("EINVAL: new_subgroups: argument #2 must be an options table {timeout=, backend=} with nothing after it, or "
         .. "nil (torch's positional group, which it does not use), got %s", type(opts))
  end
  return dist.new_subgroups_by_enumeration(lists, opts)
end

-- Global rank -> rank in group g (a subgroup), built once per group.
local function group_map(g)
  local m = state.maps[g]
  if not m then
    m = {}
    for r = 0, g:size() - 1 do m[g:global_rank(r)] = r end
    state.maps[g] = m
  end
  return m
end

--- Global rank -> rank in group (and back), cached per group.
local function to_group_rank(g, global, fname)
  if g == state.pg then return global end
  local r = group_map(g)[global]
  if r == nil then fail("EINVAL: %s: rank %s is not in the group", fname, tostring(global)) end
  return r
end

-- How a message names group rank r of g, as the runtime's do: "rank G", G
-- its global rank (what get_rank() returns and crun-lua's "[rank G]" shows),
-- then " (group rank r)" on a group whose rank r is not global rank r.
local function who(g, r)
  local gl = g == state.pg and r or g:global_rank(r)
  if gl == r then return "rank " .. r end
  return string.format("rank %d (group rank %d)", gl, r)
end

--- to_group_rank for the root (`what`: "src" or "dst") of rooted collective
--- fname on tensor t: a rank outside the group, which only this rank sees, is
--- refused for the group (pg:refuse), so that every rank fails the call
--- naming this rank rather than the peers waiting for it and meeting its
--- next call as an EMISMATCH.
local function root_rank(g, global, fname, what, t)
  if g == state.pg then return global end
  local r = group_map(g)[global]
  if r ~= nil then return r end
  local ok, cuda = pcall(function() return t:is_cuda() end)
  g:refuse(fname, string.format("EINVAL: %s on %s: %s %s is not in the group", fname, who(g, g:rank()), what,
                                tostring(global)), -1, ok and cuda or false)
end

-- rank, an integer (4.0 is 4), or EINVAL naming fname's argument `what`.
local function rank_number(fname, what, rank)
  local r = type(rank) == "number" and math.tointeger(rank)
  if not r then
    fail("EINVAL: %s: %s must be an integer, got %s", fname, what, type(rank) == "number" and tostring(rank) or type(rank))
  end
  return r
end

function dist.get_group_rank(group, global_rank)
  local g = resolve(group, "get_group_rank")
  global_rank = rank_number("get_group_rank", "global_rank", global_rank)
  if g == state.pg and (math.type(global_rank) ~= "integer" or global_rank < 0 or global_rank >= g:size()) then
    fail("EINVAL: get_group_rank: rank %s is not in the group", tostring(global_rank))
  end
  return to_group_rank(g, global_rank, "get_group_rank")
end
function dist.get_global_rank(group, group_rank)
  local g = resolve(group, "get_global_rank")
  return g:global_rank(rank_number("get_global_rank", "group_rank", group_rank))
end

-- torch's positional trailing arguments: a process group (or
-- NON_GROUP_MEMBER) in the options' place and the argument after it (named
-- `name`: all_reduce(t, op, group, async_op), send(t, dst, group, tag)) make
-- the options table {group =, [name] =}, nil there being torch's None (the
-- default group); anything else is the options as given, with nothing after
-- them (EINVAL naming fname).
-- Raises EINVAL for an argument (`what`) after fname's options table, where
-- torch's positional group and `name` (async_op, tag) would go.
local function after_table(fname, what, name)
  arg_fail(fname, string.format("EINVAL: %s: %s given after an options table (pass torch's positional group, %s "
           .. "or one table {group=, %s=})", fname, what, name, name))
end

-- Raises EINVAL for torch's positional async_op v of collective fname that
-- is not a boolean, naming its argument position (the one after fname's
-- group, ARGS) and this rank, as the bindings name an options table's field.
local function async_fault(fname, v)
  local where = state.pg and string.format("%s on rank %d", fname, state.pg:rank()) or fname
  arg_fail(fname, string.format("EINVAL: %s: bad argument #%d 'async_op' (boolean expected, got %s)", where,
                                ARGS[fname][4] + 1, type(v)))
end

local function group_form(opts, name, v, fname)
  if v == nil and type(opts) ~= "userdata" and opts ~= NON_MEMBER then return opts end
  if name == "async_op" and v ~= nil and type(v) ~= "boolean" then async_fault(fname, v) end
  if type(opts) == "table" and opts ~= NON_MEMBER then  -- {group=...}, true: which async_op was meant?
    after_table(fname, name, name)
  end
  local o = {group = opts}  -- opts nil: torch's group=None, the default group
  if name then o[name] = v end  -- the object collectives take nothing after it
  return o
end
local ASYNC, TAG = "async_op", "tag"

--- Parses (op, group-or-opts, async_op), torch's positional form or crun's
--- with the op left out and the options table in its place (then nothing may
--- follow it: a group or async_op there would otherwise be dropped); checks
--- the options against COLL.
local function split_op(op, opts, async_op, fname)
  if type(op) ~= "table" or op == NON_MEMBER then
    return op, O.check(COLL, fname, group_form(opts, ASYNC, async_op, fname), arg_fail)
  end
  if opts ~= nil then after_table(fname, "group", ASYNC) end
  if async_op ~= nil then after_table(fname, ASYNC, ASYNC) end
  return nil, O.check(COLL, fname, op, arg_fail)
end

local function group_of(opts, fname)
  local g = opts.group
  if g == NON_MEMBER then return nil end
  return resolve(g, fname)
end

function dist.all_reduce(t, op, opts, async_op, x1, x2)
  if x1 ~= nil or x2 ~= nil then too_many("all_reduce", x1, x2) end
  op, opts = split_op(op, opts, async_op, "all_reduce")
  local g = group_of(opts, "all_reduce")
  if g then return g:all_reduce(t, op, opts) end
end
-- the common call (default group, no options) goes straight to the binding,
-- without a Lua frame: with more ranks than cores every instruction of every
-- rank adds latency. A C closure takes it and hands any other call to the
-- function above (core.fast_all_reduce, bindings/pg.c).
COLLECTIVE_OF[dist.all_reduce] = "all_reduce"  -- the Lua function, whose frame arg_fail reads
fast_all_reduce = core.fast_all_reduce(dist.all_reduce) -- told the default group by init and destroy
dist.all_reduce = fast_all_reduce

function dist.broadcast(t, src, opts, async_op, x1, x2)
  if x1 ~= nil or x2 ~= nil then too_many("broadcast", x1, x2) end
  opts = group_form(opts, ASYNC, async_op, "broadcast")
  local pg = state.pg
  if opts == nil and pg and math.type(src) == "integer" then return pg:broadcast(t, src) end
  opts = O.check(COLL, "broadcast", opts, arg_fail)
  local g = group_of(opts, "broadcast")
  if g then return g:broadcast(t, root_rank(g, src, "broadcast", "src", t), opts) end
end

function dist.reduce(t, dst, op, opts, async_op, x1, x2)
  if x1 ~= nil or x2 ~= nil then too_many("reduce", x1, x2) end
  op, opts = split_op(op, opts, async_op, "reduce")
  local g = group_of(opts, "reduce")
  if g then return g:reduce(t, root_rank(g, dst, "reduce", "dst", t), op, opts) end
end

function dist.all_gather(list, t, opts, async_op, x1, x2)
  if x1 ~= nil or x2 ~= nil then too_many("all_gather", x1, x2) end
  opts = O.check(COLL, "all_gather", group_form(opts, ASYNC, async_op, "all_gather"), arg_fail)
  local g = group_of(opts, "all_gather")
  if g then return g:all_gather(list, t, opts) end
end

-- Returns t when it is a crun.Tensor, else fails naming fname and what.
local function tensor_arg(t, fname, what)
  local mt = getmetatable(t)
  if type(t) ~= "userdata" or type(mt) ~= "table" or mt.__name ~= "crun.Tensor" then
    fail("EINVAL: %s: the %s must be a crun.Tensor, got %s", fname, what, type(t))
  end
  return t
end

--- all_gather_into_tensor(out, t[, opts]): torch's form with one output
--- tensor of world_size * t:numel() elements, rank r's input in block r.
--- With async_op the Work's result() is {out}. The binding cuts out into
--- blocks itself (no view per block: a view is a new userdata), and refuses
--- a fault only this rank sees for the group, so that every rank fails this
--- call naming it, rather than the others waiting.
function dist.all_gather_into_tensor(out, t, opts, async_op, x1, x2)
  if x1 ~= nil or x2 ~= nil then too_many("all_gather_into_tensor", x1, x2) end
  opts = O.check(COLL, "all_gather_into_tensor", group_form(opts, ASYNC, async_op, "all_gather_into_tensor"), arg_fail)
  local g = group_of(opts, "all_gather_into_tensor")
  if g then return g:all_gather_into_tensor(out, t, opts) end
end

--- reduce_scatter_tensor(out, input[, op][, opts]): torch's form with one
--- input tensor of world_size * out:numel() elements; rank r gets block r
--- reduced over every rank (faults refused as all_gather_into_tensor's).
function dist.reduce_scatter_tensor(out, input, op, opts, async_op, x1, x2)
  if x1 ~= nil or x2 ~= nil then too_many("reduce_scatter_tensor", x1, x2) end
  op, opts = split_op(op, opts, async_op, "reduce_scatter_tensor")
  local g = group_of(opts, "reduce_scatter_tensor")
  if g then return g:reduce_scatter_tensor(out, input, op, opts) end
end

function dist.gather(t, list, dst, opts, async_op, x1, x2)
  if x1 ~= nil or x2 ~= nil then too_many("gather", x1, x2) end
  opts = O.check(COLL, "gather", group_form(opts, ASYNC, async_op, "gather"), arg_fail)
  local g = group_of(opts, "gather")
  if g then return g:gather(t, list, root_rank(g, dst or 0, "gather", "dst", t), opts) end
end

function dist.scatter(t, list, src, opts, async_op, x1, x2)
  if x1 ~= nil or x2 ~= nil then too_many("scatter", x1, x2) end
  opts = O.check(COLL, "scatter", group_form(opts, ASYNC, async_op, "scatter"), arg_fail)
  local g = group_of(opts, "scatter")
  if g then return g:scatter(t, list, root_rank(g, src or 0, "scatter", "src", t), opts) end
end

function dist.reduce_scatter(out, list, op, opts, async_op, x1, x2)
  if x1 ~= nil or x2 ~= nil then too_many("reduce_scatter", x1, x2) end
  op, opts = split_op(op, opts, async_op, "reduce_scatter")
  local g = group_of(opts, "reduce_scatter")
  if g then return g:reduce_scatter(out, list, op, opts) end
end

function dist.all_to_all(outs, ins, opts, async_op, x1, x2)
  if x1 ~= nil or x2 ~= nil then too_many("all_to_all", x1, x2) end
  opts = O.check(COLL, "all_to_all", group_form(opts, ASYNC, async_op, "all_to_all"), arg_fail)
  local g = group_of(opts, "all_to_all")
  if g then return g:all_to_all(outs, ins, opts) end
end

-- Whether v is an options table rather than a split list (a table with keys
-- and no list part).
local function is_opts(v) return type(v) == "table" and #v == 0 and next(v) ~= nil end

-- all_to_all_single's (out_splits, in_splits, opts) from its arguments after
-- the tensors: an options table may stand in either split list's place, and
-- then nothing may follow it (a split list, group or async_op there would
-- otherwise be dropped).
local function a2a_args(out_splits, in_splits, opts, async_op)
  local fname = "all_to_all_single"
  if is_opts(out_splits) then
    if in_splits ~= nil then after_table(fname, "input split sizes", ASYNC) end
    out_splits, in_splits = nil, out_splits
  end
  if is_opts(in_splits) then
    if opts ~= nil then after_table(fname, "group", ASYNC) end
    if async_op ~= nil then after_table(fname, ASYNC, ASYNC) end
    return out_splits, nil, in_splits
  end
  return out_splits, in_splits, group_form(opts, ASYNC, async_op, fname)
end

--- all_to_all_single(output, input[, output_split_sizes][, input_split_sizes][, opts]):
-- torch's one-tensor all_to_all: dim 1 of input is cut into blocks (equal, or
-- input_split_sizes rows each); block j goes to rank j, and output receives
-- rank j's block for this rank at its j-th block (output_split_sizes rows).
-- A nil or empty split list means equal blocks, as None or [] in torch.
-- Split sizes (or tensors) that are wrong on one rank fail the call on every
-- rank with EINVAL naming that rank, and the group stops (torch's would
-- leave the others waiting). With async_op the Work's result() is {output},
-- as torch's.
function dist.all_to_all_single(output, input, out_splits, in_splits, opts, async_op, x1, x2)
  if x1 ~= nil or x2 ~= nil then too_many("all_to_all_single", x1, x2) end
  out_splits, in_splits, opts = a2a_args(out_splits, in_splits, opts, async_op)
  opts = O.check(COLL, "all_to_all_single", opts, arg_fail)
  local g = group_of(opts, "all_to_all_single")
  if not g then return nil end
  -- the binding cuts dim 1 into blocks itself (no view per block: a view is
  -- a new userdata, which was most of a small call's time) and refuses a
  -- fault of this rank's arguments for the group
  return g:all_to_all_single(output, input, out_splits, in_splits, opts)
end

function dist.barrier(opts, async_op, device_ids, x1, x2)
  if x1 ~= nil or x2 ~= nil then too_many("barrier", x1, x2) end
  local ids = device_ids
  if ids ~= nil and type(opts) == "table" and opts ~= NON_MEMBER then after_table("barrier", "device_ids", "device_ids") end
  opts = group_form(opts, ASYNC, async_op, "barrier")
  local pg = state.pg
  if opts == nil and ids == nil and pg then return pg:barrier() end
  if ids == nil and type(opts) == "table" then ids = opts.device_ids end
  if ids ~= nil then  -- torch's device_ids: a list of device indices, which changes nothing here
    local bad = type(ids) ~= "table"
    for i = 1, bad and 0 or #ids do bad = bad or math.type(ids[i]) ~= "integer" or ids[i] < 0 end
    if bad then arg_fail("barrier", "EINVAL: barrier: device_ids must be a list of device indices (integers >= 0)") end
    if device_ids ~= nil then
      opts = opts or {}
      opts.device_ids = device_ids
    end
  end
  opts = O.check(BARRIER, "barrier", opts, arg_fail)
  local g = group_of(opts, "barrier")
  if g then return g:barrier(opts) end
end

--- monitored_barrier([opts{group=, timeout=, wait_all_ranks=false}]): a
-- barrier through the store in which group rank 0 waits for every other rank
-- until the timeout and then raises ETIMEDOUT naming the first rank that did
-- not arrive (every such rank with wait_all_ranks); the other ranks get the
-- same error. Not for hot loops: it is for finding the rank that is stuck.
--
-- It runs on the store, not as a call of the group: a fault of its arguments
-- stays this rank's (not recorded in cur, so arg_fail raises it here alone);
-- the peers' barrier then names this rank as the one that did not arrive.
function dist.monitored_barrier(opts, timeout, wait_all_ranks, ...)
  if select("#", ...) > 0 then too_many("monitored_barrier", ...) end
  if type(opts) == "userdata" or opts == NON_MEMBER or opts == nil and (timeout ~= nil or wait_all_ranks ~= nil) then
    -- torch's positional form (a nil group: torch's None, the default group)
    opts = {group = opts, timeout = timeout, wait_all_ranks = wait_all_ranks}
  elseif timeout ~= nil or wait_all_ranks ~= nil then
    fail("EINVAL: monitored_barrier: arguments after an options table (pass torch's positional group, timeout, "
         .. "wait_all_ranks or one table {group=, timeout=, wait_all_ranks=})")
  end
  opts = O.check(MONITORED, "monitored_barrier", opts)
  local g = group_of(opts, "monitored_barrier")
  if not g then return end
  timeout = opts.timeout or g:timeout()
  if g:backend() == "mpi" then  -- no shared store under mpirun: MPI's own barrier, bounded
    return g:barrier({timeout = timeout})
  end
  core.store_flush_sets()  -- this process's sets before the barrier are seen after it, as with barrier
  local seq = (state.mb_seq[g] or 0) + 1
  state.mb_seq[g] = seq
  local store = state.store
  local base = string.format("%s%d/%d/", state.mb_prefix, state.gid[g] or 0, seq)
  local me, n = g:rank(), g:size()
  -- "released" holds the one verdict every rank raises (or "ok"): the first
  -- of rank 0's and of a rank that gave up waiting for it is kept
  local released = base .. "released"
  if me ~= 0 then
    store:set(base .. "arrived/" .. g:global_rank(me), "1")
    local ok, err = pcall(store.wait, store, {released}, timeout + 5)
    local verdict = ok and store:get(released) or store:compare_set(released, "", string.format(
      "ETIMEDOUT: monitored_barrier on rank %d: group rank 0 (global %d) did not release the barrier within %.3g s (%s)",
      g:global_rank(me), g:global_rank(0), timeout + 5, tostring(err)))
    if verdict ~= "ok" then error(verdict, 0) end
    return
  end
  local deadline, missing = core.clock() + timeout, {}
  for r = 1, n - 1 do
    local key = base .. "arrived/" .. g:global_rank(r)
    local left = deadline - core.clock()
    local ok = left > 0 and pcall(store.wait, store, {key}, left) or store:check({key})
    if not ok then
      missing[#missing + 1] = g:global_rank(r)
      if not opts.wait_all_ranks then break end
    end
  end
  local text = #missing == 0 and "ok" or string.format(
    "ETIMEDOUT: monitored_barrier: rank%s %s did not arrive within %.3g s (seen by rank %d)",
    #missing > 1 and "s" or "", table.concat(missing, ", "), timeout, g:global_rank(0))
  local verdict = store:compare_set(released, "", text)
  if verdict ~= "ok" then error(verdict, 0) end
end

--- send(t, dst[, opts{tag=, group=}]); tag >= 0 (torch refuses a negative one).
--- send, recv, isend and irecv also take torch's positional (group[, tag]) there;
--- every tensor collective takes torch's positional (group[, async_op]) in the
--- options' place (all_to_all_single after both split lists), the object
--- collectives torch's positional group (broadcast_object_list a device after
--- it, which has no effect), monitored_barrier (group, timeout, wait_all_ranks).
function dist.send(t, dst, opts, tag, ...)
  if select("#", ...) > 0 then too_many("send", ...) end
  opts = O.check(P2P, "send", group_form(opts, TAG, tag, "send"))
  local g = group_of(opts, "send")
  if g then return g:send(t, to_group_rank(g, dst, "send"), opts) end
end

--- recv(t[, src][, opts{tag=, group=}]) -> the sender's global rank
-- recv's and irecv's (src, opts) from (src, opts, tag): src may be left out,
-- an options table in its place, and then nothing may follow it.
local function recv_args(src, opts, tag, fname)
  if type(src) ~= "table" then return src, group_form(opts, TAG, tag, fname) end
  if opts ~= nil then after_table(fname, "group", TAG) end
  if tag ~= nil then after_table(fname, TAG, TAG) end
  return nil, src
end

function dist.recv(t, src, opts, tag, ...)
  if select("#", ...) > 0 then too_many("recv", ...) end
  src, opts = recv_args(src, opts, tag, "recv")
  opts = O.check(P2P, "recv", opts)
  local g = group_of(opts, "recv")
  if not g then return -1 end
  local from = g:recv(t, src and to_group_rank(g, src, "recv"), opts)
  return g:global_rank(from)
end

local function with_async(opts)
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  o.async_op = true
  return o
end

-- Returns what a group's p2p method `base` (send, recv), run for call fname
-- (isend, irecv), returned (pcall's ok, ...), or raises its error with
-- fname in base's place: the binding and the runtime name the method they
-- run ("EINVAL: send on rank 0: ...", "bad argument #1 to 'send'"), the user
-- called fname.
local function as_called(fname, base, ok, ...)
  if ok then return ... end
  local e = ...
  if type(e) == "string" then
    e = e:gsub("^(%u+: )" .. base .. "([ :])", "%1" .. fname .. "%2", 1):gsub("'" .. base .. "'", "'" .. fname .. "'", 1)
  end
  error(e, 0)
end

--- isend / irecv: as send / recv with async_op; return a crun.Work. After
-- wait, w:source() is the sender's rank in the group (global for the default group).
function dist.isend(t, dst, opts, tag, ...)
  if select("#", ...) > 0 then too_many("isend", ...) end
  opts = with_async(O.check(P2P, "isend", group_form(opts, TAG, tag, "isend")))
  local g = group_of(opts, "isend")
  if not g then return end
  dst = to_group_rank(g, dst, "isend")
  -- (a method call in a closure: the binding's argument errors then name 'send' and count from the tensor)
  return as_called("isend", "send", pcall(function() return g:send(t, dst, opts) end))
end
function dist.irecv(t, src, opts, tag, ...)
  if select("#", ...) > 0 then too_many("irecv", ...) end
  src, opts = recv_args(src, opts, tag, "irecv")
  opts = O.check(P2P, "irecv", opts)
  local g = group_of(opts, "irecv")
  if not g then return end
  src, opts = src and to_group_rank(g, src, "irecv"), with_async(opts)
  return as_called("irecv", "recv", pcall(function() return g:recv(t, src, opts) end))
end

--- P2POp(op, tensor, peer[, group][, tag]): one operation of a batch for
-- batch_isend_irecv; op is dist.isend or dist.irecv (or "isend"/"irecv").
function dist.P2POp(op, tensor, peer, group, tag, ...)
  if select("#", ...) > 0 then too_many("P2POp", ...) end
  local kind = (op == dist.isend or op == "isend") and "isend" or (op == dist.irecv or op == "irecv") and "irecv"
  if not kind then fail("EINVAL: P2POp: op must be dist.isend or dist.irecv") end
  if math.type(peer) ~= "integer" then fail("EINVAL: P2POp: peer must be an integer rank, got %s", tostring(peer)) end
  return {op = kind, tensor = tensor, peer = peer, group = group, tag = tag}
end

-- Checks entry i of a batch before any entry is posted: one raising after
-- others were posted would leave those orphaned, a receive among them taking
-- the data meant for a later batch (and its Work holding up the collector
-- until the timeout).
local function check_p2p_entry(p, i)
  local g = group_of({group = p.group}, "batch_isend_irecv")
  if not g then return end
  local where = string.format("batch_isend_irecv on rank %d: entry %d (%s %s %s)", state.pg:rank(), i, p.op,
                              p.op == "isend" and "to" or "from", tostring(p.peer))
  tensor_arg(p.tensor, where, "tensor")
  if not p.tensor:is_contiguous() then fail("EINVAL: %s: the tensor must be contiguous", where) end
  if math.type(p.peer) ~= "integer" then fail("EINVAL: %s: the peer must be an integer rank", where) end
  local peer = to_group_rank(g, p.peer, where)
  if peer < 0 or peer >= g:size() then fail("EINVAL: %s: peer is out of range (0..%d)", where, g:size() - 1) end
  if peer == g:rank() then fail("EINVAL: %s: the peer is this rank", where) end
  if p.tag ~= nil and (math.type(p.tag) ~= "integer" or p.tag < 0) then
    fail("EINVAL: %s: tag %s is not an integer >= 0 (as in torch.distributed)", where, tostring(p.tag))
  end
end

--- batch_isend_irecv(ops) -> a list of crun.Work, one per op (wait on each).
-- Every op is posted before any is waited on, and sends and receives progress
-- independently, so a batch in which every rank sends right and receives left
-- (in either order) cannot deadlock. Every entry is checked before the first
-- is posted: a bad one raises EINVAL naming it and posts nothing.
function dist.batch_isend_irecv(ops, ...)
  if select("#", ...) > 0 then too_many("batch_isend_irecv", ...) end
  if type(ops) ~= "table" or #ops == 0 then fail("EINVAL: batch_isend_irecv: a non-empty list of P2POp is expected") end
  local g0
  for i, p in ipairs(ops) do
    if type(p) ~= "table" or (p.op ~= "isend" and p.op ~= "irecv") then
      fail("EINVAL: batch_isend_irecv: entry %d is not a P2POp", i)
    end
    if i == 1 then g0 = p.group end
    if p.group ~= g0 then fail("EINVAL: batch_isend_irecv: entry %d is on another group than entry 1", i) end
  end
  for i, p in ipairs(ops) do check_p2p_entry(p, i) end
  local works = {}
  for i, p in ipairs(ops) do
    local o = {group = p.group, tag = p.tag}
    works[i] = p.op == "isend" and dist.isend(p.tensor, p.peer, o) or dist.irecv(p.tensor, p.peer, o)
  end
  return works
end

-- The group rank of an object collective's root (a global rank, src or dst
-- as `what` says), checked here: the byte collectives under it would name
-- themselves, and gather_object with no rank its dst would do nothing. A bad
-- root, which only this rank may see, is refused for the group as `call`
-- (the byte collective the peers are in: "broadcast" or "all_gather"), so
-- that every rank fails the call naming this rank and the fault rather than
-- the peers meeting its next call as an EMISMATCH (as root_rank does).
local function obj_root(g, r, fname, what, call)
  local gr = r
  if g ~= state.pg then gr = group_map(g)[r] end
  if math.type(gr) == "integer" and gr >= 0 and gr < g:size() then return gr end
  local why = gr == nil and "is not in the group" or string.format("is out of range (0..%d)", g:size() - 1)
  g:refuse(call, string.format("EINVAL: %s on %s: %s %s %s", fname, who(g, g:rank()), what, tostring(r), why), -1,
           false)
end

-- A rank whose object cannot be sent (it does not serialize, or a check of
-- the root's arguments failed) still takes part in the exchange, sending this
-- marker and its error text instead, so that every rank raises that error
-- naming the rank, rather than the others waiting in a collective the failing
-- rank never entered (and it then running into their next one).
local OBJ_ERR = "CRUNERR!"

-- The bytes of the value make() returns, or OBJ_ERR and the error it raised.
local function encode_made(make)
  local S = require "crun.serialize"
  local ok, bytes = pcall(function() return S.dumps(make()) end)
  return ok and bytes or OBJ_ERR .. tostring(bytes)
end

-- Decodes the bytes group rank r of g sent; raises the error it carries.
local function decode_from(b, g, r, fname)
  if b:sub(1, #OBJ_ERR) == OBJ_ERR then
    local text = b:sub(#OBJ_ERR + 1)
    local status, rest = text:match("^(E%u+): (.*)$")
    fail("%s: %s: %s could not send its object: %s", status or "EINVAL", fname, who(g, r), rest or text)
  end
  return require("crun.serialize").loads(b, fname)
end

-- The value make() returns on group rank gsrc (run there only), on every rank.
local function broadcast_made(make, g, gsrc, opts, fname)
  local bytes = g:rank() == gsrc and encode_made(make) or nil
  return decode_from(g:broadcast_bytes(bytes, gsrc, opts), g, gsrc, fname)
end

--- broadcast_object(v, src[, opts]) -> src's value on every rank (plain Lua
-- values: nil, booleans, numbers, strings, tables of those, tensors); opts
-- may be torch's positional group instead (as broadcast_object_list's).
function dist.broadcast_object(v, src, opts, ...)
  if select("#", ...) > 0 then too_many("broadcast_object", ...) end
  opts = O.check(OBJ, "broadcast_object", group_form(opts, nil, nil, "broadcast_object"), arg_fail)
  local g = group_of(opts, "broadcast_object")
  if not g then return nil end
  local gsrc = obj_root(g, src or 0, "broadcast_object", "src", "broadcast")
  return broadcast_made(function() return v end, g, gsrc, opts, "broadcast_object")
end

-- Every rank's value make() returns, gathered (a list indexed by group rank + 1).
local function gather_made(make, g, opts, fname)
  local parts = g:all_gather_bytes(encode_made(make), opts)
  local out = {}
  for i, b in ipairs(parts) do out[i] = decode_from(b, g, i - 1, fname) end
  return out
end

local function gather_values(v, g, opts, fname)
  return gather_made(function() return v end, g, opts, fname)
end

-- Raises EINVAL naming the rank unless list is a table. The object
-- collectives call it after their exchange (or, on a root, inside the value
-- it sends), so that a rank passing a wrong list fails alone, the others
-- completing instead of waiting for it until the timeout.
local function not_a_list(list, fname, what)
  if type(list) ~= "table" then
    fail("EINVAL: %s on rank %d: the %s must be a table, got %s", fname, state.pg:rank(), what, type(list))
  end
end

-- Whether t is an options table of the object collectives (keys group/timeout only).
local function is_obj_opts(t)
  if type(t) ~= "table" or getmetatable(t) ~= nil or next(t) == nil then return false end
  for k in pairs(t) do if k ~= "group" and k ~= "timeout" then return false end end
  return true
end

-- Whether all_gather_object(a, b) is crun's all_gather_object(v, opts): b
-- is an options table and a is no output list, or b names a process group
-- (a value no rank can send, so never torch's object).
local function gather_opts_form(a, b)
  if not is_obj_opts(b) then return false end
  local g = b.group
  local mt = type(g) == "userdata" and getmetatable(g)
  return type(a) ~= "table" or g == NON_MEMBER or type(mt) == "table" and mt.__name == "crun.ProcessGroup"
end

--- all_gather_object(list, obj[, opts]): torch's form, fills list[1..n] with
-- every rank's obj (nil included). all_gather_object(v[, opts]) -> that list
-- (crun's convenience). With two arguments the second is options only when
-- it is a table of group/timeout and either the first is not a table or its
-- group is a process group (or NON_GROUP_MEMBER): all_gather_object(list,
-- {timeout = 5}) gathers {timeout = 5} into list, and a table v with a
-- timeout alone takes {group = dist.group.WORLD, timeout = 5}.
function dist.all_gather_object(...)
  local a, b, opts = ...
  local nargs = select("#", ...)
  if nargs > 3 then too_many("all_gather_object", select(4, ...)) end
  if nargs <= 1 or (nargs == 2 and gather_opts_form(a, b)) then
    local o = O.check(OBJ, "all_gather_object", b, arg_fail)
    local g = group_of(o, "all_gather_object")
    if not g then return nil end
    return gather_values(a, g, o, "all_gather_object")
  end
  opts = O.check(OBJ, "all_gather_object", group_form(opts, nil, nil, "all_gather_object"), arg_fail)
  local g = group_of(opts, "all_gather_object")
  if not g then return nil end
  local vals = gather_values(b, g, opts, "all_gather_object")
  not_a_list(a, "all_gather_object", "output list")  -- after the exchange: the others are not left waiting
  for i = 1, g:size() do a[i] = vals[i] end
  for i = #a, g:size() + 1, -1 do a[i] = nil end
end

-- A copy of list[1..#list] with its length in field n (table.unpack would
-- stop at Lua's C stack limit, about a million elements).
local function packed(list)
  local t = {n = #list}
  for i = 1, t.n do t[i] = list[i] end
  return t
end

--- broadcast_object_list(list, src[, opts]): every other rank's list becomes
-- src's in place, whatever its length: torch's lists have one length, but
-- its receivers' [None] * n is {} in Lua (a trailing None shortens a list),
-- so a length check would refuse faithful ports. src's list keeps its own
-- objects, not copies of them, as in torch.
function dist.broadcast_object_list(list, src, opts, device, ...)
  if select("#", ...) > 0 then too_many("broadcast_object_list", ...) end
  opts = O.check(OBJ_LIST, "broadcast_object_list", group_form(opts, "device", device, "broadcast_object_list"), arg_fail)
  local g = group_of(opts, "broadcast_object_list")
  if not g then return nil end
  local gsrc = obj_root(g, src or 0, "broadcast_object_list", "src", "broadcast")
  local got = broadcast_made(function()
    not_a_list(list, "broadcast_object_list", "object list")
    return packed(list)
  end, g, gsrc, opts, "broadcast_object_list")
  not_a_list(list, "broadcast_object_list", "object list")
  if g:rank() == gsrc then return end
  for i = #list, got.n + 1, -1 do list[i] = nil end
  for i = 1, got.n do list[i] = got[i] end
end

--- gather_object(obj, list, dst[, opts]): dst's list gets every rank's obj
-- (list[r+1] from group rank r); list is ignored (may be nil) elsewhere.
function dist.gather_object(obj, list, dst, opts, ...)
  if select("#", ...) > 0 then too_many("gather_object", ...) end
  opts = O.check(OBJ, "gather_object", group_form(opts, nil, nil, "gather_object"), arg_fail)
  local g = group_of(opts, "gather_object")
  if not g then return nil end
  local gdst = obj_root(g, dst or 0, "gather_object", "dst", "all_gather")
  local vals = gather_made(function()
    if g:rank() == gdst and type(list) ~= "table" then
      fail("EINVAL: gather_object on %s (dst): the output list must be a table", who(g, gdst))
    end
    return obj
  end, g, opts, "gather_object")
  if g:rank() ~= gdst then return nil end
  for i = 1, g:size() do list[i] = vals[i] end
end

--- scatter_object_list(out, in, src[, opts]): out[1] gets src's in[r+1] on
-- group rank r; in is read on src only.
function dist.scatter_object_list(out, input, src, opts, ...)
  if select("#", ...) > 0 then too_many("scatter_object_list", ...) end
  opts = O.check(OBJ, "scatter_object_list", group_form(opts, nil, nil, "scatter_object_list"), arg_fail)
  local g = group_of(opts, "scatter_object_list")
  if not g then return nil end
  local gsrc = obj_root(g, src or 0, "scatter_object_list", "src", "broadcast")
  local all = broadcast_made(function()
    if type(input) ~= "table" or #input ~= g:size() then
      fail("EINVAL: scatter_object_list on %s (src): the input list must have %d elements",
           who(g, gsrc), g:size())
    end
    return packed(input)
  end, g, gsrc, opts, "scatter_object_list")
  not_a_list(out, "scatter_object_list", "output list")
  out[1] = all[g:rank() + 1]
end

--- Returns f(...): the checks and local setup of a constructor that then
--- runs collectives (DDP, FSDP, ZeroRedundancyOptimizer), whose first is
--- `call` ("all_gather": their all_gather_object of the layout) on the
--- group of `opts`, the constructor's raw options (its group, torch's
--- process_group, or the one group it holds under a misspelled key; none:
--- the default group). A fault
--- raised in f may be this rank's alone while its peers already wait in that
--- call: it is refused for the group (pg:refuse) before it is raised, so that
--- they fail the call at once naming this rank and the fault rather than
--- wait out the group's timeout; when every rank refused the same call, the
--- group goes on. Without a process group, or for NON_GROUP_MEMBER, the
--- fault is raised here alone; a group option that is no group refuses the
--- default group's call (where peers that passed nil are).
-- Internal (DDP, FSDP, ZeroRedundancyOptimizer): raises EINVAL naming
-- constructor fname, this rank and the key when the raw options table opts
-- holds a group= or process_group= that is no group (DDP(m,
-- {process_group = 5})), instead of a fault of the internal call that
-- first used it ("get_rank: group must be ..."). Raised in _setup's f, it
-- refuses the default group's call, where the peers that passed nil wait.
function dist._group_arg(fname, opts)
  if type(opts) ~= "table" then return end
  for _, k in ipairs{"group", "process_group"} do
    local v = rawget(opts, k)
    if v ~= nil and v ~= NON_MEMBER and not is_pg(v) then
      local mt = getmetatable(v)
      fail("EINVAL: %s on rank %d: %s must be a crun.ProcessGroup (from new_group), got %s", fname,
           state.pg and state.pg:rank() or -1, k,
           type(mt) == "table" and type(mt.__name) == "string" and mt.__name or type(v))
    end
  end
end

function dist._setup(call, opts, f, ...)
  local res = table.pack(pcall(f, ...))
  if res[1] then return table.unpack(res, 2, res.n) end
  local text = tostring(res[2])
  local group = type(opts) == "table" and named_group(opts) or false -- group=, process_group= or a misspelling
  local g = group ~= NON_MEMBER and (group or state.pg) or nil
  if g then refuse_raise(g, call, text, false) end  -- (a closed group raises its own: then res[2])
  error(res[2], 0)
end

--- dist.group(): the default group (crun.ProcessGroup) for direct method
-- calls; dist.group.WORLD is the same object, as in torch.
dist.group = setmetatable({}, {
  __call = function() return default_pg("group") end,
  __index = function(_, k) if k == "WORLD" then return default_pg("group.WORLD") end end,
})

for fname in pairs(ARGS) do
  if fname ~= "all_reduce" then COLLECTIVE_OF[dist[fname]] = fname end  -- all_reduce's is the C closure's callee
end

return dist
