--- Soak (issue 16): N random collectives, each checked on every rank.
--
--   crun-lua -n 4 jobs/soak.lua [--ops N] [--seed S] [--max-bytes B]
--            [--async-pct P] [--timeout S] [--report-every K]
--   CRUN_TRANSPORT=tcp|shm picks the transport (`make soak` runs both).
--
-- Every rank draws the same sequence from the seed: an op (all_reduce,
-- broadcast, reduce, all_gather, gather, scatter, reduce_scatter, all_to_all,
-- barrier, send/recv pairs, object collectives), a dtype, a size (0, 1, small,
-- around page, shm one-shot/chunk, heap and TCP ring boundaries, or random up
-- to --max-bytes), one of the groups made up front, and blocking or async (an
-- async op is waited later, with up to 4 in flight). A rank outside the group
-- skips the op. Inputs are signed and non-periodic: rank r's block for peer j
-- is u + off(r, j), u a seeded random tensor every rank regenerates and off a
-- small distinct offset, so each result has a closed form (sum: n*u + sum of
-- offsets, max: u + max offset, gathered block r: u + off(r, j), ...) that
-- every rank computes without any communication and compares exactly.
-- Prints "soak: ops=... checked=... failures=..." on rank 0 (each rank's
-- failures on its own stderr) and exits 1 on any mismatch or error.
local crun = require "crun"
local dist, T = crun.dist, crun.tensor

local opts = {ops = 1000, seed = 16, max_bytes = 600000, async_pct = 30, timeout = 120, report_every = 0}
do
  local i = 1
  while i <= #arg do
    local k, v = arg[i]:match("^%-%-([%w-]+)=?(.*)$")
    if not k then error("EINVAL: soak: unexpected argument '" .. arg[i] .. "'", 0) end
    if v == "" then i = i + 1; v = arg[i] end
    k = k:gsub("-", "_")
    if opts[k] == nil or v == nil then error("EINVAL: soak: unknown option or missing value --" .. k, 0) end
    opts[k] = math.tointeger(tonumber(v)) or error("EINVAL: soak: --" .. k .. " needs an integer, got " .. v, 0)
    i = i + 1
  end
end

dist.init_process_group{backend = "auto", timeout = opts.timeout}
local RANK, WORLD = dist.get_rank(), dist.get_world_size()

-- The shared sequence: a 64-bit LCG (Knuth's MMIX constants), top bits used.
local rng = opts.seed * 2654435761 + 1
local function rand(m)
  rng = rng * 6364136223846793005 + 1442695040888963407
  return ((rng >> 33) % m)
end
local function pick(list) return list[rand(#list) + 1] end

-- Groups, made up front on every rank: world, evens, the first half, the last
-- rank alone, and three random subsets (ranks sorted, as new_group wants).
local GROUPS = {{ranks = {}, g = nil}}
for r = 0, WORLD - 1 do GROUPS[1].ranks[r + 1] = r end
local function add_group(ranks)
  if #ranks == 0 then return end
  GROUPS[#GROUPS + 1] = {ranks = ranks, g = dist.new_group(ranks)}
end
do
  local ev, half = {}, {}
  for r = 0, WORLD - 1, 2 do ev[#ev + 1] = r end
  for r = 0, WORLD // 2 - 1 do half[#half + 1] = r end
  add_group(ev); add_group(half); add_group({WORLD - 1})
  for _ = 1, 3 do
    local s = {}
    for r = 0, WORLD - 1 do if rand(2) == 1 then s[#s + 1] = r end end
    add_group(s)
  end
end
for _, G in ipairs(GROUPS) do
  G.index = {}
  for i, r in ipairs(G.ranks) do G.index[r] = i - 1 end
  G.member = G.index[RANK] ~= nil
end

-- dtypes: element size, the largest magnitude kept exact through a sum, signedness.
local DT = {
  float32 = {size = 4, lim = 1 << 24, signed = true, float = true},
  float64 = {size = 8, lim = 1 << 40, signed = true, float = true},
  float16 = {size = 2, lim = 2048, signed = true, float = true},
  bfloat16 = {size = 2, lim = 256, signed = true, float = true},
  int32 = {size = 4, lim = (1 << 31) - 1, signed = true},
  int64 = {size = 8, lim = 1 << 40, signed = true},
  int16 = {size = 2, lim = 32767, signed = true},
  int8 = {size = 1, lim = 127, signed = true},
  uint8 = {size = 1, lim = 255, signed = false},
  bool = {size = 1, lim = 1, signed = false},
}
local DTYPES = {"float32", "float64", "float16", "bfloat16", "int32", "int64", "int16", "int8", "uint8", "bool"}
-- byte sizes whose neighbourhoods matter: a page, the shm one-shot limit,
-- TCP ring slices (512 KiB / ranks, and 40000), the heap's smallest tensor,
-- the TCP ring threshold, the shm chunk
local EDGES = {4096, 32768, 40000, 65536, 131072, 262144, 524288}

local function count_for(dt)
  local k = rand(10)
  if k == 0 then return 0 elseif k == 1 then return 1 elseif k == 2 then return rand(8) + 2 end
  local es = DT[dt].size
  if k <= 6 then
    local edges = {}
    for _, b in ipairs(EDGES) do if b <= opts.max_bytes then edges[#edges + 1] = b end end
    if #edges > 0 then return math.max(0, pick(edges) // es + rand(3) - 1) end
  end
  return rand(math.max(1, opts.max_bytes // es)) + 1
end

-- u: the seeded signed non-periodic base, values in [lo, hi), as int64.
local function base(count, lo, hi, s) return T.randint(lo, hi, {count}, {seed = s}) end

-- The input rank r sends peer j: u + off; as dtype dt.
local function input(u, off, dt) return (u + off):to(dt) end

local state = {ops = 0, checked = 0, failures = 0, pending = {}}
local function failf(fmt, ...)
  state.failures = state.failures + 1
  io.stderr:write(string.format("soak rank %d: MISMATCH " .. fmt .. "\n", RANK, ...))
end
local function check(what, got, want)
  state.checked = state.checked + 1
  if not got:equal(want) then
    local n, first = got:numel(), nil
    local gf, wf = got:to("float64"), want:to("float64")
    for i = 1, n do
      if gf[i] ~= wf[i] then first = i break end
    end
    failf("%s: element %s is %s, expected %s (%d elements)", what, tostring(first),
      first and tostring(gf[first]) or "?", first and tostring(wf[first]) or "?", n)
  end
end

-- Runs `post(async)`; blocking: checks at once; async: keeps (work, verify)
-- and waits for the oldest until at most state.keep (0-3, drawn per op) stay
-- in flight.
local function drain(keep)
  while #state.pending > keep do
    local p = table.remove(state.pending, 1)
    p.work:wait()
    p.verify()
  end
end
local function submit(async, post, verify)
  local w = post(async and {async_op = true} or nil)
  if async and w then
    state.pending[#state.pending + 1] = {work = w, verify = verify}
    drain(state.keep)
  else
    verify()
  end
end

-- Offsets: distinct per (rank, peer), signed, summing to a known value.
local function off(r, j, n) return (2 * r - (n - 1)) * n + j end
local function opts_of(G, o)
  o = o or {}
  if G.g then o.group = G.g end
  return o
end
local function merge(a, b)
  local o = {}
  for k, v in pairs(a or {}) do o[k] = v end
  for k, v in pairs(b or {}) do o[k] = v end
  return o
end

-- The range of u for dtype dt such that n values u + off stay exact.
local function urange(dt, n, maxoff, reduce)
  local d = DT[dt]
  local room = (reduce and d.lim // n or d.lim) - maxoff
  if room < 2 then return nil end
  room = math.min(room, 1000)
  if d.signed then return -room, room end
  return 0, room
end

local OPS = {}

-- all_reduce / reduce: sum, max, min (every dtype but bool), avg (floats),
-- product (small values, wide dtypes).
local REDOPS = {"sum", "max", "min", "avg", "product"}
local function reduction(kind, G, dt, count, s, async)
  local n = #G.ranks
  local op = pick(REDOPS)
  if dt == "bool" then op = pick({"max", "min"}) end
  if op == "avg" and not DT[dt].float then op = "sum" end
  if op == "product" and not ({float32 = 1, float64 = 1, int32 = 1, int64 = 1, int16 = 1})[dt] then op = "max" end
  local root = G.ranks[rand(n) + 1]
  if not G.member then return end
  local me = G.index[RANK]
  local maxoff, lo, hi = 0, nil, nil
  local offs = {}
  if op == "product" then
    for r = 0, n - 1 do offs[r] = r % 3 - 1 end
    lo, hi = -2, 3
  elseif dt == "bool" then
    lo, hi = 0, 2
    for r = 0, n - 1 do offs[r] = 0 end
  else
    for r = 0, n - 1 do
      offs[r] = DT[dt].signed and (2 * r - (n - 1)) or r
      maxoff = math.max(maxoff, math.abs(offs[r]))
    end
    lo, hi = urange(dt, n, maxoff, true)
    if not lo then return end
  end
  local u = base(count, lo, hi, s)
  local mine = dt == "bool" and base(count, 0, 2, s + 1 + me):to(dt) or input(u, offs[me], dt)
  local want
  if dt == "bool" then
    local acc = base(count, 0, 2, s + 1)
    for r = 1, n - 1 do
      local x = base(count, 0, 2, s + 1 + r)
      acc = op == "max" and acc:maximum(x) or acc:minimum(x)
    end
    want = acc
  elseif op == "sum" or op == "avg" then
    local so = 0
    for r = 0, n - 1 do so = so + offs[r] end
    want = op == "sum" and u * n + so or (u * n + so):to("float64") / n
  elseif op == "max" or op == "min" then
    local m = offs[0]
    for r = 1, n - 1 do m = op == "max" and math.max(m, offs[r]) or math.min(m, offs[r]) end
    want = u + m
  else
    want = u + offs[0]
    for r = 1, n - 1 do want = want * (u + offs[r]) end
  end
  local what = string.format("%s %s %s[%d] group %d", kind, op, dt, count, G.id)
  if kind == "all_reduce" then
    submit(async, function(o) return dist.all_reduce(mine, op, opts_of(G, o)) end,
      function() check(what, mine, want) end)
  else
    submit(async, function(o) return dist.reduce(mine, root, op, opts_of(G, o)) end,
      function() if RANK == root then check(what .. " root " .. root, mine, want) end end)
  end
end
OPS.all_reduce = function(...) return reduction("all_reduce", ...) end
OPS.reduce = function(...) return reduction("reduce", ...) end

-- Data movement: rank r's block for peer j is u + off(r, j) (bool: seeded bits).
local function block(u, dt, r, j, n, s)
  if dt == "bool" then return base(u:numel(), 0, 2, s + 7 * (r * n + j) + 3):to(dt) end
  return input(u, off(r, j, n), dt)
end
local function movement_u(G, dt, count, s)
  local n = #G.ranks
  if dt == "bool" then return T.zeros({count}, "int64") end
  local lo, hi = urange(dt, n, n * n + n, false)
  if not lo then return nil end
  if not DT[dt].signed then lo, hi = n * n + n, math.max(n * n + n + 1, DT[dt].lim - n * n - n) end
  return base(count, lo, hi, s)
end

OPS.broadcast = function(G, dt, count, s, async)
  local n = #G.ranks
  local src = G.ranks[rand(n) + 1]
  if not G.member then return end
  local u = movement_u(G, dt, count, s)
  if not u then return end
  local me, gs = G.index[RANK], G.index[src]
  local t = block(u, dt, me, 0, n, s)
  submit(async, function(o) return dist.broadcast(t, src, opts_of(G, o)) end,
    function() check(string.format("broadcast %s[%d] src %d group %d", dt, count, src, G.id), t, block(u, dt, gs, 0, n, s)) end)
end

OPS.all_gather = function(G, dt, count, s, async)
  if not G.member then return end
  local n = #G.ranks
  local u = movement_u(G, dt, count, s)
  if not u then return end
  local me, list = G.index[RANK], {}
  for j = 1, n do list[j] = T.zeros({count}, dt) end
  local t = block(u, dt, me, 0, n, s)
  submit(async, function(o) return dist.all_gather(list, t, opts_of(G, o)) end, function()
    for j = 1, n do check(string.format("all_gather %s[%d] block %d group %d", dt, count, j - 1, G.id), list[j], block(u, dt, j - 1, 0, n, s)) end
  end)
end

OPS.gather = function(G, dt, count, s, async)
  local n = #G.ranks
  local dst = G.ranks[rand(n) + 1]
  if not G.member then return end
  local u = movement_u(G, dt, count, s)
  if not u then return end
  local me, list = G.index[RANK], nil
  if RANK == dst then
    list = {}
    for j = 1, n do list[j] = T.zeros({count}, dt) end
  end
  local t = block(u, dt, me, 0, n, s)
  submit(async, function(o) return dist.gather(t, list, dst, opts_of(G, o)) end, function()
    if RANK ~= dst then return end
    for j = 1, n do check(string.format("gather %s[%d] dst %d block %d group %d", dt, count, dst, j - 1, G.id), list[j], block(u, dt, j - 1, 0, n, s)) end
  end)
end

OPS.scatter = function(G, dt, count, s, async)
  local n = #G.ranks
  local src = G.ranks[rand(n) + 1]
  if not G.member then return end
  local u = movement_u(G, dt, count, s)
  if not u then return end
  local me, gs, list = G.index[RANK], G.index[src], nil
  if RANK == src then
    list = {}
    for j = 1, n do list[j] = block(u, dt, gs, j - 1, n, s) end
  end
  local t = T.zeros({count}, dt)
  submit(async, function(o) return dist.scatter(t, list, src, opts_of(G, o)) end, function()
    check(string.format("scatter %s[%d] src %d group %d", dt, count, src, G.id), t, block(u, dt, gs, me, n, s))
  end)
end

OPS.all_to_all = function(G, dt, count, s, async)
  if not G.member then return end
  local n = #G.ranks
  local u = movement_u(G, dt, count, s)
  if not u then return end
  local me, ins, outs = G.index[RANK], {}, {}
  for j = 1, n do ins[j] = block(u, dt, me, j - 1, n, s); outs[j] = T.zeros({count}, dt) end
  submit(async, function(o) return dist.all_to_all(outs, ins, opts_of(G, o)) end, function()
    for j = 1, n do check(string.format("all_to_all %s[%d] from %d group %d", dt, count, j - 1, G.id), outs[j], block(u, dt, j - 1, me, n, s)) end
  end)
end

OPS.reduce_scatter = function(G, dt, count, s, async)
  if dt == "bool" then dt = "int32" end
  if not G.member then return end
  local n = #G.ranks
  local maxoff = n * n + n
  local lo, hi = urange(dt, n, DT[dt].signed and maxoff or 2 * maxoff, true)
  if not lo then return end
  local u = base(count, lo, hi, s)
  local me, list = G.index[RANK], {}
  -- unsigned: offsets shifted up so every input is >= 0
  local shift = DT[dt].signed and 0 or maxoff
  for j = 1, n do list[j] = (u + (off(me, j - 1, n) + shift)):to(dt) end
  local so = 0
  for r = 0, n - 1 do so = so + off(r, me, n) + shift end
  local out = T.zeros({count}, dt)
  submit(async, function(o) return dist.reduce_scatter(out, list, "sum", opts_of(G, o)) end, function()
    check(string.format("reduce_scatter sum %s[%d] group %d", dt, count, G.id), out, u * n + so)
  end)
end

OPS.barrier = function(G, dt, count, s, async)
  if not G.member then return end
  submit(async, function(o) return dist.barrier(opts_of(G, o)) end, function() state.checked = state.checked + 1 end)
end

-- send/recv: the group's ranks paired (a random rotation), each pair
-- exchanges blocks both ways with isend/irecv, or one way blocking.
OPS.p2p = function(G, dt, count, s, async)
  local n = #G.ranks
  local rot = rand(math.max(1, n - 1)) + 1
  local tag = rand(1000)
  if not G.member or n < 2 then return end
  local u = movement_u(G, dt, count, s)
  if not u then return end
  local me = G.index[RANK]
  local to, from = G.ranks[(me + rot) % n + 1], G.ranks[(me - rot) % n + 1]
  local out, got = block(u, dt, me, (me + rot) % n, n, s), T.zeros({count}, dt)
  local want = block(u, dt, (me - rot) % n, me, n, s)
  local what = string.format("p2p %s[%d] from %d tag %d group %d", dt, count, from, tag, G.id)
  local o = opts_of(G, {tag = tag})
  if async then
    local ws = dist.batch_isend_irecv{dist.P2POp(dist.isend, out, to, G.g, tag), dist.P2POp(dist.irecv, got, from, G.g, tag)}
    state.pending[#state.pending + 1] = {work = ws[1], verify = function() end}
    state.pending[#state.pending + 1] = {work = ws[2], verify = function() check(what, got, want) end}
    drain(state.keep)
  else
    -- blocking: even group ranks send first, odd ones receive first (an odd
    -- ring's last pair still meets: its sender has a receive posted ahead)
    local rw = dist.irecv(got, from, o)
    dist.send(out, to, o)
    rw:wait()
    check(what, got, want)
  end
end

-- Object collectives (always blocking): a table with a string, numbers and
-- a nested list, distinct per rank.
local function obj_of(r, s) return {rank = r, s = s, name = string.rep(string.char(65 + r % 26), r % 5 + 1), xs = {r * 3 - 7, -r, s % 1000}} end
local function same(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) ~= "table" then return a == b end
  for k, v in pairs(a) do if not same(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end
local function check_obj(what, got, want)
  state.checked = state.checked + 1
  if not same(got, want) then failf("%s: object differs", what) end
end
OPS.objects = function(G, dt, count, s, async)
  local n = #G.ranks
  local kind = rand(4)
  local root = G.ranks[rand(n) + 1]
  if not G.member then return end
  local o = opts_of(G)
  if kind == 0 then
    local got = dist.broadcast_object(RANK == root and obj_of(root, s) or nil, root, o)
    check_obj("broadcast_object src " .. root .. " group " .. G.id, got, obj_of(root, s))
  elseif kind == 1 then
    local list = {}
    dist.all_gather_object(list, obj_of(RANK, s), o)
    for j = 1, n do check_obj("all_gather_object block " .. (j - 1) .. " group " .. G.id, list[j], obj_of(G.ranks[j], s)) end
  elseif kind == 2 then
    local out, input = {}, nil
    if RANK == root then
      input = {}
      for j = 1, n do input[j] = obj_of(G.ranks[j], s + 1) end
    end
    dist.scatter_object_list(out, input, root, o)
    check_obj("scatter_object_list src " .. root .. " group " .. G.id, out[1], obj_of(RANK, s + 1))
  else
    local list = RANK == root and {} or nil
    dist.gather_object(obj_of(RANK, s), list, root, o)
    if list then
      for j = 1, n do check_obj("gather_object block " .. (j - 1) .. " group " .. G.id, list[j], obj_of(G.ranks[j], s)) end
    end
  end
end

local NAMES = {"all_reduce", "all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter",
  "reduce_scatter", "all_to_all", "barrier", "p2p", "objects"}
for i, G in ipairs(GROUPS) do G.id = i - 1 end

local clock = require("crun.core").clock
local t0 = clock()
local ok, err = pcall(function()
  for i = 1, opts.ops do
    local name = pick(NAMES)
    local G = GROUPS[rand(#GROUPS) + 1]
    local dt = pick(DTYPES)
    local count = count_for(dt)
    local async = rand(100) < opts.async_pct and name ~= "objects"
    local s = rand(1 << 30)
    state.keep = rand(4)
    OPS[name](G, dt, count, s, async)
    state.ops = state.ops + 1
    if opts.report_every > 0 and i % opts.report_every == 0 and RANK == 0 then
      io.stderr:write(string.format("soak: %d/%d ops\n", i, opts.ops))
    end
  end
  drain(0)
  dist.barrier()
end)
if not ok then
  state.failures = state.failures + 1
  io.stderr:write(string.format("soak rank %d: ERROR after %d ops: %s\n", RANK, state.ops, tostring(err)))
end
local secs = clock() - t0
-- every rank's counts, summed on rank 0 (when the job is still healthy)
local totals = ok and dist.all_gather_object({state.checked, state.failures}) or nil
local checked, failures = state.checked, state.failures
if totals then
  checked, failures = 0, 0
  for _, v in ipairs(totals) do checked = checked + v[1]; failures = failures + v[2] end
end
if RANK == 0 then
  print(string.format("soak: ops=%d ranks=%d transport=%s seed=%d checked=%d failures=%d time=%.1fs",
    state.ops, WORLD, os.getenv("CRUN_TRANSPORT") or "auto", opts.seed, checked, failures, secs))
end
dist.destroy_process_group()
os.exit(failures == 0 and 0 or 1, true) -- closing the state: leak checks see only leaks
