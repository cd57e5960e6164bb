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

local dist = {}

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

local state = {pg = nil, store = nil, groups = {}, maps = setmetatable({}, {__mode = "k"})}

-- Raises a status-prefixed error (no position: the text starts with the name).
local function fail(fmt, ...) error(string.format(fmt, ...), 0) end

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
  if path then return S.file(path) end
  fail("EINVAL: init_process_group: unknown init_method '%s' (use env://, tcp://host:port or file:///path)",
       init_method)
end

local function env_int(name)
  local v = os.getenv(name)
  return v and math.tointeger(tonumber(v))
end

--- init_process_group{backend=, init_method=, world_size=, rank=, store=, timeout=}
function dist.init_process_group(opts)
  opts = opts or {}
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
  if backend == "auto" and core.have_mpi and (os.getenv("OMPI_COMM_WORLD_SIZE") or os.getenv("PMI_SIZE"))
     and not os.getenv("CRUN_LAUNCHER") then
    backend = "mpi"  -- as runtime/backend/backend.c decides it
  end
  -- backend mpi meets through MPI itself: a private in-process store suffices
  local store = opts.store or (backend == "mpi" and require("crun.store").hash())
                or store_for(opts.init_method or "env://", rank, world_size, timeout)
  state.pg = core.pg_new{store = store, rank = rank, world_size = world_size, timeout = timeout,
                         backend = backend, name = opts.group_name or "default"}
  state.store = store
  core.set_log_rank(rank)
  return state.pg
end

function dist.is_initialized() return state.pg ~= nil end
function dist.is_available() return true end

--- Destroys the default group (and every sub-group), or just `group`.
function dist.destroy_process_group(group)
  if group and group ~= state.pg then
    if group ~= NON_MEMBER then group:destroy() end
    return
  end
  for _, g in ipairs(state.groups) do g:destroy() end
  if state.pg then state.pg:destroy() end
  state.pg, state.store, state.groups = nil, nil, {}
end

local function resolve(group, fname)
  if group == nil then return default_pg(fname) end
  return group
end

function dist.get_rank(group)
  if group == NON_MEMBER then return -1 end
  return resolve(group, "get_rank"):rank()
end

function dist.get_world_size(group)
  if group == NON_MEMBER then return -1 end
  return resolve(group, "get_world_size"):size()
end

function dist.get_backend(group) return resolve(group, "get_backend"):backend() end

--- The default group's store (for users who need extra keys).
function dist.get_store() default_pg("get_store"); return state.store end

--- new_group(ranks[, opts{timeout=}]): every rank of the default group calls it.
function dist.new_group(ranks, opts)
  local pg = default_pg("new_group")
  if ranks == nil then
    ranks = {}
    for r = 0, pg:size() - 1 do ranks[#ranks + 1] = r end
  end
  if type(ranks) ~= "table" then fail("bad argument #1 to 'new_group' (list of ranks expected)") end
  local g = pg:new_group(ranks, opts and opts.timeout)
  if not g then return NON_MEMBER end
  state.groups[#state.groups + 1] = g
  return g
end

--- Global rank -> rank in group (and back), cached per group.
local function to_group_rank(g, global, fname)
  if g == state.pg then return global end
  local m = state.maps[g]
  if not m then
    m = {}
    for r = 0, g:size() - 1 do m[g:global_rank(r)] = r end
    state.maps[g] = m
  end
  local r = m[global]
  if r == nil then fail("EINVAL: %s: rank %s is not in the group", fname, tostring(global)) end
  return r
end

function dist.get_group_rank(group, global_rank) return to_group_rank(group, global_rank, "get_group_rank") end
function dist.get_global_rank(group, group_rank) return group:global_rank(group_rank) end

--- Parses (op, opts) where op may be left out: returns op, opts, group or nil for non-members.
-- The options of a call given none: shared, read-only (no table per call).
local NO_OPTS = setmetatable({}, {__newindex = function() error("internal: NO_OPTS is read-only", 2) end})

local function split_op(op, opts)
  if type(op) == "table" then op, opts = nil, op end
  return op, opts or NO_OPTS
end

local function group_of(opts, fname)
  local g = opts.group
  if g == NON_MEMBER then return nil end
  return resolve(g, fname)
end

function dist.all_reduce(t, op, opts)
  -- the common call (default group, no options) goes straight to the binding:
  -- with more ranks than cores every instruction of every rank adds latency
  local pg = state.pg
  if opts == nil and pg and type(op) ~= "table" then return pg:all_reduce(t, op) end
  op, opts = split_op(op, opts)
  local g = group_of(opts, "all_reduce")
  if g then return g:all_reduce(t, op, opts) end
end

function dist.broadcast(t, src, opts)
  local pg = state.pg
  if opts == nil and pg and math.type(src) == "integer" then return pg:broadcast(t, src) end
  opts = opts or {}
  local g = group_of(opts, "broadcast")
  if g then return g:broadcast(t, to_group_rank(g, src, "broadcast"), opts) end
end

function dist.reduce(t, dst, op, opts)
  op, opts = split_op(op, opts)
  local g = group_of(opts, "reduce")
  if g then return g:reduce(t, to_group_rank(g, dst, "reduce"), op, opts) end
end

function dist.all_gather(list, t, opts)
  opts = opts or {}
  local g = group_of(opts, "all_gather")
  if g then return g:all_gather(list, t, opts) end
end

--- Views of a contiguous tensor as `n` equal consecutive blocks (1-D), each
--- `per` elements; fails naming fname when the sizes do not match.
local function blocks_of(big, n, per, fname, what)
  if not big:is_contiguous() then
    fail("EINVAL: %s: the %s tensor must be contiguous", fname, what)
  end
  if big:numel() ~= n * per then
    fail("EINVAL: %s: the %s tensor has %d elements, expected %d (world size %d x %d)",
         fname, what, big:numel(), n * per, n, per)
  end
  local flat, list = big:view(n * per), {}
  for r = 1, n do list[r] = flat:narrow(1, (r - 1) * per + 1, per) end
  return list
end

--- all_gather_into_tensor(out, t[, opts]): torch's form with one output
--- tensor of world_size * t:numel() elements, rank r's input in block r.
function dist.all_gather_into_tensor(out, t, opts)
  opts = opts or {}
  local g = group_of(opts, "all_gather_into_tensor")
  if not g then return nil end
  return g:all_gather(blocks_of(out, g:size(), t:numel(), "all_gather_into_tensor", "output"), t, opts)
end

--- reduce_scatter_tensor(out, input[, op][, opts]): torch's form with one
--- input tensor of world_size * out:numel() elements; rank r gets block r
--- reduced over every rank.
function dist.reduce_scatter_tensor(out, input, op, opts)
  op, opts = split_op(op, opts)
  local g = group_of(opts, "reduce_scatter_tensor")
  if not g then return nil end
  return g:reduce_scatter(out, blocks_of(input, g:size(), out:numel(), "reduce_scatter_tensor", "input"), op, opts)
end

function dist.gather(t, list, dst, opts)
  opts = opts or {}
  local g = group_of(opts, "gather")
  if g then return g:gather(t, list, to_group_rank(g, dst or 0, "gather"), opts) end
end

function dist.scatter(t, list, src, opts)
  opts = opts or {}
  local g = group_of(opts, "scatter")
  if g then return g:scatter(t, list, to_group_rank(g, src or 0, "scatter"), opts) end
end

function dist.reduce_scatter(out, list, op, opts)
  op, opts = split_op(op, opts)
  local g = group_of(opts, "reduce_scatter")
  if g then return g:reduce_scatter(out, list, op, opts) end
end

function dist.all_to_all(outs, ins, opts)
  opts = opts or {}
  local g = group_of(opts, "all_to_all")
  if g then return g:all_to_all(outs, ins, opts) end
end

function dist.barrier(opts)
  local pg = state.pg
  if opts == nil and pg then return pg:barrier() end
  opts = opts or {}
  local g = group_of(opts, "barrier")
  if g then return g:barrier(opts) end
end

--- send(t, dst[, opts{tag=, group=}])
function dist.send(t, dst, opts)
  opts = opts or {}
  local g = group_of(opts, "send")
  if g then return g:send(t, to_group_rank(g, dst, "send"), opts) end
end

--- recv(t[, src][, opts{tag=, group=}]) -> the sender's global rank
function dist.recv(t, src, opts)
  if type(src) == "table" then src, opts = nil, src end
  opts = opts or {}
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

--- isend / irecv: as send / recv with async_op; return a crun.Work. After
-- wait, w:source() is the sender's rank in the group (global for the default group).
function dist.isend(t, dst, opts) return dist.send(t, dst, with_async(opts)) end
function dist.irecv(t, src, opts)
  if type(src) == "table" then src, opts = nil, src end
  opts = opts or {}
  local g = group_of(opts, "irecv")
  if g then return g:recv(t, src and to_group_rank(g, src, "irecv"), with_async(opts)) end
end

--- broadcast_object(v, src[, opts]) -> src's value on every rank (plain Lua
-- values: nil, booleans, numbers, strings, tables of those, tensors).
function dist.broadcast_object(v, src, opts)
  opts = opts or {}
  local g = group_of(opts, "broadcast_object")
  if not g then return nil end
  local S = require "crun.serialize"
  local gsrc = to_group_rank(g, src or 0, "broadcast_object")
  local bytes = g:rank() == gsrc and S.dumps(v) or nil
  return S.loads(g:broadcast_bytes(bytes, gsrc, opts), "broadcast_object")
end

--- all_gather_object(v[, opts]) -> {v_of_rank0, v_of_rank1, ...}
function dist.all_gather_object(v, opts)
  opts = opts or {}
  local g = group_of(opts, "all_gather_object")
  if not g then return nil end
  local S = require "crun.serialize"
  local parts = g:all_gather_bytes(S.dumps(v), opts)
  local out = {}
  for i, b in ipairs(parts) do out[i] = S.loads(b, "all_gather_object") end
  return out
end

--- The default group object (crun.ProcessGroup) for direct method calls.
function dist.group() return default_pg("group") end

return dist
